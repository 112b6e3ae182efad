"""Training that survives being stopped: mid-epoch checkpoints, exact resume after
kill -9 and after SIGTERM (one process and 2 gloo processes under torchrun), --resume without a
checkpoint or with a foreign file, and every checkpoint loading with weights_only=True.

The kill tests run ``fastrank train`` in a subprocess through a small driver that wraps
``Trainer._save_last``: right after the first mid-epoch checkpoint of a chosen epoch it sends
SIGKILL (or SIGTERM) to its own process, so the stop lands at a known point on a loaded machine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fastrank.cli import main as cli_main
from fastrank.train import (CheckpointError, Trainer, TrainingInterrupted, evaluate_checkpoint,
                            load_checkpoint, load_config)

import fastrank

# the subprocesses import the fastrank this test imported (installed, or the source tree with an
# in-place build), so that they run the same native ops
PACKAGE_PARENT = Path(fastrank.__file__).resolve().parents[1]

# 15 steps per epoch (240 captions / 16), 2 epochs: one warm-up epoch, then the recipe's loss at
# lr / 10 (scheduler state matters); the mlp image encoder has dropout (RNG state matters)
VALUES = {
    "data.demo_n_train": 48, "data.demo_n_test": 20,
    "model.image_encoder": "mlp", "model.image_kw": {"hidden_dims": [16, 16], "dropout": 0.3},
    "model.embed_dim": 16, "model.text_kw": {"word_dim": 8},
    "relevance.source": "tfidf",
    "loss.spec": "triplet:1.0,smooth_ndcg:1.0", "loss.warmup_epochs": 1,
    "train.epochs": 2, "train.batch_size": 16, "train.seed": 3, "train.threads": 1,
    "train.progress": False, "train.save_every_steps": 4, "train.save_every_minutes": 0.0,
    "optim.lr": 1e-3, "optim.lr_milestones": [1],
    "eval.graded": False, "eval.cs_k": [5],
}

DRIVER = textwrap.dedent("""
    import faulthandler, os, signal, sys
    import torch
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(200, exit=True)   # a hang fails with every thread's stack
    mode, epoch, rank, argv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    if mode != "plain":
        from fastrank.train import loop
        save, fired = loop.Trainer._save_last, []

        def save_then_stop(self):
            path = save(self)
            # right after the first mid-epoch checkpoint of epoch `epoch` (0-based), on rank `rank`
            if self.step > 0 and self.epoch == epoch and self.rank == rank and not fired:
                fired.append(1)
                os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGTERM)
            return path
        loop.Trainer._save_last = save_then_stop
    from fastrank.cli import main
    sys.exit(main(argv))
""")


def _toml(v) -> str:
    """A TOML value (what ``--set key=value`` parses)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v)


def _set_flags(values):
    return [f"--set={k}={_toml(v)}" for k, v in values.items()]


def _start(tmp_path, out, mode="plain", epoch=0, rank=0, resume=False, torchrun=False, **extra):
    """Start ``fastrank train`` on the demo data in a subprocess (through DRIVER); returns the Popen."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    values = dict(VALUES, **extra)
    args = [str(driver), mode, str(epoch), str(rank), "train", "--data", "demo", "--out", str(out), "--no-progress",
            *_set_flags(values)] + (["--resume"] if resume else [])
    if torchrun:
        args = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "--monitor_interval", "0.2"] + args
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_PARENT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    if torchrun and sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"    # loopback only (see tests/test_distributed.py)
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _wait(proc):
    """(returncode, stdout, stderr) of a process from :func:`_start`."""
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if fastrank.backends()["cpu"]:   # the children ran the native ops this process has
        assert "_C_cpu unavailable" not in err, err
    return proc.returncode, out, err


def _train(tmp_path, out, **kw):
    return _wait(_start(tmp_path, out, **kw))


def _lines(out):
    """metrics.jsonl records without the wall-clock fields."""
    return [{k: v for k, v in json.loads(ln).items() if not k.startswith("time_")}
            for ln in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def _assert_same_run(a, b, epochs):
    """Two finished runs: identical weights, optimizer state and metrics.jsonl lines."""
    ca, cb = load_checkpoint(Path(a) / "last.pt"), load_checkpoint(Path(b) / "last.pt")
    assert ca["epoch"] == cb["epoch"] == epochs and ca["step"] == cb["step"] == 0
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), k
    oa, ob = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert oa.keys() == ob.keys()
    for i in oa:
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(oa[i][k], ob[i][k]), (i, k)
    la, lb = _lines(a), _lines(b)
    assert len(la) == epochs and la == lb
    assert not [p for p in Path(b).iterdir() if p.name.endswith(".tmp")]


def test_kill9_then_sigterm_then_resume_equals_uninterrupted_run(tmp_path):
    """One run stopped twice: kill -9 right after its first mid-epoch checkpoint (epoch 1,
    step 4), resumed; SIGTERM in epoch 2 (stops after the step it came in: step 5, exit 143,
    one line), resumed to the end. Weights, Adam state and metrics.jsonl equal the run that was
    never stopped (either resume being inexact would show)."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    reference = _start(tmp_path, ref)                   # the uninterrupted run, alongside
    rc, so, se = _train(tmp_path, out, mode="kill", epoch=0)
    assert rc == -signal.SIGKILL, so + se
    ck = load_checkpoint(out / "last.pt")
    assert (ck["epoch"], ck["step"]) == (0, 4)          # died right after the first mid-epoch save
    assert not (out / "metrics.jsonl").read_text()

    rc, so, se = _train(tmp_path, out, mode="term", epoch=1, resume=True)
    assert rc == 128 + signal.SIGTERM, so + se
    assert "resumed from" in so and "epoch 1, step 4" in so, so
    assert "Traceback" not in se, se
    stop = [ln for ln in so.splitlines() if "stopped by SIGTERM" in ln]
    assert len(stop) == 1 and "last.pt" in stop[0] and "--resume" in stop[0], so
    ck = load_checkpoint(out / "last.pt")
    assert (ck["epoch"], ck["step"]) == (1, 5)          # the step the signal came in, finished
    assert len(_lines(out)) == 1

    rc, so, se = _train(tmp_path, out, resume=True)
    assert rc == 0, so + se
    rc, so, se = _wait(reference)
    assert rc == 0, so + se
    _assert_same_run(ref, out, VALUES["train.epochs"])


def test_kill9_and_resume_with_gradient_caching_and_memory(tmp_path):
    """Gradient caching (chunks of 6, 6, 4 through the mlp encoder's dropout and batch norm) and
    the cross-batch memory (Smooth-AP and triplet rank 40 past embeddings): killed -9 after the
    first mid-epoch checkpoint of epoch 2, resumed, it ends bit-identical to the run never
    stopped: the replayed RNG and the memory in last.pt leave nothing to chance."""
    extra = {"train.cache_chunk": 6, "train.memory_size": 40,
             "loss.spec": "triplet:1.0,smooth_ap:1.0,smooth_ndcg:1.0"}
    ref, out = tmp_path / "ref", tmp_path / "run"
    reference = _start(tmp_path, ref, **extra)
    rc, so, se = _train(tmp_path, out, mode="kill", epoch=1, **extra)
    assert rc == -signal.SIGKILL, so + se
    ck = load_checkpoint(out / "last.pt")
    assert (ck["epoch"], ck["step"]) == (1, 4)
    assert ck["memory"]["capacity"] == 40 and len(ck["memory"]["images"]["ids"]) == 40
    rc, so, se = _train(tmp_path, out, resume=True, **extra)
    assert rc == 0, so + se
    assert "resumed from" in so and "epoch 2, step 4" in so, so
    rc, so, se = _wait(reference)
    assert rc == 0, so + se
    _assert_same_run(ref, out, VALUES["train.epochs"])
    ca, cb = load_checkpoint(ref / "last.pt"), load_checkpoint(out / "last.pt")
    for part in ("images", "captions"):
        for k in ("embeddings", "ids"):
            assert torch.equal(ca["memory"][part][k], cb["memory"][part][k]), (part, k)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_torchrun_two_gloo_processes_killed_stopped_and_resumed(tmp_path):
    """2 gloo processes under torchrun: rank 0 killed -9 right after the first mid-epoch
    checkpoint, resumed; then SIGTERM to rank 1 only (the ranks agree and stop at the same
    step, rank 0 writes), resumed: the same as the uninterrupted 2-process run."""
    extra = {"loss.options": {"triplet": {"mining": "soft", "gamma": 10.0}}, "train.epochs": 1,
             "loss.warmup_epochs": 0}
    ref, out = tmp_path / "ref", tmp_path / "run"
    reference = _start(tmp_path, ref, torchrun=True, **extra)
    rc, so, se = _train(tmp_path, out, mode="kill", epoch=0, torchrun=True, **extra)
    assert rc != 0
    ck = load_checkpoint(out / "last.pt")
    assert (ck["epoch"], ck["step"], ck["world_size"]) == (0, 4, 2)
    assert ck["epoch_sums"].shape == (2, 3)              # each rank's running loss sums

    rc, so, se = _train(tmp_path, out, mode="term", epoch=0, rank=1, resume=True, torchrun=True, **extra)
    assert rc != 0
    assert so.count("resumed from") == 1                 # rank 0 speaks
    stop = [ln for ln in so.splitlines() if "stopped by SIGTERM" in ln]
    assert len(stop) == 1 and "epoch 1, step 9/15" in stop[0], so + se
    ck = load_checkpoint(out / "last.pt")
    assert (ck["epoch"], ck["step"]) == (0, 9)

    rc, so, se = _train(tmp_path, out, resume=True, torchrun=True, **extra)
    assert rc == 0, so + se
    rc, so, se = _wait(reference)
    assert rc == 0, so + se
    _assert_same_run(ref, out, 1)


# ----------------------------------------------------------------------------- in-process
def _config(out, **extra):
    return load_config(None, **dict(VALUES, **{"train.out_dir": str(out)}, **extra))


def test_every_checkpoint_loads_weights_only_and_resume_from_older_one(tmp_path):
    """last.pt (mid-epoch and epoch end), best.pt and the kept epoch*_step*.pt all load with
    torch.load(weights_only=True); best.pt holds only the model; resuming from an older kept
    checkpoint rewrites metrics.jsonl to what it had seen and ends in the same run."""
    out = tmp_path / "a"
    a = Trainer(_config(out, **{"train.keep_checkpoints": 3}), log=lambda s: None)
    hist = a.fit()
    kept = sorted(p.name for p in out.glob("epoch*_step*.pt"))
    assert kept == ["epoch001_step000008.pt", "epoch001_step000012.pt", "epoch002_step000000.pt"]
    assert os.path.samefile(out / "last.pt", out / kept[-1])
    files = kept + ["last.pt", "best.pt"]
    for name in files:
        ck = torch.load(out / name, map_location="cpu", weights_only=True)
        assert ck["format"] == "fastrank-train-2", name
    best = torch.load(out / "best.pt", weights_only=True)
    assert best["kind"] == "model" and "optimizer" not in best and "rng" not in best
    last = torch.load(out / "last.pt", weights_only=True)
    assert last["kind"] == "full" and {"optimizer", "scheduler", "scaler", "rng", "history"} <= set(last)
    assert (out / "best.pt").stat().st_size < (out / "last.pt").stat().st_size / 2
    # both rebuild the model for evaluation
    res = evaluate_checkpoint(out / "best.pt", graded=False)
    assert res["rsum"] == pytest.approx([r["rsum"] for r in hist if r["best"]][-1])
    # resume from the older mid-epoch checkpoint: the epoch-2 line is dropped, then rewritten
    b = Trainer(_config(out, **{"train.keep_checkpoints": 3}), resume=out / kept[0], log=lambda s: None)
    assert (b.epoch, b.step) == (1, 8)
    b.fit()
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())
    strip = lambda h: [{k: v for k, v in r.items() if not k.startswith("time_")} for r in h]  # noqa: E731
    assert strip(b.history) == strip(hist) == _lines(out)


def test_resume_refuses_best_pt_and_a_changed_data_order(tmp_path):
    out = tmp_path / "a"
    base = {"train.epochs": 1, "train.max_steps_per_epoch": 5}
    tr = Trainer(_config(out, **base), log=lambda s: None)
    tr.fit()
    with pytest.raises(CheckpointError, match="best.pt.*only a model"):
        Trainer(_config(out, **base), resume=out / "best.pt")
    mid = tmp_path / "mid.pt"
    tr.step, tr._epoch_sums = 3, torch.zeros(3, dtype=torch.float64)   # as if stopped at step 3
    tr.save(mid)
    with pytest.raises(CheckpointError, match=r"train.batch_size 16 -> 8"):
        Trainer(_config(out, **base, **{"train.batch_size": 8}), resume=mid)
    assert Trainer(_config(out, **base), resume=mid, log=lambda s: None).step == 3


def test_signal_in_process_raises_training_interrupted(tmp_path):
    """SIGUSR1 from inside the loop (as a scheduler would send it): the step finishes, last.pt
    is written at that step, fit() raises TrainingInterrupted with exit code 138."""
    if not hasattr(signal, "SIGUSR1"):
        pytest.skip("no SIGUSR1 on this platform")
    lines = []
    tr = Trainer(_config(tmp_path / "a", **{"train.save_every_steps": 0}), log=lines.append)
    # during the 7th optimizer step
    tr.optimizer.register_step_post_hook(lambda *a: os.kill(os.getpid(), signal.SIGUSR1) if tr.step == 6 else None)
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(TrainingInterrupted) as info:
        tr.fit()
    assert info.value.exit_code == 128 + signal.SIGUSR1 and info.value.checkpoint == tmp_path / "a" / "last.pt"
    ck = load_checkpoint(tmp_path / "a" / "last.pt")
    assert (ck["epoch"], ck["step"]) == (0, 7)
    assert "stopped by SIGUSR1 at epoch 1, step 7/15" in lines[-1]
    assert signal.getsignal(signal.SIGUSR1) == before       # handlers restored


# ----------------------------------------------------------------------------- CLI errors
def _cli_tiny(out, *more):
    return cli_main(["train", "--data", "demo", "--out", str(out), "--no-progress",
                     *_set_flags(dict(VALUES, **{"train.epochs": 1, "train.max_steps_per_epoch": 2})), *more])


def test_cli_resume_without_checkpoint_starts_fresh(tmp_path, capsys):
    assert _cli_tiny(tmp_path / "new", "--resume") == 0
    text = capsys.readouterr().out
    assert len([ln for ln in text.splitlines() if "starting from scratch" in ln]) == 1
    assert len(_lines(tmp_path / "new")) == 1
    assert _cli_tiny(tmp_path / "new", "--resume", "latest") == 0     # done: nothing left to train
    assert "resumed from" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["missing", "text", "short_text", "state_dict", "pickled_code"])
def test_cli_resume_foreign_file(tmp_path, capsys, kind):
    path = tmp_path / f"{kind}.pt"
    if kind == "text":
        path.write_text("not a checkpoint\n")
    elif kind == "short_text":
        path.write_text("hi\n")             # the weights-only unpickler fails with a KeyError
    elif kind == "state_dict":
        torch.save(torch.nn.Linear(2, 2).state_dict(), path)
    elif kind == "pickled_code":
        torch.save({"format": "fastrank-train-2", "payload": _Boom(tmp_path / "ran")}, path)
    rc = _cli_tiny(tmp_path / "run", "--resume", str(path))
    err = capsys.readouterr().err
    assert rc == 2 and str(path) in err and err.startswith("fastrank train: error:"), err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "ran").exists()
    if kind != "missing":
        rc = cli_main(["eval", "--checkpoint", str(path)])
        err = capsys.readouterr().err
        assert rc == 2 and str(path) in err and err.startswith("fastrank eval: error:"), err


class _Boom:
    """Unpickling runs os.system: weights_only=True must refuse it, never run it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))
