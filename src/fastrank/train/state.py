"""The trainer's state and its checkpoints.

Files in ``train.out_dir``: ``last.pt`` (everything needed to resume: model, optimizer,
scheduler, grad scaler, RNG states, epoch, step inside the epoch, the epoch's running loss
sums, history, the cross-batch memory), written at each epoch's end and inside epochs every
``train.save_every_steps`` steps / ``train.save_every_minutes`` minutes; ``best.pt`` (the
model, its config and vocabulary at the best ``eval.best_by`` so far: what evaluation and
export need); ``metrics.jsonl`` (one JSON line per epoch); ``config.json``; with
``train.keep_checkpoints = K`` also the last K ``epoch{E}_step{S}.pt`` (last.pt is a hard link
to the newest). Every file is written atomically and loads with
``torch.load(weights_only=True)`` (:mod:`fastrank.train.checkpoint`).

Exact resume. ``--resume`` restores everything in last.pt and skips the epoch's first ``step``
batches without loading them (the epoch's order depends only on (seed, epoch)), so the resumed
run is the run that was never stopped: same weights, same metrics.jsonl lines. Under torchrun
only rank 0 writes, every rank restores the same file (rank 0's RNG states: the ranks are
seeded alike), and the epoch's loss sums are stored per rank.
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from ..data import Vocab
from ..models import VSE
from .build import build_model
from .checkpoint import CheckpointError, link_atomic, load_checkpoint, rng_state, save_atomic, set_rng_state
from .config import Config
from .cross_batch import CrossBatchMemory

__all__ = ["CHECKPOINT_FORMAT", "model_from_checkpoint", "TrainingState"]

CHECKPOINT_FORMAT = "fastrank-train-2"   # -1 (pickled numpy RNG states) needed weights_only=False
# config keys a mid-epoch resume must share with the run that wrote the checkpoint (the data order)
_ORDER_KEYS = ("batch_size", "seed", "max_steps_per_epoch")


def model_from_checkpoint(ckpt: Dict, device="cpu") -> Tuple[VSE, Config, Optional[Vocab]]:
    """Rebuild the model of a trainer checkpoint (dict from ``load_checkpoint``; last.pt or
    best.pt): (model in eval mode on ``device``, its Config, its Vocab or None)."""
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"not a fastrank trainer checkpoint (format {ckpt.get('format')!r}, "
                              f"expected {CHECKPOINT_FORMAT!r})")
    cfg = Config.from_dict(ckpt["config"])
    vocab = Vocab(ckpt["vocab"]) if ckpt.get("vocab") is not None else None
    model = build_model(cfg.model, ckpt["img_dim"], vocab)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), cfg, vocab


class TrainingState:
    """The trainer's part that holds the training state and writes and restores it: epoch,
    step, best, history, the epoch's running loss sums and training time, and the files of
    ``train.out_dir``. The trainer provides ``cfg``, ``out_dir``, ``rank``, ``world_size``,
    ``is_main``, ``device``, ``log``, ``model``, ``vocab``, ``img_dim``, ``train_ds``,
    ``optimizer``, ``scheduler``, ``scaler`` and ``memory``."""

    def _init_state(self) -> None:
        self.epoch = 0                 # epochs completed
        self.step = 0                  # optimizer steps done in epoch self.epoch (0-based)
        self.best = -math.inf          # best eval.best_by so far
        self.history: List[Dict] = []  # one record per completed epoch
        self._epoch_sums: Optional[torch.Tensor] = None   # this rank's running loss sums of the epoch
        self._epoch_time = 0.0         # training seconds of the epoch before a resume
        self._last_save = time.monotonic()

    def _open_resume(self, resume: Union[bool, str, os.PathLike]) -> Optional[Dict]:
        """The full checkpoint to resume from (see the trainer's ``resume``), or None; sets
        ``resumed_from``."""
        self.resumed_from = None
        if resume is True or resume == "latest":
            latest = self.out_dir / "last.pt"
            if latest.is_file():
                self.resumed_from = latest
            else:
                self.log(f"--resume: no checkpoint {latest} yet; starting from scratch")
        elif resume:
            self.resumed_from = Path(resume)
        if self.resumed_from is None:
            return None
        ckpt = load_checkpoint(self.resumed_from, format=CHECKPOINT_FORMAT)
        if ckpt.get("kind") != "full":
            raise CheckpointError(f"{self.resumed_from} holds only a model ({ckpt.get('kind')!r} "
                                  f"checkpoint, e.g. best.pt); resume from a last.pt")
        return ckpt

    def model_state_dict(self) -> Dict:
        """What ``best.pt`` holds: the model, its config, vocabulary and input size (all that
        evaluation and export need, a third of last.pt), plus the epoch and its metrics."""
        return {
            "format": CHECKPOINT_FORMAT,
            "kind": "model",
            "config": self.cfg.to_dict(),
            "vocab": self.vocab.itos[len(Vocab.SPECIALS):] if self.vocab is not None else None,
            "img_dim": self.img_dim,
            "model": self.model.state_dict(),
            "epoch": self.epoch,
            "metrics": copy.deepcopy(self.history[-1]) if self.history else None,
        }

    def state_dict(self, epoch_sums: Optional[torch.Tensor] = None) -> Dict:
        """The full training state (what ``last.pt`` holds): :meth:`model_state_dict` plus
        optimizer, scheduler, grad scaler, epoch, step inside the epoch, the epoch's running
        loss sums (one row per rank: ``epoch_sums``, default this rank's), its training time,
        best, history and RNG states. Plain types and tensors only."""
        if epoch_sums is None and self._epoch_sums is not None:
            epoch_sums = self._epoch_sums.detach().cpu()[None]
        state = self.model_state_dict()
        state.update({
            "kind": "full",
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "epoch_sums": epoch_sums,
            "epoch_time": self._epoch_time,
            "world_size": self.world_size,
            "n_train": len(self.train_ds),
            "best": self.best,
            "history": self.history,
            "rng": rng_state(self.device),
            "memory": self.memory.state_dict() if self.memory is not None else None,
        })
        del state["metrics"]
        return state

    def save(self, path) -> Path:
        """Write the full training state atomically (single process; under torchrun the trainer
        writes last.pt itself, from rank 0)."""
        return save_atomic(self.state_dict(), path)

    def _gathered_sums(self) -> Optional[torch.Tensor]:
        """(world_size, terms + 1) running loss sums of every rank, on every rank (a collective
        when the world size is > 1), or None outside an epoch."""
        if self._epoch_sums is None:
            return None
        local = self._epoch_sums.detach()
        if self.world_size == 1:
            return local.cpu()[None]
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return torch.stack(parts).cpu()

    def _save_last(self) -> Path:
        """Write last.pt from rank 0 (called by every rank: gathers the epoch's loss sums);
        with ``train.keep_checkpoints = K`` through ``epoch{E}_step{S}.pt``, keeping K of those."""
        sums = self._gathered_sums()
        last = self.out_dir / "last.pt"
        if self.is_main:
            state = self.state_dict(epoch_sums=sums)
            keep = self.cfg.train.keep_checkpoints
            if keep:
                named = save_atomic(state, self.out_dir / f"epoch{self.epoch:03d}_step{self.step:06d}.pt")
                link_atomic(named, last)
                for old in sorted(self.out_dir.glob("epoch*_step*.pt"))[:-keep]:
                    old.unlink(missing_ok=True)
            else:
                save_atomic(state, last)
        self._last_save = time.monotonic()
        return last

    def load_state_dict(self, state: Dict) -> None:
        """Restore what :meth:`state_dict` returned: model, optimizer, scheduler, scaler, epoch,
        step, the epoch's loss sums, best, history and RNG states (the loss and data may differ:
        the demo starts every recipe from one shared warm-up epoch this way)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.best = int(state["epoch"]), float(state["best"])
        self.step = int(state.get("step", 0))
        self._epoch_time = float(state.get("epoch_time", 0.0))
        sums = state.get("epoch_sums")
        if sums is None:
            self._epoch_sums = None
        elif sums.shape[0] == self.world_size:
            self._epoch_sums = sums[self.rank].clone().to(self.device)
        else:   # another world size: rank 0 carries the total (the epoch's mean loss is the same)
            self._epoch_sums = (sums.sum(0) if self.is_main else torch.zeros_like(sums[0])).to(self.device)
        self.history = copy.deepcopy(list(state["history"]))
        set_rng_state(state["rng"], self.device)
        if self.memory is not None:   # a checkpoint without one (memory off then): start empty
            self.memory = CrossBatchMemory(self.memory.capacity)
            if state.get("memory") is not None:
                try:
                    self.memory.load_state_dict(state["memory"])
                except ValueError as err:
                    raise CheckpointError(f"{self.resumed_from or 'the checkpoint'}: {err}") from None

    def _restore(self, ckpt: Dict) -> None:
        if int(ckpt.get("step", 0)):   # inside an epoch: the data order must be the same
            saved = ckpt["config"]["train"]
            diff = [f"train.{k} {saved[k]!r} -> {getattr(self.cfg.train, k)!r}" for k in _ORDER_KEYS
                    if saved.get(k) != getattr(self.cfg.train, k)]
            if ckpt.get("n_train") != len(self.train_ds):
                diff.append(f"training captions {ckpt.get('n_train')} -> {len(self.train_ds)}")
            if diff:
                raise CheckpointError(f"{self.resumed_from} stopped inside an epoch; resuming it needs the "
                                      f"same data order, but {', '.join(diff)}")
        self.load_state_dict(ckpt)
        at = f"epoch {self.epoch + 1}, step {self.step}" if self.step else f"the end of epoch {self.epoch}"
        self.log(f"resumed from {self.resumed_from} at {at}")

    def _write_run_files(self) -> None:
        """At the start of fit (rank 0): config.json, and metrics.jsonl holding exactly the
        lines of the epochs the state has seen: a resumed run drops the lines a stopped run
        wrote after its checkpoint, and never duplicates one."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2))
        path = self.out_dir / "metrics.jsonl"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.history))
        os.replace(tmp, path)

    def _append_metrics(self, record: Dict) -> None:
        with (self.out_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
