"""``fastrank check`` (src/fastrank/check.py), as a user runs it: on this machine's CPU it passes,
with an ok line for every native op of the table in every dtype at every instruction-set level
this CPU runs; and when a native op returns a perturbed value it fails (exit status 1) on that
op's lines alone, and its summary names the op."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastrank
from fastrank import _native
from fastrank.check import DTYPES, SUMMARY
from fastrank.ops.registry import NATIVE_OPS

REQUIRE_NATIVE = os.environ.get("FASTRANK_REQUIRE_NATIVE") == "1"
pytestmark = pytest.mark.skipif(not fastrank.backends()["cpu"] and not REQUIRE_NATIVE,
                                reason="native CPU module not built (FASTRANK_REQUIRE_NATIVE=1: a failure)")

DTYPE_NAMES = [str(d).replace("torch.", "") for d in DTYPES]


def run(code: str, tmp_path, **env):
    """``python -c code`` in an empty folder, importing the fastrank under test; the CPU level
    left to pick (``env`` adds to the environment)."""
    child = {k: v for k, v in os.environ.items() if k != _native.CPU_ISA_VARIABLE}
    child["PYTHONPATH"] = os.pathsep.join([str(Path(fastrank.__file__).resolve().parents[1]),
                                           child.get("PYTHONPATH", "")])
    child.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=child, capture_output=True, text=True,
                          timeout=600)


def case_lines(stdout: str) -> list:
    return [line for line in stdout.splitlines() if line.endswith((" ok", " FAIL")) and not line.startswith(SUMMARY)]


def test_passes_on_this_cpu_at_every_level(tmp_path):
    r = run("import sys; from fastrank.cli import main; sys.exit(main(['check', '--device', 'cpu']))", tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    lines = case_lines(r.stdout)
    assert all(line.endswith(" ok") for line in lines)
    seen = {tuple(line.split()[:3]) for line in lines}
    for level in fastrank.backends()["cpu_isa_levels"].split(","):
        for op in NATIVE_OPS:
            for dtype in DTYPE_NAMES:
                assert (op, f"cpu/{level}", dtype) in seen, f"no line for {op} {dtype} at {level}"
    summary = r.stdout.splitlines()[-1]
    assert summary.startswith(SUMMARY) and "all ok" in summary and f"{len(lines)} cases" in summary, summary


PERTURBED = """
import sys
import fastrank.ops.smooth_ndcg as op
native = op.SMOOTH_NDCG
op.SMOOTH_NDCG = lambda *args: native(*args) + 1e-2   # the native forward's value, 1e-2 off
from fastrank.cli import main
sys.exit(main(["check", "--device", "cpu", "--ops", "kendall,smooth_ndcg"]))
"""


def test_a_perturbed_native_op_fails_by_name(tmp_path):
    # the level in use forced: the check stays in this process, where the op is perturbed
    r = run(PERTURBED, tmp_path, **{_native.CPU_ISA_VARIABLE: fastrank.backends()["cpu_isa"]})
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-4000:]
    lines = case_lines(r.stdout)
    by_op = {op: [line for line in lines if line.split()[0] == op] for op in ("kendall", "smooth_ndcg")}
    assert by_op["kendall"] and all(line.endswith(" ok") for line in by_op["kendall"])
    assert by_op["smooth_ndcg"] and all(line.endswith(" FAIL") for line in by_op["smooth_ndcg"]), by_op["smooth_ndcg"]
    assert len(lines) == len(by_op["kendall"]) + len(by_op["smooth_ndcg"])
    summary = r.stdout.splitlines()[-1]
    assert summary.startswith(SUMMARY) and "FAILED (smooth_ndcg)" in summary, summary
