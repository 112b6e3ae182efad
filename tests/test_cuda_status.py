"""The docs' CUDA status is drawn from the evidence and git (benchmarks/cuda_status.py), and
a GPU run's test counts are a result file (benchmarks/gpu_tests.py):

- per CUDA source, the newest GPU run whose commit holds it; "ran as it is now" only while
  the file and every header it includes are that commit's; "emulated only since C" (C the
  first commit that changed one) after; "never ran on a GPU" for a file no run holds;
- the table is the same under a commit that changes no source (the regenerated docs'), and
  ``report --check`` fails once a commit changes a source;
- a history that lacks a run's commit (a shallow clone) stops with a message, never a table;
- the README and every loss page take their CUDA status from the generated blocks, and no
  page says code ran on a GPU outside them.

The git cases run on a small repository made in a temporary folder.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def bench():
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(ROOT))
    import benchmarks.cuda_status
    import benchmarks.gpu_tests
    import benchmarks.report
    import benchmarks.results
    yield benchmarks
    mp.undo()


# ---------------------------------------------------------------- a repository of CUDA sources

def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, files: dict, message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "--short=7", "HEAD")


def gpu_result(folder: Path, name: str, commit_: str, case: str = "floors", **extra) -> None:
    payload = {"schema": 2, "case": case, "created": "2026-11-26T12:00:00+00:00", "device": "cuda",
               "machine": {"git_commit": commit_, "gpu": {"name": GPU}, "torch": "2.11.0"},
               "config": {"command": "python -m benchmarks floors"}, "results": [], "complete": True, **extra}
    (folder / name).write_text(json.dumps(payload))


def record_tests(folder: Path, name: str, commit_: str, modified=None) -> None:
    gpu_result(folder, name, commit_, case="tests", sources_modified=modified,
               tests={"passed": 7, "failed": 0, "skipped": 1, "errors": 0, "failures": [], "selection": "-k cuda"})


@pytest.fixture
def repo(tmp_path):
    """A repository whose first commit ran on a GPU: a.cu includes b.cuh and fastrank/h.h."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    first = commit(r, {"csrc/cuda/a.cu": '#include "fastrank/h.h"\n#include "b.cuh"\n#include <cstdio>\n',
                       "csrc/cuda/b.cuh": "// b\n", "csrc/include/fastrank/h.h": "// h\n",
                       "csrc/bindings/cuda.cpp": '#include "fastrank/h.h"\n', "csrc/cpu/x.cpp": "// cpu\n",
                       "docs/page.md": "x\n"}, "first")
    (r / "results").mkdir()
    gpu_result(r / "results", "cuda-2026-11-26-floors.json", first)
    record_tests(r / "results", "cuda-2026-11-26-tests.json", first)
    return r, first


def rows(bench, repo_path):
    st = bench.cuda_status.status(repo_path / "results", repo_path / "docs")
    return {row.path: row for row in st.rows}, st


def test_every_source_of_the_cuda_build_is_a_row_and_ran_as_it_is(bench, repo):
    r, first = repo
    by_path, st = rows(bench, r)
    assert sorted(by_path) == ["csrc/bindings/cuda.cpp", "csrc/cuda/a.cu", "csrc/cuda/b.cuh"]   # not the CPU's
    for row in by_path.values():
        assert row.ran_as_is and row.run.commit == first and row.run.gpu == GPU
        assert row.run.tests["passed"] == 7 and row.run.tests_file == "cuda-2026-11-26-tests.json"
    table = bench.cuda_status.table(st, r / "results", r / "docs")
    assert table.count("ran as it is now") == 3 and "7 passed, 1 skipped" in table and "**emulated only**" not in table


def test_a_changed_header_makes_its_includers_emulated_only(bench, repo):
    r, first = repo
    second = commit(r, {"csrc/include/fastrank/h.h": "// h, changed\n"}, "header")
    commit(r, {"csrc/cuda/a.cu": '#include "fastrank/h.h"\n#include "b.cuh"\n// changed\n'}, "a itself")
    by_path, st = rows(bench, r)
    a, b, binding = by_path["csrc/cuda/a.cu"], by_path["csrc/cuda/b.cuh"], by_path["csrc/bindings/cuda.cpp"]
    assert b.ran_as_is
    assert not a.ran_as_is and a.since == second and a.run.commit == first
    assert set(a.changed) == {"csrc/cuda/a.cu", "csrc/include/fastrank/h.h"}
    assert binding.changed == ["csrc/include/fastrank/h.h"] and binding.since == second
    summary = bench.cuda_status.render({"file": "../results", "view": "summary"}, r / "docs")
    assert ("of the 3 CUDA sources of the build, 1 ran on a GPU as it is now and 2 are emulated only since their "
            f"last GPU run. Last GPU run: `{first}`, 2026-11-26, {GPU}; its CUDA tests: 7 passed, 1 skipped.") in summary
    with pytest.raises(ValueError, match="view='rows'"):
        bench.cuda_status.render({"file": "../results", "view": "rows"}, r / "docs")
    table = bench.cuda_status.table(st, r / "results", r / "docs")
    assert f"| `csrc/cuda/a.cu` | `{first}`, 2026-11-26 | {GPU} |" in table
    assert f"**emulated only** since `{second}` |" in table                                       # a.cu: the file itself
    assert f"**emulated only** since `{second}` (headers it includes: `fastrank/h.h`)" in table   # the binding


def test_a_file_newer_than_every_run_never_ran(bench, repo):
    r, _ = repo
    added = commit(r, {"csrc/cuda/new.cu": "// new\n"}, "new kernel")
    by_path, _ = rows(bench, r)
    assert by_path["csrc/cuda/new.cu"].run is None and by_path["csrc/cuda/new.cu"].added == added


def test_the_newest_run_holding_the_file_counts_and_its_local_changes_do_not(bench, repo):
    r, first = repo
    second = commit(r, {"csrc/cuda/b.cuh": "// b2\n"}, "b")
    gpu_result(r / "results", "cuda-2026-11-27-floors.json", second)
    by_path, _ = rows(bench, r)
    assert by_path["csrc/cuda/b.cuh"].ran_as_is and by_path["csrc/cuda/b.cuh"].run.commit == second
    assert by_path["csrc/cuda/b.cuh"].run.tests is None        # that run recorded no test counts
    # a run whose tests ran with a.cu modified from its commit: a.cu did not run as committed there
    record_tests(r / "results", "cuda-2026-11-27-tests.json", second, modified=["csrc/cuda/a.cu"])
    by_path, _ = rows(bench, r)
    assert by_path["csrc/cuda/a.cu"].run.commit == first and by_path["csrc/cuda/b.cuh"].run.commit == second


def test_the_table_is_stable_under_a_docs_commit_and_stale_after_a_source_commit(bench, repo):
    r, _ = repo
    page = r / "docs" / "page.md"
    page.write_text("# p\n\n<!-- benchmarks table: ../results; layout=cuda-status -->\n<!-- end benchmarks table -->\n\n"
                    "<!-- benchmarks table: ../results; layout=cuda-status; files=a.cu -->\n"
                    "<!-- end benchmarks table -->\n")
    assert bench.report.main([str(page)]) == 0
    text = page.read_text()
    assert text.count("From [`../results`](../results)") == 2 and "`a.cu` ran as it is now" in text
    commit(r, {}, "the regenerated page")                                   # docs only: nothing changes
    assert bench.report.main(["--check", str(page)]) == 0
    commit(r, {"csrc/cuda/b.cuh": "// b, changed\n"}, "a kernel change")
    assert bench.report.main(["--check", str(page)]) == 1
    assert bench.report.main([str(page)]) == 0 and "`a.cu` **emulated only** since" in page.read_text()


def test_missing_history_is_said_never_drawn(bench, repo, tmp_path, capsys):
    r, _ = repo
    gpu_result(r / "results", "cuda-2026-11-28-floors.json", "0123abc")       # a commit this history lacks
    with pytest.raises(bench.cuda_status.CudaStatusError, match="0123abc .* not in the history"):
        bench.cuda_status.status(r / "results", r / "docs")
    (r / "results" / "cuda-2026-11-28-floors.json").unlink()
    commit(r, {"csrc/cuda/b.cuh": "// b2\n"}, "second")
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{r}", str(shallow)], check=True)
    with pytest.raises(bench.cuda_status.CudaStatusError, match="shallow clone"):
        bench.cuda_status.status(shallow / "results", shallow / "docs")
    page = shallow / "docs" / "page.md"
    page.write_text("<!-- benchmarks table: ../../repo/results; layout=cuda-status -->\n<!-- end benchmarks table -->\n")
    assert bench.report.main(["--check", str(page)]) == 1
    assert "shallow clone" in capsys.readouterr().out


def test_a_result_without_commit_or_gpu_is_no_run_and_an_unknown_file_is_an_error(bench, repo):
    r, first = repo
    gpu_result(r / "results", "cuda-2026-11-28-floors.json", None)
    (r / "results" / "cpu-2026-11-28-floors.json").write_text("{}")           # not a GPU result: not read
    by_path, st = rows(bench, r)
    assert all(row.run.commit == first for row in by_path.values())
    with pytest.raises(ValueError, match="nope.cu is no CUDA source"):
        bench.cuda_status.line(st, ["nope.cu"], r / "results", r / "docs", r)


def test_claims_outside_the_generated_status_are_found(bench, tmp_path):
    claims = bench.report.unsupported_claims
    assert claims("The kernels ran on an H100 on 2026-11-26.") == ["ran on an H100"]
    assert claims("tested on one NVIDIA H100 80GB") and claims("It ran on a GPU.")
    assert not claims("It never ran on a GPU; measured on an H100 (a timing, with its file).")
    generated = ("<!-- benchmarks table: ../results; layout=cuda-status; files=a.cu -->\n"
                 "`a.cu` ran at `abc` (H100) ... it ran on an H100\n<!-- end benchmarks table -->\n")
    assert not claims(generated)
    page = tmp_path / "page.md"
    page.write_text("The fused kernels ran on an H100.\n")
    assert bench.report.main(["--check", str(page)]) == 1


# ---------------------------------------------------------------- a GPU run's test counts

def test_test_counts_from_junit_xml(bench, tmp_path):
    xml = tmp_path / "t.xml"
    xml.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="5">'
                   '<testcase classname="tests.test_a" name="test_ok"/>'
                   '<testcase classname="tests.test_a" name="test_ok2"/>'
                   '<testcase classname="tests.test_a" name="test_bad"><failure message="x"/></testcase>'
                   '<testcase classname="tests.test_b" name="test_skip"><skipped message="no"/></testcase>'
                   '<testcase classname="tests.test_b" name="test_err"><error message="e"/></testcase>'
                   '</testsuite></testsuites>')
    counts = bench.gpu_tests.counts(xml)
    assert counts == {"passed": 2, "failed": 1, "skipped": 1, "errors": 1,
                      "failures": ["tests.test_a::test_bad", "tests.test_b::test_err"]}
    assert bench.gpu_tests.summary(counts) == "2 passed, 1 failed, 1 skipped, 1 error"
    payload = bench.gpu_tests.payload(xml, {"git_commit": "abc1234", "gpu": {"name": GPU}, "torch": "2.11"},
                                      "2026-12-01T00:00:00+00:00", "python -m benchmarks gpu_tests", "-k cuda", [])
    md = bench.report.payload_markdown(payload)
    assert "**2 passed, 1 failed, 1 skipped, 1 error**" in md and "`tests.test_a::test_bad`" in md
    assert "fastrank @ abc1234" in md and "from the commit where the tests ran: none" in md


def test_gpu_check_writes_a_tests_result_after_the_cuda_tests():
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    junit = script.index('--junitxml="$OUT/cuda-tests.xml"')
    assert script.index('benchmarks" gpu_tests --junit "$OUT/cuda-tests.xml"') > junit


# ---------------------------------------------------------------- the docs

def _marked_files(bench, text: str):
    """The sources named by the cuda-status markers of a page (None: the whole table)."""
    out = []
    for block in bench.report.MARKER.findall(text):
        spec = bench.report.parse_spec(block[1])
        if spec.get("layout") == "cuda-status":
            out.append([f.strip() for f in spec["files"].split(",")] if spec.get("files") else None)
    return out


def test_the_docs_take_their_cuda_status_from_the_generated_one(bench):
    assert _marked_files(bench, (ROOT / "docs" / "benchmarks.md").read_text()).count(None) == 1   # the table
    assert _marked_files(bench, (ROOT / "README.md").read_text())
    pages = sorted((ROOT / "docs" / "losses").glob("*.md"))
    for page in pages:
        text = page.read_text()
        named = set(re.findall(r"csrc/cuda/(\w+\.cuh?)", text))
        marked = {f for files in _marked_files(bench, text) for f in (files or ())}
        assert named <= marked, f"{page.name}: names {sorted(named - marked)} without their generated CUDA status"
    for doc in [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md")):
        assert not bench.report.unsupported_claims(doc.read_text()), doc.relative_to(ROOT)


def test_gpu_tests_command_writes_the_result_and_its_markdown(bench, tmp_path, monkeypatch):
    import torch
    xml = tmp_path / "cuda-tests.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_ok"/></testsuite></testsuites>')
    if not torch.cuda.is_available():     # a tests result records a run on a GPU: none without one
        assert bench.gpu_tests.main(["--junit", str(xml), "--out", str(tmp_path)]) == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.results, "machine_info", lambda device: {"git_commit": "abc1234", "gpu": {"name": GPU},
                                                                       "torch": torch.__version__})
    assert bench.gpu_tests.main(["--junit", str(xml), "--out", str(tmp_path / "out")]) == 0
    assert bench.gpu_tests.main(["--junit", str(xml), "--out", str(tmp_path / "out"), "--tag", "x"]) == 0
    [plain] = (tmp_path / "out").glob("cuda-*-tests.json")
    [written] = (tmp_path / "out").glob("cuda-*-tests-x.json")
    assert json.loads(plain.read_text())["tests"] == json.loads(written.read_text())["tests"]   # no tag: no suffix
    payload = json.loads(written.read_text())
    assert payload["tests"]["passed"] == 1 and payload["machine"]["git_commit"] == "abc1234"
    assert written.with_suffix(".md").read_text() == bench.report.result_markdown(written)
