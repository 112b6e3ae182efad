"""Checkpoints: written atomically (temp file in the same directory, fsync, ``os.replace``),
so a crash mid-write never leaves a truncated file; read with ``torch.load(weights_only=True)``
(a checkpoint is data: tensors, numbers, strings, lists and dicts, never pickled code), so the
RNG states are stored as tensors and plain types (:func:`rng_state`)."""
from __future__ import annotations

import contextlib
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

__all__ = ["save_atomic", "link_atomic", "load_checkpoint", "rng_state", "set_rng_state",
           "CheckpointError", "CheckpointNotFoundError"]


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used (not a fastrank checkpoint, wrong kind, unreadable);
    the message names the file."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The named checkpoint file does not exist."""


def _tmp_in(path: Path) -> str:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return tmp


@contextlib.contextmanager
def _removed_on_error(tmp: str):
    """Remove the temporary file ``tmp`` if the block fails, then re-raise: an interrupted
    write never leaves a partial file behind."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _publish(tmp: str, path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)   # mkstemp creates 0600; give the usual file mode
    os.replace(tmp, path)


def save_atomic(obj: Any, path) -> Path:
    """``torch.save(obj, path)`` through a temporary file in path's directory and
    ``os.replace``: readers see the old file or the new one, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with _removed_on_error(tmp):
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, path)
    return path


def link_atomic(src, path) -> Path:
    """Make ``path`` the same file as ``src`` (a hard link, or a copy where the file system has
    none), replacing ``path`` atomically."""
    src, path = Path(src), Path(path)
    tmp = _tmp_in(path)
    with _removed_on_error(tmp):
        os.unlink(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            import shutil
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        _publish(tmp, path)
    return path


def load_checkpoint(path, map_location="cpu", format: Optional[str] = None) -> Dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)``: no pickled code runs.

    CheckpointNotFoundError (a FileNotFoundError) when the file does not exist; CheckpointError
    naming the file when torch cannot read it as data, when it is not a dict, or (with
    ``format``) when its ``"format"`` entry differs."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:   # a foreign file fails in many ways (UnpicklingError, KeyError, EOFError, ...)
        first = type(err).__name__ + "".join(f": {ln}" for ln in str(err).strip().splitlines()[:1])
        raise CheckpointError(f"{path} is not a fastrank checkpoint (torch.load(weights_only=True) "
                              f"cannot read it: {first})") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} is not a fastrank checkpoint (it holds a {type(ckpt).__name__})")
    if format is not None and ckpt.get("format") != format:
        raise CheckpointError(f"{path} is not a fastrank trainer checkpoint (format "
                              f"{ckpt.get('format')!r}, expected {format!r})")
    return ckpt


def rng_state(device: Optional[torch.device] = None) -> Dict[str, Any]:
    """Python, numpy, torch CPU and (with a CUDA ``device``) that device's CUDA RNG states, as
    tensors and plain types (loadable with ``weights_only=True``)."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": {"version": int(version), "state": torch.tensor(mt, dtype=torch.int64),
                        "gauss": gauss},
             "numpy": {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if device is not None and torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Dict[str, Any], device: Optional[torch.device] = None) -> None:
    """Restore what :func:`rng_state` returned (the CUDA state onto ``device``)."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and device is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
