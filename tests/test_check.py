"""``fastrank check`` (src/fastrank/check.py): on this machine's CPU it passes, with an ok line
for every native op of the table in every dtype at every instruction-set level this CPU runs
(the levels other than the one in use run in child processes); and when a native op returns a
perturbed value it fails (exit status 1) on that op's lines alone, and its summary names the op;
a level whose child process dies is a failed line."""
from __future__ import annotations

import os

import pytest

import fastrank
import fastrank.ops.smooth_ndcg
from fastrank import _native
from fastrank import check as fastrank_check
from fastrank.check import DTYPES, SUMMARY
from fastrank.cli import main
from fastrank.ops.registry import NATIVE_OPS

REQUIRE_NATIVE = os.environ.get("FASTRANK_REQUIRE_NATIVE") == "1"
pytestmark = pytest.mark.skipif(not fastrank.backends()["cpu"] and not REQUIRE_NATIVE,
                                reason="native CPU module not built (FASTRANK_REQUIRE_NATIVE=1: a failure)")

DTYPE_NAMES = [str(d).replace("torch.", "") for d in DTYPES]


def check(capsys, *argv):
    """(exit status, case lines, summary line) of ``fastrank check --device cpu ...``."""
    code = main(["check", "--device", "cpu", *argv])
    lines = capsys.readouterr().out.splitlines()
    assert lines and lines[-1].startswith(SUMMARY), lines[-5:]
    return code, [line for line in lines[:-1] if line.endswith((" ok", " FAIL"))], lines[-1]


def test_passes_on_this_cpu_at_every_level(capsys, monkeypatch):
    monkeypatch.delenv(_native.CPU_ISA_VARIABLE, raising=False)   # every level, not a forced one
    code, lines, summary = check(capsys)
    assert code == 0 and all(line.endswith(" ok") for line in lines), [x for x in lines if x.endswith("FAIL")]
    seen = {tuple(line.split()[:3]) for line in lines}
    for level in fastrank.backends()["cpu_isa_levels"].split(","):
        for op in NATIVE_OPS:
            for dtype in DTYPE_NAMES:
                assert (op, f"cpu/{level}", dtype) in seen, f"no line for {op} {dtype} at {level}"
    assert "all ok" in summary and f"{len(lines)} cases" in summary, summary


def test_a_perturbed_native_op_fails_by_name(capsys, monkeypatch):
    native = fastrank.ops.smooth_ndcg.SMOOTH_NDCG
    monkeypatch.setattr(fastrank.ops.smooth_ndcg, "SMOOTH_NDCG", lambda *args: native(*args) + 1e-2)
    # the level in use forced: the check stays in this process, where the op is perturbed
    monkeypatch.setenv(_native.CPU_ISA_VARIABLE, fastrank.backends()["cpu_isa"])
    code, lines, summary = check(capsys, "--ops", "kendall,smooth_ndcg")
    assert code == 1
    by_op = {op: [line for line in lines if line.split()[0] == op] for op in ("kendall", "smooth_ndcg")}
    assert by_op["kendall"] and all(line.endswith(" ok") for line in by_op["kendall"])
    assert by_op["smooth_ndcg"] and all(line.endswith(" FAIL") for line in by_op["smooth_ndcg"]), by_op["smooth_ndcg"]
    assert len(lines) == len(by_op["kendall"]) + len(by_op["smooth_ndcg"])
    assert "FAILED (smooth_ndcg)" in summary, summary


def test_a_level_whose_child_dies_is_a_failed_line(capsys):
    """A child process that runs no case (here: a level this build lacks stops its import) is
    a failure, never a level that silently passed."""
    tally = fastrank_check.Tally()
    fastrank_check.check_cpu_level("sse9", ["kendall"], tally)
    [line] = capsys.readouterr().out.splitlines()
    assert tally.cases == 1 and tally.failed == ["(every op)"]
    assert line.endswith(" FAIL") and "cpu/sse9" in line and "exited with status 1" in line, line
