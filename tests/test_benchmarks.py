"""The benchmark harness runs end to end: ``python -m benchmarks --quick`` in a subprocess
writes its JSON, markdown and PNG files with the documented fields, measures the native
smooth-NDCG kernel and the reference, and records a reference that would not fit as
skipped with the reason (the quick run's memory budget is small on purpose)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RECORD_KEYS = {"op", "impl", "mode", "size", "size_label", "x", "dtype", "device", "status",
               "reason", "time", "memory", "baseline", "vs_baseline"}
OPS = {"smooth_ndcg", "kendall", "kendall_sw", "fast_rerank", "fast_rerank_topk",
       "triplet_hardest", "triplet_soft", "triplet_all", "ladder", "topk"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # Run the folder as a script from outside the repository: `benchmarks` comes from the
    # checkout, fastrank from wherever the test session imports it (installed or source).
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks"), "--quick", "--device", "cpu",
                           "--out", str(out), "--name", "quick"],
                          cwd=out, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc


def test_quick_run_writes_json_markdown_and_plots(quick_run):
    out, proc = quick_run
    assert (out / "quick.json").is_file()
    md = (out / "quick.md").read_text()
    assert "### smooth_ndcg: forward+backward" in md and "| size | native | reference |" in md
    pngs = sorted(p.name for p in out.glob("quick-*.png"))
    assert "quick-smooth_ndcg.png" in pngs and "quick-losses.png" in pngs, pngs
    assert all((out / p).stat().st_size > 1000 for p in pngs)
    assert "wrote:" in proc.stdout


def test_quick_run_json_fields(quick_run):
    out, _ = quick_run
    data = json.loads((out / "quick.json").read_text())
    for key in ("schema", "created", "device", "machine", "config", "ceilings", "memory_method",
                "results", "elapsed_s"):
        assert key in data, key
    assert data["device"] == "cpu" and data["config"]["quick"] is True
    assert {"cpu_model", "cpu_count", "torch", "fastrank_backends"} <= set(data["machine"])
    assert data["ceilings"]["copy_bytes_per_s"] > 0 and data["ceilings"]["exp_per_s"] > 0
    ceil = data["ceilings"]   # CPU: one-core rates (issue 12), scaled by the thread count
    assert ceil["exp_per_s_1core"] > 0 and ceil["cmp_select_add_per_s_1core"] > 0
    assert ceil["exp_per_s"] == pytest.approx(ceil["exp_per_s_1core"] * ceil["threads"])
    assert ceil["cmp_select_add_per_s"] == pytest.approx(ceil["cmp_select_add_per_s_1core"] * ceil["threads"])
    recs = data["results"]
    assert {r["op"] for r in recs} == OPS
    assert {r["mode"] for r in recs} == {"forward", "backward", "forward+backward"}
    for r in recs:
        assert RECORD_KEYS <= set(r), set(RECORD_KEYS) - set(r)
        assert r["status"] in ("ok", "skipped"), (r["op"], r["impl"], r["reason"], r.get("traceback"))
        if r["status"] == "ok":
            t = r["time"]
            assert 0 < t["min_s"] <= t["p25_s"] <= t["median_s"] <= t["p75_s"] <= t["max_s"]
            assert t["repeats"] >= 1 and r["memory"]["peak_bytes"] is not None
        else:
            assert r["reason"], r


def test_quick_run_measures_smooth_ndcg_and_skips_a_reference_that_does_not_fit(quick_run):
    out, _ = quick_run
    recs = json.loads((out / "quick.json").read_text())["results"]
    sn = {(r["impl"], r["mode"], r["size"]["n"]): r for r in recs if r["op"] == "smooth_ndcg"}
    ref_small = sn[("reference", "forward+backward", 16)]
    assert ref_small["status"] == "ok" and ref_small["time"]["median_s"] > 0
    big = sn[("reference", "forward+backward", 128)]
    assert big["status"] == "skipped" and big["reason"].startswith("would not fit"), big
    assert big["memory_estimate_bytes"] > 16 << 20
    compiled = sn[("compiled", "forward+backward", 16)]
    assert compiled["status"] == "skipped" and "--quick" in compiled["reason"]
    native = sn[("native", "forward+backward", 16)]
    if native["status"] == "ok":   # the native module may be missing from a source-tree run
        assert native["vs_baseline"] > 0
        assert native["floor"]["floor_s"] > 0 and native["floor"]["measured_over_floor"] > 0
    else:
        assert native["reason"].startswith("native kernels unavailable"), native
    kendall = [r for r in recs if r["op"] == "kendall" and r["impl"] == "native" and r["status"] == "ok"
               and r["mode"] == "forward+backward"]
    for r in kendall:   # the CPU floor of a Kendall pair: one compare+select+add per pair and pass
        n = r["size"]["n"]
        assert r["floor"]["counts"]["cmp_select_add"] == n * n * (n - 1)
        assert r["floor"]["work_unit"] in ("cmp_select_add", "fp32")


# ---------------------------------------------------------------- the per-call case (issue 11)

PERCALL_OPS = {"smooth_ndcg", "kendall", "kendall_sw", "fast_rerank"}


@pytest.fixture(scope="module")
def percall_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("percall")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks"), "--case", "percall", "--quick",
                           "--device", "cpu", "--out", str(out), "--name", "pc"],
                          cwd=out, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc


def test_percall_quick_writes_json_and_markdown(percall_run):
    out, proc = percall_run
    md = (out / "pc.md").read_text()
    assert "| op | size | native | reference | compiled | trivial |" in md
    assert "native / trivial" in md and "reference / native" in md
    assert "CPU threads: torch 1" in md and "single-threaded" in md
    assert "wrote:" in proc.stdout


def test_percall_quick_records(percall_run):
    out, _ = percall_run
    data = json.loads((out / "pc.json").read_text())
    assert data["case"] == "percall" and data["device"] == "cpu" and data["config"]["quick"] is True
    assert data["config"]["threads"]["torch"] == 1
    if data["machine"]["fastrank_backends"].get("cpu"):
        assert data["config"]["threads"]["fastrank_openmp"] == 1
    recs = data["results"]
    assert {r["op"] for r in recs} == PERCALL_OPS
    assert {r["impl"] for r in recs} == {"native", "reference", "compiled", "trivial"}  # no CUDA graph on CPU
    by = {(r["op"], r["size_label"], r["impl"]): r for r in recs}
    assert ("smooth_ndcg", "4 x 4", "trivial") in by and ("fast_rerank", "100 x 500", "native") in by
    for r in recs:
        assert r["mode"] == "forward+backward" and r["dtype"] == "float32"
        if r["impl"] == "compiled":
            assert r["status"] == "skipped" and "--quick" in r["reason"], r
            continue
        if r["impl"] == "native" and r["status"] != "ok":   # a source tree without the built module
            assert r["reason"].startswith("native kernels unavailable"), r
            continue
        assert r["status"] == "ok", (r["op"], r["impl"], r["reason"], r.get("traceback"))
        t = r["time"]
        assert 0 < t["min_s"] <= t["p25_s"] <= t["median_s"] <= t["p75_s"] <= t["max_s"]
        assert t["repeats"] >= 3 and t["calls_per_sample"] >= 1 and r["first_call_s"] > 0
    for r in recs:
        if r["impl"] == "native" and r["status"] == "ok":
            ratios = r["ratios"]
            assert ratios["native_over_trivial"] > 0 and ratios["reference_over_native"] > 0
            assert ratios["compiled_over_native"] is None          # compiled not run in --quick
            trivial = by[(r["op"], r["size_label"], "trivial")]["time"]["median_s"]
            assert ratios["native_over_trivial"] == pytest.approx(r["time"]["median_s"] / trivial)


def test_breadth_order_covers_every_op_before_large_sizes(monkeypatch):
    # benchmarks/ is a folder of the checkout, not an installed package: import it from the
    # checkout (CI runs the installed fastrank with no PYTHONPATH), fastrank first so that the
    # installed package, with its native modules, stays the one in use.
    import fastrank  # noqa: F401
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.harness import OpBench, case_order

    def spec(name, ns):
        return OpBench(name=name, impls={}, sizes={"cpu": [{"n": n, "m": n} for n in ns]},
                       make_inputs=None, work=None, est_bytes=None, modes=("forward+backward", "forward"))
    prepared = [(spec("a", (1, 2, 3)), {}), (spec("b", (10, 20)), {})]
    modes = ["forward", "forward+backward"]
    breadth = [(s.name, m, z["n"]) for s, _, m, z in case_order(prepared, modes, "cpu", "breadth")]
    assert breadth == [("a", "forward+backward", 1), ("b", "forward+backward", 10), ("a", "forward", 1),
                       ("b", "forward", 10), ("a", "forward+backward", 2), ("b", "forward+backward", 20),
                       ("a", "forward", 2), ("b", "forward", 20), ("a", "forward+backward", 3),
                       ("a", "forward", 3)]
    depth = [(s.name, m, z["n"]) for s, _, m, z in case_order(prepared, modes, "cpu", "depth")]
    assert depth[:3] == [("a", "forward+backward", 1), ("a", "forward+backward", 2), ("a", "forward+backward", 3)]
    assert sorted(depth) == sorted(breadth)
