"""Input validation shared by every public function (SPEC.md section 1).

Validation happens here, once, in Python: a kernel never sees an unchecked shape,
device, dtype or stride. Every error names the argument and what was expected.
"""
from __future__ import annotations

import math
import os
from typing import Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DIRECTIONS = ("i2t", "t2i", "both")
REDUCTIONS = ("mean", "sum", "none")
IMPLS = ("auto", "native", "reference")


def _compiling() -> bool:
    return torch.compiler.is_compiling()


_check_finite_override: Optional[bool] = None


def set_check_finite(enabled: Optional[bool]) -> None:
    """The Python switch for the value checks of SPEC.md section 1 (the equivalent of
    ``FASTRANK_CHECK_FINITE``): True raises on NaN/inf on every device, False never
    checks, None (the default) restores the environment variable's or the built-in rule."""
    global _check_finite_override
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True, False or None, got {enabled!r}")
    _check_finite_override = enabled


def check_finite_enabled(device: Optional[torch.device] = None) -> bool:
    """Whether to read the data to check for NaN/inf (SPEC.md section 1).

    A value check reads the data: on CUDA that synchronises the stream with the host and
    breaks CUDA-graph capture, and torch.compile cannot trace it. So it is skipped under
    compile; otherwise ``set_check_finite`` decides, else ``FASTRANK_CHECK_FINITE`` (1 = on
    everywhere, 0 = off everywhere), else the default: on for CPU tensors (or device None),
    off for CUDA, where the kernels propagate NaN/inf into the loss and gradient instead."""
    if _compiling():
        return False
    if _check_finite_override is not None:
        return _check_finite_override
    env = os.environ.get("FASTRANK_CHECK_FINITE", "")
    if env == "1":
        return True
    if env == "0":
        return False
    return device is None or device.type != "cuda"


def check_tensor(x, name: str, ndim: Optional[int] = None, *, float_only: bool = True,
                 finite: bool = True, allow_empty: bool = False) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if float_only and x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating tensor (float32, float64, float16 or bfloat16), got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be a {ndim}-D tensor, got shape {tuple(x.shape)}")
    if not allow_empty and x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    if finite and float_only and check_finite_enabled(x.device) and not all_finite(x):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def all_finite(x: torch.Tensor) -> bool:
    """Whether a floating tensor holds no NaN and no +-inf: one pass (torch.aminmax, which
    propagates NaN) and two scalar reads. ``torch.isfinite(x).all()`` makes four passes and
    a bool tensor of x's size: on one CPU thread 0.73 ms against 0.04 ms for a 512 x 512
    float32 matrix, 11 us against 3 us for 4 x 4. Reads the data: a host sync on CUDA."""
    if x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x.detach())
    return abs(float(lo)) < math.inf and abs(float(hi)) < math.inf


def check_sim(sim) -> torch.Tensor:
    return check_tensor(sim, "sim", 2)


def check_like(x, name: str, ref: torch.Tensor, ref_name: str = "sim") -> torch.Tensor:
    """x must be a float tensor of ref's shape on ref's device."""
    check_tensor(x, name, ref.dim())
    if x.shape != ref.shape:
        raise ValueError(
            f"{name} must have the same shape as {ref_name} {tuple(ref.shape)}, got {tuple(x.shape)}")
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}")
    return x


def check_relevance(relevance, sim: torch.Tensor) -> torch.Tensor:
    return check_like(relevance, "relevance", sim)


def check_mask(mask, sim: torch.Tensor) -> Optional[torch.Tensor]:
    """Optional bool (N, M) list-membership mask of SPEC.md 2.1a (True = in the list).
    Metadata only: no value is read, so this never synchronises a CUDA stream."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must have dtype torch.bool, got {mask.dtype}")
    if mask.shape != sim.shape:
        raise ValueError(f"mask must have the same shape as sim {tuple(sim.shape)}, got {tuple(mask.shape)}")
    if mask.device != sim.device:
        raise ValueError(f"mask is on {mask.device} but sim is on {sim.device}")
    return mask


def check_positives(positives, sim: torch.Tensor) -> torch.Tensor:
    """Returns the bool (N, M) ground-truth mask; None means the diagonal (needs N == M)."""
    n, m = sim.shape
    if positives is None:
        if n != m:
            raise ValueError(
                f"positives=None means the diagonal, which needs a square sim; got sim of shape "
                f"{(n, m)}: pass positives as a bool tensor of that shape")
        return torch.eye(n, dtype=torch.bool, device=sim.device)
    if not isinstance(positives, torch.Tensor):
        raise TypeError(f"positives must be a bool torch.Tensor, got {type(positives).__name__}")
    if positives.dtype != torch.bool:
        raise TypeError(f"positives must have dtype torch.bool, got {positives.dtype}")
    if positives.shape != sim.shape:
        raise ValueError(
            f"positives must have the same shape as sim {tuple(sim.shape)}, got {tuple(positives.shape)}")
    if positives.device != sim.device:
        raise ValueError(f"positives is on {positives.device} but sim is on {sim.device}")
    return positives


def check_choice(value, name: str, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_direction(direction) -> str:
    return check_choice(direction, "direction", DIRECTIONS)


def check_reduction(reduction) -> str:
    return check_choice(reduction, "reduction", REDUCTIONS)


def check_impl(impl) -> str:
    if impl == "auto":
        impl = os.environ.get("FASTRANK_IMPL", "auto") or "auto"
        if impl not in IMPLS:
            raise ValueError(f"environment variable FASTRANK_IMPL must be one of {IMPLS}, got {impl!r}")
        return impl
    return check_choice(impl, "impl", IMPLS)


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_positive(value, name: str) -> float:
    """A finite real number > 0 (tau, gamma, ...)."""
    if not _is_real(value) or not (value > 0) or value != value or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_nonnegative(value, name: str) -> float:
    if not _is_real(value) or not (value >= 0) or value == float("inf"):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_real(value, name: str) -> float:
    if not _is_real(value) or value != value or abs(value) == float("inf"):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_pair(value, name: str, check=check_positive):
    """A 2-tuple of numbers, e.g. gamma=(gamma1, gamma2)."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name} must be a pair of numbers, got {value!r}")
    return tuple(check(v, f"{name}[{i}]") for i, v in enumerate(value))


def check_interval(value, name: str):
    """A pair (lo, hi) of finite numbers with lo < hi, e.g. label_range=(0.0, 1.0)."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name} must be a pair (lo, hi) of numbers, got {value!r}")
    lo, hi = (check_real(v, f"{name}[{i}]") for i, v in enumerate(value))
    if not lo < hi:
        raise ValueError(f"{name} must satisfy lo < hi, got {value!r}")
    return lo, hi
