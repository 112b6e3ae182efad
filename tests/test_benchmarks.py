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
