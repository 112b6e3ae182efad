"""The benchmarks are one harness that runs and whose published numbers match their files:

- ``python benchmarks --quick`` runs every case on the CPU and writes each case's JSON,
  markdown (and plot) in the one layout, with no errors, and reports each case's time and the
  run's (a time is the benchmark's to report, never a test's to assert: pytest --durations
  shows this one);
- ``--list`` names every case and the file that holds it;
- a run measures a fastrank with its native module: from a checkout that has none, the
  installed one (and it says so), or it stops with one line that says how to build it;
- the package has no import cycle, and nothing below the cases imports them;
- every result file's markdown, and every table in the README and docs/ (docs/benchmarks.md
  holds most), is what its JSON gives (``python -m benchmarks report --check``);
  results are named <device>-<date>-<case>[-<tag>].
"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def bench(monkeypatch_module):
    """The benchmarks package from the checkout (it is not installed), with fastrank
    imported first so that the installed package, with its native modules, is the one
    in use."""
    import fastrank  # noqa: F401
    monkeypatch_module.syspath_prepend(str(ROOT))
    import benchmarks.cases
    import benchmarks.gpu_tests
    import benchmarks.report
    return benchmarks


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # the folder run as a script from outside the repository: `benchmarks` comes from the
    # checkout, fastrank from wherever the test session imports it (installed or source)
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--device", "cpu", "--out", str(out)],
                          cwd=out, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    payloads = {}
    for path in out.glob("*.json"):
        data = json.loads(path.read_text())
        payloads[data["case"]] = (path, data)
    return out, proc, payloads


@pytest.mark.slow  # the quick run of every case (about 4 min on 2 cores): make test-slow
def test_quick_runs_every_case_without_errors(bench, quick_run):
    out, proc, payloads = quick_run
    # every case but those whose optional dependency is not installed (quality: gensim's data)
    runnable = {name for name, case in bench.cases.CASES.items() if not case.lacks()}
    assert set(payloads) == runnable, proc.stdout[-3000:]
    # the run's time is reported, each case's and the whole run's (not asserted: a time is a
    # benchmark's result, and a loaded machine or an optional extra makes it longer)
    for case in runnable:
        assert re.search(rf"^=== {case}: exit 0 after \d+\.\d s$", proc.stdout, re.M), proc.stdout[-3000:]
    assert re.search(rf"^{len(bench.cases.CASES)} case\(s\) in \d+\.\d s$", proc.stdout, re.M), proc.stdout[-3000:]
    for case, (path, data) in payloads.items():
        assert path.name == f"cpu-{data['created'][:10]}-{case}-quick.json"
        assert path.with_suffix(".md").read_text().startswith(f"# {case}: cpu")
        assert data["config"]["quick"] is True and data["device"] == "cpu" and data["complete"] is True
        for r in data["results"]:
            assert r["status"] in ("ok", "skipped"), (case, r["op"], r["impl"], r["reason"], r.get("traceback"))
            if r["status"] == "skipped":
                assert r["reason"], r
            else:
                t = r["time"]
                assert 0 < t["min_s"] <= t["p25_s"] <= t["median_s"] <= t["p75_s"] <= t["max_s"], r


@pytest.mark.slow  # the quick run of every case (about 4 min on 2 cores): make test-slow
def test_quick_sweep_covers_every_op_and_mode(bench, quick_run):
    _, _, payloads = quick_run
    data = payloads["sweep"][1]
    recs = data["results"]
    assert {r["op"] for r in recs} == set(bench.ops.OPS)
    assert {r["mode"] for r in recs} == {"forward", "backward", "forward+backward"}
    ceil = data["ceilings"]   # CPU: one-core rates scaled by the thread count
    assert ceil["exp_per_s"] == pytest.approx(ceil["exp_per_s_1core"] * ceil["threads"])
    assert ceil["cmp_select_add_per_s"] == pytest.approx(ceil["cmp_select_add_per_s_1core"] * ceil["threads"])
    sn = {(r["impl"], r["mode"], r["size"]["n"]): r for r in recs if r["op"] == "smooth_ndcg"}
    assert sn[("reference", "forward+backward", 16)]["status"] == "ok"
    big = sn[("reference", "forward+backward", 128)]   # the quick run's memory budget is 16 MB on purpose
    assert big["status"] == "skipped" and big["reason"].startswith("would not fit"), big
    compiled = sn[("compiled", "forward+backward", 16)]
    assert compiled["status"] == "skipped" and "--quick" in compiled["reason"]
    native = sn[("native", "forward+backward", 16)]
    if native["status"] == "ok":   # the native module may be missing from a source-tree run
        assert native["floor"]["floor_s"] > 0 and native["floor"]["measured_over_floor"] > 0
    else:
        assert native["reason"].startswith("native kernels unavailable"), native
    for r in recs:   # the CPU floor of a Kendall pair: one compare+select+add per pair and pass
        if r["op"] == "kendall" and r["impl"] == "native" and r["status"] == "ok" and r["mode"] == "forward+backward":
            n = r["size"]["n"]
            assert r["floor"]["counts"]["cmp_select_add"] == n * n * (n - 1)
    md = payloads["sweep"][0].with_suffix(".md").read_text()
    assert "### smooth_ndcg: forward+backward" in md and "| reference / native |" in md
    assert payloads["sweep"][0].with_suffix(".png").stat().st_size > 1000


@pytest.mark.slow  # the quick run of every case (about 4 min on 2 cores): make test-slow
def test_quick_percall_runs_one_thread_against_the_trivial_op(quick_run):
    _, _, payloads = quick_run
    path, data = payloads["percall"]
    assert data["config"]["threads"]["torch"] == 1   # the per-call case measures one core
    if data["machine"]["fastrank_backends"].get("cpu"):
        assert data["config"]["threads"]["fastrank_openmp"] == 1
    recs = data["results"]
    assert {"smooth_ndcg", "kendall", "kendall_sw", "fast_rerank"} <= {r["op"] for r in recs}
    assert {r["impl"] for r in recs} == {"native", "reference", "compiled", "trivial"}   # no CUDA graph on CPU
    by = {(r["op"], r["size_label"], r["impl"]): r for r in recs}
    trivial = by[("smooth_ndcg", "4 x 4", "trivial")]
    assert trivial["status"] == "ok" and trivial["time"]["calls_per_sample"] >= 1
    native = by[("smooth_ndcg", "4 x 4", "native")]
    md = path.with_suffix(".md").read_text()
    if native["status"] == "ok":
        ratio = native["time"]["median_s"] / trivial["time"]["median_s"]
        row = next(line for line in md.splitlines() if line.startswith("| 4 x 4 |"))
        assert f"{ratio:.3g}x" in row, row
    assert "| native / trivial | reference / native |" in md


@pytest.mark.slow  # the quick run of every case (about 4 min on 2 cores): make test-slow
def test_quick_slate_checks_values_and_measures_both_sides(quick_run):
    _, _, payloads = quick_run
    recs = payloads["slate"][1]["results"]
    ours = [r for r in recs if r["impl"] == "fastrank"]
    assert len(ours) == 2
    for r in ours:
        assert r["max_abs_diff"] is not None and r["max_abs_diff"] < 1e-5
        assert 0.1 < r["size"]["padding"] < 0.5
    assert all(r["status"] == "ok" for r in recs if r["impl"] in ("fastrank", "allrank"))


@pytest.mark.slow  # the quick run of every case (about 4 min on 2 cores): make test-slow
def test_quick_metrics_and_the_peer_case(quick_run):
    _, _, payloads = quick_run
    metrics = payloads["metrics"][1]["results"]
    assert {r["op"] for r in metrics} >= {"recall_at_k", "ndcg", "kendall_tau", "evaluate with relevance"}
    assert all(r["status"] == "ok" and r["time"]["cpu_median_s"] > 0 for r in metrics)
    assert any(r["op"] == "kendall_tau" and r["impl"] == "scipy" for r in metrics)
    for r in payloads["pml_smooth_ap"][1]["results"]:   # skipped until the op and the package are there
        assert r["status"] == "ok" or r["reason"], r


@pytest.mark.slow  # the quick run of every case (about 4 min on 2 cores): make test-slow
def test_quick_cpu_kernels_times_the_kernels_beside_the_public_call(quick_run):
    _, _, payloads = quick_run
    recs = payloads["cpu_kernels"][1]["results"]
    by = {(r["op"], r["mode"], r["impl"]): r for r in recs}
    assert set(by) == {(op, p, impl) for op, p in (("smooth_ndcg", "forward"), ("kendall_sw", "forward"),
                                                   ("kendall_sw", "backward"))
                       for impl in ("kernel", "public call")}
    public = by[("kendall_sw", "backward", "public call")]
    kernel = by[("kendall_sw", "backward", "kernel")]
    assert public["status"] == "ok"
    assert kernel["status"] == "ok" or "compiler" in kernel["reason"] or "building" in kernel["reason"], kernel


def test_list_names_every_case_and_its_file(bench):
    out = subprocess.run([sys.executable, str(BENCH), "--list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name, case in bench.cases.CASES.items():
        assert case.source in out.stdout and case.about in out.stdout
        assert (BENCH.parent / case.source).is_file()
        assert case.source == (f"benchmarks/cases/{name}.py" if name != "quality" else "quality/study.py")


# ---------------------------------------------------------------- the subject

def _checkout_without_native(where: Path) -> Path:
    """A copy of the checkout's benchmarks/ (with the quality study beside it, one of its cases) and
    its package beside them, with no native module: a source tree that shadows the build (the src/
    layout keeps the real checkout from doing so)."""
    ignore = shutil.ignore_patterns("__pycache__", "results", "*.so", "*.pyd")
    shutil.copytree(BENCH, where / "benchmarks", ignore=ignore)
    shutil.copytree(ROOT / "quality", where / "quality", ignore=ignore)
    shutil.copytree(ROOT / "src" / "fastrank", where / "fastrank", ignore=ignore)
    return where


def _run_module(checkout: Path, site: Path, *args) -> subprocess.CompletedProcess:
    """`python -m benchmarks ARGS` in ``checkout``, with ``site`` where the installed
    fastrank would be (ahead of site-packages)."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_checkout_without_native_module_measures_the_installed_fastrank(tmp_path):
    import fastrank
    if not fastrank.backends()["cpu"]:
        pytest.skip("this session's fastrank has no native CPU module to stand in for an installed build")
    checkout = _checkout_without_native(tmp_path / "checkout")
    site = tmp_path / "site"
    site.mkdir()
    (site / "fastrank").symlink_to(Path(fastrank.__file__).resolve().parent, target_is_directory=True)
    out = tmp_path / "out"
    proc = _run_module(checkout, site, "percall", "--quick", "--device", "cpu", "--ops", "smooth_ndcg",
                       "--max-n", "4", "--no-plots", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    installed = Path(fastrank.__file__).resolve().parent
    assert f"measuring the installed fastrank at {installed} (_C_cpu)" in proc.stdout, proc.stdout[:2000]
    assert f"the one at {checkout / 'fastrank'} has no native module" in proc.stdout
    [result] = out.glob("*.json")
    data = json.loads(result.read_text())
    assert Path(data["machine"]["fastrank_path"]).resolve() == installed
    native = [r for r in data["results"] if r["impl"] == "native"]
    assert native and all(r["status"] == "ok" for r in native), native


def test_without_any_native_module_the_run_stops_with_one_line_saying_how_to_build(tmp_path):
    checkout = _checkout_without_native(tmp_path / "checkout")
    site = _checkout_without_native(tmp_path / "site")   # the "installed" fastrank has none either
    out = tmp_path / "out"
    proc = _run_module(checkout, site, "percall", "--quick", "--device", "cpu", "--out", str(out))
    assert proc.returncode != 0
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"fastrank at {checkout / 'fastrank'} has no native module _C_cpu" in lines[0]
    assert f"the installed one at {site / 'fastrank'} has none either" in lines[0]
    assert "pip install ." in lines[0] and "python setup.py build_ext --inplace" in lines[0]
    assert not out.exists()
    # listing the cases measures nothing: it still works
    listed = _run_module(checkout, site, "--list")
    assert listed.returncode == 0 and "benchmarks/cases/percall.py" in listed.stdout, listed.stderr


# ---------------------------------------------------------------- imports

def _imports(path: Path, package: str) -> set:
    """The benchmarks modules a file imports (absolute or relative), as dotted names."""
    mod = ".".join(path.relative_to(BENCH.parent).with_suffix("").parts)
    if path.name == "__init__.py":
        mod = mod.rsplit(".", 1)[0]
        pkg = mod
    else:
        pkg = mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != package:
                continue
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names}   # `from . import report` imports a module
    return out


def import_graph() -> dict:
    files = [p for p in BENCH.rglob("*.py") if "results" not in p.parts]
    mods = {}
    for p in files:
        name = ".".join(p.relative_to(BENCH.parent).with_suffix("").parts)
        mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = p
    return {m: sorted(i for i in _imports(p, "benchmarks") if i in mods and i != m) for m, p in mods.items()}


def find_cycle(graph: dict):
    """A list of modules forming an import cycle, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in graph.get(m, ()):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        state[m] = "done"
        stack.pop()
        return None

    for m in graph:
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


def test_benchmarks_package_has_no_import_cycle():
    graph = import_graph()
    assert "benchmarks.harness" in graph and "benchmarks.cases.sweep" in graph
    assert "benchmarks.harness" in graph["benchmarks.cases.sweep"]
    assert find_cycle(graph) is None, find_cycle(graph)


def test_cases_import_the_harness_never_the_other_way_round():
    graph = import_graph()
    top = {"benchmarks.cli", "benchmarks.__main__", "benchmarks.cases"}
    for mod, deps in graph.items():
        if mod in top or mod.startswith("benchmarks.cases."):
            continue
        assert not [d for d in deps if d in top or d.startswith("benchmarks.cases")], (mod, deps)


# ---------------------------------------------------------------- published numbers

def test_results_are_in_one_layout_and_their_markdown_is_current(bench):
    names = "|".join([*bench.cases.CASES, bench.gpu_tests.CASE])   # and a GPU run's test counts (gpu_tests.py)
    pattern = re.compile(rf"^(cpu|cuda)-\d{{4}}-\d{{2}}-\d{{2}}-({names})(-[\w.+-]+)?\.(json|md|png)$")
    files = [p for p in (BENCH / "results").iterdir() if p.is_file()]
    assert files
    for p in files:
        assert pattern.match(p.name), p.name
        if p.suffix == ".json":
            data = json.loads(p.read_text())
            assert data["schema"] == 2 and p.name.split("-")[4].split(".")[0] == data["case"], p.name
            assert p.with_suffix(".md").read_text() == bench.report.result_markdown(p), \
                f"{p.with_suffix('.md').name} is stale: python -m benchmarks report {p}"
    # Nsight Compute profiles (gpu_check.sh step 6), one CSV per op, size, direction and dtype
    profiles = re.compile(r"^cuda-\d{4}-\d{2}-\d{2}-ncu-\w+-\d+-(i2t|t2i|both)-\w+\.csv$")
    for p in (BENCH / "results" / "profiles").iterdir():
        assert profiles.match(p.name), p.name


def doc_files_with_tables(bench):
    """README.md and every page of docs/ that holds a generated benchmarks table."""
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    return [p for p in files if bench.report.MARKER.search(p.read_text())]


def test_doc_tables_are_generated_from_their_result_files(bench):
    files = doc_files_with_tables(bench)
    names = {p.relative_to(ROOT).as_posix() for p in files}
    assert {"README.md", "docs/benchmarks.md", "docs/porting.md"} <= names, names
    assert len(bench.report.MARKER.findall((ROOT / "docs" / "benchmarks.md").read_text())) >= 5
    for doc in files:
        text = doc.read_text()
        for block in bench.report.MARKER.findall(text):   # every table names a result file that exists
            spec = bench.report.parse_spec(block[1])   # (the CUDA status: the folder of the GPU runs' results)
            exists = Path.is_dir if spec.get("layout") == "cuda-status" else Path.is_file
            assert exists(doc.parent / spec["file"]), f"{doc.name}: {spec['file']}"
            assert f"From [`{spec['file']}`]" in block[2], f"{doc.name}: {spec['file']}"
        assert bench.report.render_markdown(text, doc.parent) == text, \
            f"{doc.relative_to(ROOT)}: tables differ from their JSON: python -m benchmarks report {doc.relative_to(ROOT)}"
    # ... and the check can fail: a number changed by hand is put back
    doc = ROOT / "docs" / "benchmarks.md"
    text = doc.read_text()
    body = next(m.group("body") for m in bench.report.MARKER.finditer(text) if re.search(r"\d ms", m.group("body")))
    edited = text.replace(body, re.sub(r"\d+(\.\d+)? ms", "1.23 ms", body, count=1), 1)
    assert edited != text and bench.report.render_markdown(edited, doc.parent) == text


def test_docs_tables_are_generated_from_their_result_files(bench):
    """A benchmarks table in docs/*.md (paths relative to the page) is what its JSON gives."""
    pages = [p for p in sorted((ROOT / "docs").glob("*.md")) if bench.report.MARKER.search(p.read_text())]
    for page in pages:
        text = page.read_text()
        for block in bench.report.MARKER.findall(text):
            spec = bench.report.parse_spec(block[1])
            exists = Path.is_dir if spec.get("layout") == "cuda-status" else Path.is_file
            assert exists(page.parent / spec["file"]), (page.name, spec["file"])
        assert bench.report.render_markdown(text, page.parent) == text, \
            f"{page.name}: tables differ from their JSON: python -m benchmarks report {page.relative_to(ROOT)}"


def test_no_issue_numbers_in_the_benchmarks_and_their_docs():
    files = [p for p in BENCH.rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".sh", ".json", ".cpp")]
    files += [ROOT / "README.md", Path(__file__)] + sorted((ROOT / "docs").rglob("*.md"))
    hits = [f"{p}: {m.group(0)}" for p in files for m in re.finditer(r"issue[- ]\d+", p.read_text(), re.I)]
    assert not hits, hits


def test_breadth_order_covers_every_op_before_large_sizes(bench):
    from benchmarks.harness import case_order
    from benchmarks.ops import Op

    def op(name, ns):
        return Op(name=name, about="", impls={}, inputs=None, sizes={"cpu": [{"n": n, "m": n} for n in ns]},
                  work=None, est_bytes=None, modes=("forward+backward", "forward"))
    prepared = [(op("a", (1, 2, 3)), {}), (op("b", (10, 20)), {})]
    modes = ["forward", "forward+backward"]
    sizes = lambda o: o.sizes["cpu"]  # noqa: E731
    breadth = [(s.name, m, z["n"]) for s, _, m, z in case_order(prepared, modes, sizes, "breadth")]
    assert breadth == [("a", "forward+backward", 1), ("b", "forward+backward", 10), ("a", "forward", 1),
                       ("b", "forward", 10), ("a", "forward+backward", 2), ("b", "forward+backward", 20),
                       ("a", "forward", 2), ("b", "forward", 20), ("a", "forward+backward", 3),
                       ("a", "forward", 3)]
    depth = [(s.name, m, z["n"]) for s, _, m, z in case_order(prepared, modes, sizes, "depth")]
    assert depth[:3] == [("a", "forward+backward", 1), ("a", "forward+backward", 2), ("a", "forward+backward", 3)]
    assert sorted(depth) == sorted(breadth)


def test_every_op_of_the_table_is_benchmarked(bench):
    """benchmarks/ops.py holds what only a benchmark needs (sizes, floors, baselines); its ops
    follow the table (src/fastrank/ops/registry.py): every native op of the table is measured."""
    import benchmarks.ops as bops
    from fastrank.ops.registry import LOSSES
    measured = {op.requires or op.name for op in bops.OPS.values()}
    native = {row.functional.__name__ for row in LOSSES.values() if row.contract is not None}
    assert native <= measured, f"native ops without a benchmark entry: {sorted(native - measured)}"


def test_sweep_saves_after_every_record(bench, tmp_path):
    """A sweep cut from outside (gpu_check.sh's timeout) keeps every cell it measured: the
    case saves an incomplete result after each record, then the complete one."""
    import torch
    from benchmarks import cli
    args = cli.parser(list(bench.cases.CASES)).parse_args(
        ["sweep", "--quick", "--device", "cpu", "--no-floors", "--ops", "kendall", "--modes", "forward",
         "--impls", "reference", "--out", str(tmp_path)])
    saved = []
    final = bench.cases.CASES["sweep"].run(args, torch.device("cpu"),
                                           lambda p: saved.append((len(p["results"]), p["complete"])))
    assert saved == [(k, False) for k in range(1, len(final["results"]) + 1)]
    assert final["complete"] is True


def _sweep(bench, argv, tmp_path):
    import torch
    from benchmarks import cli
    args = cli.parser(list(bench.cases.CASES)).parse_args(["sweep", "--quick", "--device", "cpu", "--no-floors",
                                                           "--out", str(tmp_path), *argv])
    return bench.cases.CASES["sweep"].run(args, torch.device("cpu"), lambda p: None)


def test_sweep_runs_each_direction_on_top_k_relevance_side_by_side(bench, tmp_path):
    """--directions i2t,t2i --topk K: a record per direction (its size says which, and K), the
    calls given that direction and a TopKRelevance of K entries a row; the table puts a size's
    t2i row under its i2t row, with t2i / i2t (the ratio of the native medians)."""
    import torch

    import fastrank
    from benchmarks import tables
    payload = _sweep(bench, ["--ops", "kendall", "--modes", "forward+backward", "--impls", "native,reference",
                             "--directions", "i2t,t2i", "--topk", "2", "--max-n", "16"], tmp_path)
    assert payload["config"]["directions"] == ["i2t", "t2i"] and payload["config"]["topk"] == 2
    recs = payload["results"]
    got = [(r["impl"], r["size"]["direction"], r["size"]["topk"], r["size_label"]) for r in recs]
    assert got == [("native", "i2t", 2, "16 x 16, i2t, top-2"), ("reference", "i2t", 2, "16 x 16, i2t, top-2"),
                   ("native", "t2i", 2, "16 x 16, t2i, top-2"), ("reference", "t2i", 2, "16 x 16, t2i, top-2")]
    for r in recs:
        assert r["status"] == "ok" or r["reason"].startswith("native kernels unavailable"), r
        assert r["floor"] is None   # the floor models count the dense work of both directions
    x = bench.ops.variant(bench.ops.OPS["kendall"], ["i2t", "t2i"], 2).inputs(
        recs[2]["size"], torch.device("cpu"), torch.float32, True)
    assert x["direction"] == "t2i" and isinstance(x["relevance"], fastrank.TopKRelevance) and x["relevance"].k == 2
    lines = [[c.strip() for c in line[2:-2].split(" | ")] for line in tables.markdown(payload).splitlines()
             if line.startswith("| ")]
    rows = [cells for cells in lines if cells[0].startswith("16 x 16")]
    assert [row[0] for row in rows] == ["16 x 16, i2t, top-2", "16 x 16, t2i, top-2"]
    ratio = next(cells for cells in lines if cells[0] == "size").index("native t2i / i2t")
    native = {r["size"]["direction"]: r for r in recs if r["impl"] == "native"}
    if all(r["status"] == "ok" for r in native.values()):
        t2i, i2t = (native[d]["time"]["median_s"] for d in ("t2i", "i2t"))
        assert rows[1][ratio] == f"{t2i / i2t:.3g}x" and rows[0][ratio] == ""


@pytest.mark.parametrize("argv,refused", [
    (["--ops", "kendall,fast_rerank", "--directions", "i2t"], "--directions: fast_rerank:"),
    (["--ops", "kendall_sw", "--topk", "2"], "--topk: kendall_sw:"),
    (["--ops", "fast_rerank_topk", "--sizes", "64"], "--sizes: fast_rerank_topk:"),
])
def test_sweep_refuses_an_option_an_op_does_not_take(bench, tmp_path, argv, refused):
    from benchmarks.cli_args import A
    with pytest.raises(A.UsageError, match=refused):
        _sweep(bench, argv, tmp_path)


def test_sweep_sizes_are_n_by_n_and_both_is_the_default_direction(bench, tmp_path):
    """--sizes 24: N = M = 24 in place of the op's sizes; without --directions, one call of both
    directions as before (no direction in the size, the floor counted)."""
    payload = _sweep(bench, ["--ops", "smooth_ndcg", "--modes", "forward", "--impls", "reference",
                             "--sizes", "24"], tmp_path)
    assert payload["config"]["directions"] == ["both"] and payload["config"]["topk"] is None
    assert [(r["size"], r["size_label"]) for r in payload["results"]] == [({"n": 24, "m": 24}, "24 x 24")]


def test_percall_plan_keeps_the_sizes_between_min_n_and_max_n(bench):
    from benchmarks.cases import percall
    ops = [bench.ops.OPS["kendall"], bench.ops.OPS["smooth_ndcg"]]
    cells = percall.plan(ops, ["native", "compiled"], False, max_n=128, min_n=128)
    assert [(op.name, impl, size["n"]) for op, impl, size in cells] == [
        ("kendall", "native", 128), ("smooth_ndcg", "native", 128),
        ("kendall", "compiled", 128), ("smooth_ndcg", "compiled", 128)]
    assert {size["n"] for _, _, size in percall.plan(ops, ["native"], False, min_n=8)} == {8, 128, 512}


def test_percall_at_the_sweep_sizes_takes_the_sweep_cases_sizes_for_the_device(bench):
    """--sweep-sizes: the before / after of the sweep's sizes, a step at a time."""
    from benchmarks.cases import percall
    op = bench.ops.OPS["smooth_ndcg"]
    for device in ("cpu", "cuda"):
        got = [size for _, _, size in percall.plan([op], ["after"], False, sweep_sizes=device)]
        assert got == op.sizes[device] and got != list(op.percall_sizes)
    got = [size["n"] for _, _, size in percall.plan([op], ["after"], False, min_n=512, max_n=1024, sweep_sizes="cpu")]
    assert got == [512, 1024]


@pytest.mark.slow  # a benchmark run: the per-call case, timed in child processes of two checkouts
def test_percall_times_another_checkout_beside_this_one(bench, tmp_path):
    """--before DIR: the same step on the same inputs in child processes, with fastrank imported
    from DIR (here a copy of the fastrank in use, so both run the same code) and from this
    checkout, recorded as the `before` and `after` columns with DIR's path in the configuration."""
    import shutil

    import fastrank
    import torch
    from benchmarks import cli
    other = tmp_path / "other"
    shutil.copytree(Path(fastrank.__file__).parent, other / "src" / "fastrank",
                    ignore=shutil.ignore_patterns("__pycache__"))
    args = cli.parser(list(bench.cases.CASES)).parse_args(
        ["percall", "--quick", "--device", "cpu", "--ops", "kendall", "--max-n", "4", "--impls", "native",
         "--before", str(other), "--out", str(tmp_path)])
    final = bench.cases.CASES["percall"].run(args, torch.device("cpu"), lambda p: None)
    cells = {r["impl"]: r for r in final["results"]}
    assert set(cells) == {"native", "before", "after"}
    for r in cells.values():
        assert r["status"] == "ok", (r["reason"], r.get("traceback"))
        assert r["time"]["median_s"] > 0
    assert final["config"]["before"]["path"] == str(other)
    from benchmarks.cli_args import A
    with pytest.raises(A.UsageError, match="no fastrank package"):   # one line, exit 2 (cli.py)
        bench.cases.percall.before_path(tmp_path / "nothing")


def test_a_case_whose_optional_dependency_is_missing_is_skipped_or_refused(bench, monkeypatch, tmp_path, capsys):
    """A case lacking an optional dependency (quality without gensim's data): the run of every
    case skips it and goes on (exit 0, no child started for it); run alone, it is refused in
    one line with exit 2 and writes nothing."""
    from benchmarks import cli
    case = bench.cases.CASES["quality"]
    monkeypatch.setattr(case, "missing", lambda: "gensim's test data: pip install 'fastrank[quality]'")
    args = cli.parser(list(bench.cases.CASES)).parse_args(["--quick", "--device", "cpu", "--out", str(tmp_path)])
    import torch
    rc = cli.run_each(["quality"], ["quality", "--quick"], args, torch.device("cpu"), ["false"], bench.cases.CASES)
    assert rc == 0 and "=== quality: skipped, it needs gensim's test data" in capsys.readouterr().out
    assert cli.main(["quality", "--quick", "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "quality needs gensim's test data" in err[0], err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(case, "missing", lambda: None)
    assert case.lacks() is None


@pytest.mark.slow  # the quick run of every case: the cpu_kernels case compiles the driver
def test_the_kernel_driver_builds_against_this_checkout(bench, quick_run):
    """benchmarks/cpu_driver.cpp calls the CPU kernels through their parameter structs: a
    struct renamed or moved must fail this test, not turn the cpu_kernels case into skips
    (the quick run built the driver against this checkout and timed every kernel through it)."""
    import shutil
    if not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler")
    _, _, payloads = quick_run
    driven = [r for r in payloads["cpu_kernels"][1]["results"] if r["impl"] == "kernel"]
    assert {r["op"] for r in driven} == set(bench.cases.cpu_kernels.OPS), driven
    assert all(r["status"] == "ok" and r["time"]["min_s"] > 0 for r in driven), driven
