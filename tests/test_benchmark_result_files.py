"""A benchmark writes a result file only when it measured something, and never over a committed one.

- a run whose records hold no time or memory (every cell skipped, no splits) writes nothing
  and exits with status 1;
- what a case saves as it goes is ``<name>.partial.json`` (``complete: false``): a run cut
  short leaves that and no result; a finished run writes ``<name>.json`` and removes it;
- a result file of the same name that git tracks is refused, before anything runs, unless
  ``--tag`` names another file or ``--force`` is given.
"""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastrank  # (before the benchmarks: the fastrank in use is the one they measure)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import cli, results  # noqa: E402
from benchmarks.case import Case, payload  # noqa: E402

CPU = torch.device("cpu")


def _record(status="ok", median=1e-3, reason=None):
    time = None if median is None else {"median_s": median, "p25_s": median, "p75_s": median, "min_s": median,
                                        "max_s": median, "repeats": 3}
    return {"op": "op", "impl": "native", "mode": "forward", "size": {"n": 4}, "size_label": "4", "x": 4,
            "dtype": "float32", "device": "cpu", "status": status, "reason": reason, "time": time, "memory": None}


MACHINE = results.machine_info(CPU)


def _payload(records, complete=True):
    return payload("fake", CPU, {"quick": True}, records, {"baselines": {"op": "native"}}, MACHINE, 0.0,
                   complete=complete)


def _args(out: Path):
    return cli.parser(()).parse_args(["fake", "--no-plots", "--out", str(out)])


def _run(case, out, capfd):
    code = cli.run_case(case, _args(out), CPU, results.stem(CPU, case.name, "t"))
    return code, capfd.readouterr().err


def test_what_counts_as_a_measurement():
    assert results.measured(_payload([_record()]))
    assert results.measured(_payload([_record(status="skipped", median=None), _record()]))
    assert not results.measured(_payload([]))
    assert not results.measured(_payload([_record(status="skipped", median=None, reason="no GPU")]))
    assert not results.measured(_payload([_record(median=None)]))   # "ok" but never timed (quality --splits 0)
    assert results.measured({**_payload([]), "ceilings": {"copy_bytes_per_s": 1e10}})   # floors
    assert results.why_nothing(_payload([_record(status="skipped", median=None, reason="no GPU")])) == "no GPU"


def test_a_run_that_measured_nothing_writes_nothing(tmp_path, capfd):
    def run(args, device, save):
        save(_payload([_record(status="skipped", median=None, reason="not installed")], complete=False))
        return _payload([_record(status="skipped", median=None, reason="not installed")])
    code, err = _run(Case("fake", "", run), tmp_path / "out", capfd)
    assert code == 1 and "measured nothing (not installed); no result file written" in err, err
    assert not (tmp_path / "out").exists()


def test_a_finished_run_writes_its_result_and_removes_the_partial_one(tmp_path, capfd):
    out = tmp_path / "out"
    seen = []

    def run(args, device, save):
        save(_payload([_record()], complete=False))
        seen.append(sorted(p.name for p in out.iterdir()))
        return _payload([_record(), _record(median=2e-3)])
    code, _ = _run(Case("fake", "", run), out, capfd)
    stem = results.stem(CPU, "fake", "t")
    assert code == 0
    assert seen == [[f"{stem}.partial.json"]]
    assert sorted(p.name for p in out.iterdir()) == [f"{stem}.json", f"{stem}.md"]
    data = json.loads((out / f"{stem}.json").read_text())
    assert data["complete"] is True and len(data["results"]) == 2


def test_a_run_cut_short_leaves_only_its_partial_file(tmp_path, capfd):
    out = tmp_path / "out"

    def run(args, device, save):
        save(_payload([_record()], complete=False))
        raise KeyboardInterrupt   # as a time limit or a signal cuts it
    with pytest.raises(KeyboardInterrupt):
        _run(Case("fake", "", run), out, capfd)
    [left] = out.iterdir()
    stem = results.stem(CPU, "fake", "t")
    assert left.name == f"{stem}.partial.json" and results.is_partial(left)
    assert json.loads(left.read_text())["complete"] is False


def _committed(folder: Path, name: str) -> Path:
    folder.mkdir()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], cwd=folder, check=True)
    path = folder / name
    path.write_text("{}\n")
    subprocess.run(git + ["add", name], cwd=folder, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "a result"], cwd=folder, check=True)
    return path


def test_a_committed_result_is_not_replaced_without_tag_or_force(tmp_path, monkeypatch):
    if not fastrank.backends()["cpu"]:
        pytest.skip("python -m benchmarks measures a fastrank with its native module")
    out = tmp_path / "results"
    path = _committed(out, results.stem(CPU, "floors", "") + ".json")
    assert results.committed(path) and not results.committed(out / "other.json")
    ran = []
    monkeypatch.setattr(cli, "run_case", lambda case, args, device, stem: ran.append(stem) or 0)
    argv = ["floors", "--device", "cpu", "--out", str(out)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(argv) == 2
    assert err.getvalue() == (f"python -m benchmarks: error: {path} is a committed result of that name; give --tag "
                              f"NAME to write beside it, or --force to replace it\n")
    assert ran == [] and path.read_text() == "{}\n"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(argv + ["--tag", "again"]) == 0
        assert cli.main(argv + ["--force"]) == 0
    assert ran == [path.stem + "-again", path.stem]
