"""Stopping on a signal. SIGTERM and SIGUSR1 (what schedulers send before a kill) set a flag;
after the current optimizer step the ranks agree on it (an all-reduce), write last.pt, log one
line and :meth:`~fastrank.train.Trainer.fit` raises :class:`TrainingInterrupted`
(``fastrank train`` exits with 128 + the signal number: 143 for SIGTERM, 138 for SIGUSR1)."""
from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Optional, Tuple

import torch
import torch.distributed as dist

__all__ = ["STOP_SIGNALS", "TrainingInterrupted", "StopSignals"]

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")


class TrainingInterrupted(Exception):
    """Raised by :meth:`Trainer.fit` after a stop signal (SIGTERM, SIGUSR1): the current step
    finished and ``checkpoint`` (last.pt, or None with ``train.checkpoint = false``) was written.
    ``exit_code`` = 128 + ``signum`` (the shell's convention: 143 for SIGTERM)."""

    def __init__(self, signum: int, checkpoint: Optional[Path], message: str):
        super().__init__(message)
        self.signum = int(signum)
        self.checkpoint = checkpoint

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopSignals:
    """The trainer's part that handles stop signals: the handlers, the flag they set
    (``_stop_signal``), the ranks' agreement on it, and the stop itself. The trainer provides
    ``cfg``, ``world_size``, ``device``, ``epoch``, ``step``, ``log`` and ``_save_last``."""

    def _agreed(self, stop: int, timed: bool) -> Tuple[int, bool]:
        """(stop signal, time-triggered save) agreed by all ranks (max over ranks)."""
        if self.world_size == 1:
            return stop, timed
        flags = torch.tensor([stop, int(timed)], dtype=torch.int64, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, timed = flags.tolist()
        return int(stop), bool(timed)

    def _stop(self, signum: int, n_steps: Optional[int] = None) -> None:
        """Write last.pt (when checkpoints are on), log one line, raise TrainingInterrupted."""
        path = self._save_last() if self.cfg.train.checkpoint else None
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        where = (f"epoch {self.epoch + 1}, step {self.step}/{n_steps}" if n_steps is not None
                 else f"the end of epoch {self.epoch}")
        saved = f"wrote {path}; continue with --resume" if path is not None else \
            "no checkpoint written (train.checkpoint = false)"
        msg = f"stopped by {name} at {where}: {saved} (exit status {128 + signum})"
        self.log(msg)
        raise TrainingInterrupted(signum, path, msg)

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = int(signum)

    @contextlib.contextmanager
    def _stop_signals_handled(self):
        """SIGTERM / SIGUSR1 set the stop flag inside the block (main thread only: elsewhere
        signal handlers cannot be installed); the old handlers are restored after it."""
        old = {}
        if threading.current_thread() is threading.main_thread():
            for name in STOP_SIGNALS:
                sig = getattr(signal, name, None)
                if sig is not None:
                    old[sig] = signal.signal(sig, self._on_signal)
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
