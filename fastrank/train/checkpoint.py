"""Checkpoints: written atomically (temp file in the same directory, fsync, ``os.replace``),
so a crash mid-write never leaves a truncated ``last.pt``; RNG states for exact resume."""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch

__all__ = ["save_atomic", "load_checkpoint", "rng_state", "set_rng_state"]


def save_atomic(obj: Any, path) -> Path:
    """``torch.save(obj, path)`` through a temporary file in path's directory and
    ``os.replace``: readers see the old file or the new one, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def load_checkpoint(path, map_location="cpu") -> Dict[str, Any]:
    """Read a checkpoint written by the trainer (a dict); FileNotFoundError naming the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    # our own files: they hold numpy RNG states and the config, so not weights_only
    return torch.load(path, map_location=map_location, weights_only=False)


def rng_state() -> Dict[str, Any]:
    """Python, numpy, torch CPU and CUDA RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
