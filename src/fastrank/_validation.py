"""Input validation shared by every public function (docs/spec.md §1).

Validation happens here, once, in Python: a kernel never sees an unchecked shape,
device, dtype or stride. Every error names the argument and what was expected.

Order, in every public function: first what needs no read of tensor data (types, ranks,
shapes, dtypes, devices, then the hyper-parameters), then the values, in one pass per
tensor (:func:`check_data`). So a relevance on the wrong device gets "relevance is on X but
sim is on Y", never an error from inside a value check, and a value check never runs on a
tensor whose structure is wrong. The value checks (NaN/inf, and the relevance range of
docs/spec.md §1) follow :func:`check_finite_enabled`: on CPU by default, on CUDA only when
switched on (the default CUDA path never synchronises the stream).
"""
from __future__ import annotations

import math
import numbers
import os
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import torch

from ._native import device_type

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DIRECTIONS = ("i2t", "t2i", "both")
REDUCTIONS = ("mean", "sum", "none")
IMPLS = ("auto", "native", "reference")


def _compiling() -> bool:
    return torch.compiler.is_compiling()


_check_finite_override: Optional[bool] = None


def set_check_finite(enabled: Optional[bool]) -> None:
    """The Python switch for the value checks of docs/spec.md §1 (the equivalent of
    ``FASTRANK_CHECK_FINITE``): True raises on NaN/inf on every device, False never
    checks, None (the default) restores the environment variable's or the built-in rule."""
    global _check_finite_override
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True, False or None, got {enabled!r}")
    _check_finite_override = enabled


def check_finite_enabled(device: Optional[torch.device] = None) -> bool:
    """Whether to read the data to check for NaN/inf (docs/spec.md §1).

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
    return device is None or device_type(device) != "cuda"


def check_tensor(x, name: str, ndim: Optional[int] = None, *, float_only: bool = True,
                 finite: bool = True, allow_empty: bool = False) -> torch.Tensor:
    """A tensor argument: its structure (type, dtype, rank, not empty), then with ``finite``
    its values (:func:`check_finite`). A function taking several tensors checks the
    structure of all of them first (``finite=False``) and their values last."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if float_only and x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating tensor (float32, float64, float16 or bfloat16), got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be a {ndim}-D tensor, got shape {tuple(x.shape)}")
    if not allow_empty and x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    if finite and float_only:
        check_finite(x, name)
    return x


def check_embedding_pair(first, first_name: str, second, second_name: str, same_dtype: bool = False) -> None:
    """Two (rows, d) embedding matrices compared row against row: each a tensor (structure
    only, :func:`check_tensor`), ``second`` with ``first``'s embedding dimension and device
    (and dtype with ``same_dtype``); the error names ``second``."""
    check_tensor(first, first_name, 2, finite=False)
    check_tensor(second, second_name, 2, finite=False)
    if second.shape[1] != first.shape[1]:
        raise ValueError(f"{second_name} must have {first_name}'s embedding dimension {first.shape[1]}, "
                         f"got shape {tuple(second.shape)}")
    if second.device != first.device:
        raise ValueError(f"{second_name} is on {second.device} but {first_name} is on {first.device}")
    if same_dtype and second.dtype != first.dtype:
        raise TypeError(f"{second_name} must have {first_name}'s dtype {first.dtype}, got {second.dtype}")


def check_finite(x: torch.Tensor, name: str) -> torch.Tensor:
    """NaN/inf in a floating tensor raise ValueError where the value check is on for its
    device (:func:`check_finite_enabled`); one pass over the data."""
    if check_finite_enabled(x.device) and not all_finite(x):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def all_finite(x: torch.Tensor) -> bool:
    """Whether a floating tensor holds no NaN and no +-inf: one pass (torch.aminmax, which
    propagates NaN) and two scalar reads. ``torch.isfinite(x).all()`` makes four passes and
    a bool tensor of x's size: on one CPU thread 0.73 ms against 0.04 ms for a 512 x 512
    float32 matrix, 11 us against 3 us for 4 x 4. Reads the data: a host sync on CUDA."""
    if x.numel() == 0:
        return True
    lo, hi = value_range(x)
    return abs(lo) < math.inf and abs(hi) < math.inf


def value_range(x: torch.Tensor) -> Tuple[float, float]:
    """(min, max) of a non-empty tensor as Python numbers, NaN if it holds a NaN: one pass
    (torch.aminmax) and two scalar reads. Serves the NaN/inf check and the range checks
    together. Reads the data: a host sync on CUDA."""
    lo, hi = torch.aminmax(x.detach())
    return float(lo), float(hi)


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def check_relevance_values(relevance: torch.Tensor, *, minimum: Optional[float] = None,
                           label_range: Optional[Tuple[float, float]] = None, loss: str = "",
                           name: str = "relevance") -> torch.Tensor:
    """NaN/inf, and the relevance range of docs/spec.md §1, from one pass over the data (the
    caller has decided that the value check is on: :func:`check_data`).

    ``minimum``: the smallest allowed value (0 for losses whose gains 2^r - 1 need r >= 0);
    ``label_range``: (lo, hi), every value must lie in [lo, hi]. Every entry is read,
    masked ones included, as the NaN check does (the mask is not read: one pass)."""
    lo, hi = value_range(relevance)
    if not (abs(lo) < math.inf and abs(hi) < math.inf):
        raise ValueError(f"{name} contains NaN or infinite values")
    where = f" for {loss}" if loss else ""
    if minimum is not None and lo < minimum:
        raise ValueError(
            f"{name} must be >= {_fmt(minimum)}{where}, got a minimum of {_fmt(lo)}; graded relevance "
            f"lies in [0, 1] (1 = a match): map a cosine similarity c in [-1, 1] to (1 + c) / 2, as "
            f"fastrank.relevance does")
    if label_range is not None and (lo < label_range[0] or hi > label_range[1]):
        raise ValueError(
            f"{name} must lie in label_range [{_fmt(label_range[0])}, {_fmt(label_range[1])}]{where}, got "
            f"values in [{_fmt(lo)}, {_fmt(hi)}]; pass the label_range of your labels (e.g. (-1.0, 1.0)) "
            f"or map them into it")
    return relevance


def check_data(sim: torch.Tensor, relevance: Optional[torch.Tensor] = None, *,
               relevance_min: Optional[float] = None,
               label_range: Optional[Tuple[float, float]] = None, loss: str = "",
               sim_name: str = "sim", relevance_name: str = "relevance") -> None:
    """The value checks of a loss call, after every structure and hyper-parameter check:
    NaN/inf in ``sim``; NaN/inf and the range (``relevance_min`` / ``label_range``, docs/spec.md
    1) of ``relevance``. One pass per tensor, and none at all where the check is off (CUDA
    by default, torch.compile, ``FASTRANK_CHECK_FINITE=0``): no host sync there."""
    if not check_finite_enabled(sim.device):
        return
    if not all_finite(sim):
        raise ValueError(f"{sim_name} contains NaN or infinite values")
    if relevance is None:
        return
    if isinstance(relevance, torch.Tensor):
        check_relevance_values(relevance, minimum=relevance_min, label_range=label_range, loss=loss,
                               name=relevance_name)
    else:   # a TopKRelevance (docs/spec.md §2.1b)
        check_topk_values(relevance, minimum=relevance_min, loss=loss)


def check_sim(sim, *, values: bool = True) -> torch.Tensor:
    """sim: a non-empty 2-D float tensor; with ``values`` also its NaN/inf check. A
    function with more tensor arguments passes ``values=False`` and calls
    :func:`check_data` after checking them all."""
    return check_tensor(sim, "sim", 2, finite=values)


def check_like(x, name: str, ref: torch.Tensor, ref_name: str = "sim", *,
               values: bool = True) -> torch.Tensor:
    """x must be a float tensor of ref's shape on ref's device (structure first; with
    ``values`` its NaN/inf check last)."""
    check_tensor(x, name, ref.dim(), finite=False)
    if x.shape != ref.shape:
        raise ValueError(
            f"{name} must have the same shape as {ref_name} {tuple(ref.shape)}, got {tuple(x.shape)}")
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}")
    if values:
        check_finite(x, name)
    return x


def check_relevance(relevance, sim: torch.Tensor, *, values: bool = True) -> torch.Tensor:
    return check_like(relevance, "relevance", sim, values=values)


def check_topk_relevance(relevance, sim: torch.Tensor, shape: Optional[Tuple[int, int]] = None, like: str = "sim"):
    """A :class:`fastrank.TopKRelevance` for sim (docs/spec.md §2.1b), structure only: indices
    int64 (N, k), values float (N, k), num_columns = M, on sim's device (``shape``: (N, M), named
    ``like`` in the error, when sim is not that matrix: the embeddings whose similarities it is).
    Metadata only: no value is read (:func:`check_topk_values` reads them)."""
    from .topk import TopKRelevance
    if not isinstance(relevance, TopKRelevance):
        raise TypeError(f"relevance must be a fastrank.TopKRelevance (TopKRelevance.from_dense(matrix, k) makes "
                        f"one), got {type(relevance).__name__}")
    shape = tuple(sim.shape) if shape is None else tuple(shape)
    idx, val, m = relevance.indices, relevance.values, relevance.num_columns
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64:
        raise TypeError(f"relevance.indices must be an int64 torch.Tensor, got "
                        f"{idx.dtype if isinstance(idx, torch.Tensor) else type(idx).__name__}")
    check_tensor(val, "relevance.values", 2, finite=False, allow_empty=True)
    if idx.dim() != 2 or idx.shape != val.shape:
        raise ValueError(f"relevance.indices must be 2-D with the shape of relevance.values "
                         f"{tuple(val.shape)}, got {tuple(idx.shape)}")
    if idx.shape[0] != shape[0] or not isinstance(m, int) or m != shape[1]:
        raise ValueError(f"relevance must have the shape of {like} {shape}, got {idx.shape[0]} rows of "
                         f"{m!r} columns")
    for name, t in (("relevance.indices", idx), ("relevance.values", val)):
        if t.device != sim.device:
            raise ValueError(f"{name} is on {t.device} but {like} is on {sim.device}")
    return relevance


def check_topk_values(relevance, *, minimum: Optional[float] = None, loss: str = "",
                      names: Tuple[str, str] = ("relevance.indices", "relevance.values")) -> None:
    """The values of a :class:`fastrank.TopKRelevance` (the caller has decided the value check
    is on): indices in [-1, num_columns), no column twice in a row, values finite (and >=
    ``minimum``) where an entry is listed; the errors name ``names`` (the indices', the
    values'). Reads the data (a host sync on CUDA)."""
    idx, val, m = relevance.indices, relevance.values, relevance.num_columns
    if idx.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(idx))
    if lo < -1 or hi >= m:
        raise ValueError(f"{names[0]} must lie in [-1, {m}) (-1: no entry), got values in [{lo}, {hi}]")
    srt = torch.sort(idx, dim=1).values
    if bool(((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any()):
        raise ValueError(f"{names[0]} must not list a column twice in a row")
    listed = val[idx >= 0]
    if listed.numel():
        check_relevance_values(listed, minimum=minimum, loss=loss, name=names[1])


def check_graded_inputs(sim: torch.Tensor, relevance, mask, impl: str, check_hyper: Callable, hyper: tuple, *,
                        relevance_min: Optional[float] = None, loss: str = "") -> tuple:
    """The checks of a graded loss's call (smooth_ndcg_loss, kendall_loss), in docs/spec.md
    §1's order: the structure of sim, of the relevance (a matrix or a TopKRelevance) and of the
    mask, the hyper-parameters (``check_hyper(*hyper)``), impl, then the values. Returns
    (whether the relevance is a TopKRelevance, the checked hyper-parameters, impl)."""
    from .topk import TopKRelevance
    check_sim(sim, values=False)
    topk = isinstance(relevance, TopKRelevance)
    if topk:
        check_topk_relevance(relevance, sim)
    else:
        check_relevance(relevance, sim, values=False)
    check_mask(mask, sim)
    hyper = check_hyper(*hyper)
    impl = check_impl(impl)
    check_data(sim, relevance, relevance_min=relevance_min, loss=loss)
    return topk, hyper, impl


def check_mask(mask, sim: torch.Tensor) -> Optional[torch.Tensor]:
    """Optional bool (N, M) list-membership mask of docs/spec.md §2.1a (True = in the list).
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


# ------------------------------------------------------------------ hyper-parameters
# Hyper-parameters accept any real number (docs/spec.md §1): a Python int or float, a numpy
# scalar (or 0-d array), a 0-d tensor; each is taken as a Python number (a 0-d CUDA tensor
# is read once, which synchronises: pass a number on a hot path). Rejected only when out
# of range, or not a real number (bool, str, complex, a tensor with more than one element,
# ...): a ValueError naming the argument, the expected range and what was passed.

_REAL = "a real number (int, float, numpy scalar or 0-d tensor)"
_INTEGER = "int, numpy integer or 0-d integer tensor"


def _describe(value) -> str:
    """What a rejected value is, for an error message: its value and its type."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and value.device.type != "meta":
            return f"{value.item()!r} (a 0-d {value.dtype} tensor)"
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a numpy {value.dtype} array of shape {value.shape}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = type(value)
    module = "" if kind.__module__ == "builtins" else kind.__module__.split(".")[0] + "."
    return f"{text} ({module}{kind.__name__})"


def _show(value) -> str:
    """An out-of-range number: its repr, with its type when it is not a Python int or float."""
    return repr(value) if type(value) in (int, float) else _describe(value)


def as_real(value, name: str) -> float:
    """``value`` as a Python float if it is a real number (see above), else ValueError."""
    t = type(value)
    if t is float or t is int:
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be {_REAL}, got {_describe(value)}")
    if isinstance(value, numbers.Real):          # numpy integer and floating scalars, Fraction
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, torch.Tensor):
        if (value.dim() == 0 and value.device.type != "meta" and not value.dtype.is_complex
                and value.dtype != torch.bool):
            return float(value.item())
    elif isinstance(value, np.ndarray):
        if value.ndim == 0 and value.dtype.kind in "iuf":
            return float(value)
    raise ValueError(f"{name} must be {_REAL}, got {_describe(value)}")


def as_int(value, name: str, minimum: int = 1) -> int:
    """``value`` as a Python int if it is an integer (int, numpy integer, 0-d integer
    tensor or array), else ValueError."""
    t = type(value)
    if t is int:
        return value
    if isinstance(value, (bool, np.bool_)):
        pass
    elif isinstance(value, numbers.Integral):        # numpy integer scalars
        return int(value)
    elif isinstance(value, torch.Tensor):
        if (value.dim() == 0 and value.device.type != "meta" and not value.dtype.is_floating_point
                and not value.dtype.is_complex and value.dtype != torch.bool):
            return int(value.item())
    elif isinstance(value, np.ndarray):
        if value.ndim == 0 and value.dtype.kind in "iu":
            return int(value)
    raise ValueError(f"{name} must be an integer >= {minimum} ({_INTEGER}), got {_describe(value)}")


def check_positive(value, name: str) -> float:
    """A finite real number > 0 (tau, gamma, ...)."""
    if type(value) is float and 0.0 < value < math.inf:   # the usual call, kept cheap
        return value
    x = as_real(value, name)
    if not 0.0 < x < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {_show(value)}")
    return x


def check_nonnegative(value, name: str) -> float:
    """A finite real number >= 0 (margin, alpha, weights, ...)."""
    if type(value) is float and 0.0 <= value < math.inf:
        return value
    x = as_real(value, name)
    if not 0.0 <= x < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0, got {_show(value)}")
    return x


def check_real(value, name: str) -> float:
    """A finite real number (thresholds, the ends of a label range, ...)."""
    if type(value) is float and abs(value) < math.inf:
        return value
    x = as_real(value, name)
    if not abs(x) < math.inf:
        raise ValueError(f"{name} must be a finite number, got {_show(value)}")
    return x


def check_int(value, name: str, minimum: int = 1) -> int:
    """An integer >= minimum (k, block, batch sizes, ...)."""
    k = as_int(value, name, minimum)
    if k < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {_show(value)}")
    return k


def _items(value) -> Optional[list]:
    """The elements of a tuple, list, range, 1-D numpy array or 1-D tensor; None for anything
    else (a number, a string, ...)."""
    if isinstance(value, (tuple, list, range)):
        return list(value)
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return list(value)
    if isinstance(value, torch.Tensor) and value.dim() == 1:
        return list(value.unbind(0))
    return None


def check_sequence(value, name: str, check: Callable = None, *, length: Optional[int] = None,
                   scalar: bool = False, nonempty: bool = True) -> tuple:
    """A tuple of hyper-parameters, each checked by ``check(v, f"{name}[i]")`` (default
    :func:`check_positive`), e.g. ``ks=(1, 2, 4, 8, 16)`` with a :func:`check_int`.

    ``value`` may be a tuple, list, range, 1-D numpy array or 1-D tensor; with ``scalar``
    also one number, which stands for all (``length`` copies of it when ``length`` is given,
    else a 1-tuple): ``tau_k=1.0`` or one per k. ``length`` (when given) is the required
    number of entries; ``nonempty`` rejects an empty sequence."""
    check = check_positive if check is None else check
    items = _items(value)
    if items is None:
        if scalar and not isinstance(value, (str, bytes)):
            one = check(value, name)
            return (one,) * (length if length is not None else 1)
        what = "a number or a sequence of numbers" if scalar else "a tuple or list of numbers"
        raise ValueError(f"{name} must be {what}, got {_describe(value)}")
    if nonempty and not items:
        raise ValueError(f"{name} must not be empty")
    if length is not None and len(items) != length:
        raise ValueError(f"{name} must have {length} entries" + (" (or be one number)" if scalar else "")
                         + f", got {len(items)}: {value!r}")
    return tuple(check(v, f"{name}[{i}]") for i, v in enumerate(items))


def check_pair(value, name: str, check=check_positive):
    """A 2-tuple of numbers, e.g. gamma=(gamma1, gamma2)."""
    items = _items(value)
    if items is None or len(items) != 2:
        raise ValueError(f"{name} must be a pair of numbers, got {_describe(value) if items is None else repr(value)}")
    return tuple(check(v, f"{name}[{i}]") for i, v in enumerate(items))


def check_interval(value, name: str):
    """A pair (lo, hi) of finite numbers with lo < hi, e.g. label_range=(0.0, 1.0)."""
    items = _items(value)
    if items is None or len(items) != 2:
        raise ValueError(f"{name} must be a pair (lo, hi) of numbers, got "
                         f"{_describe(value) if items is None else repr(value)}")
    lo, hi = (check_real(v, f"{name}[{i}]") for i, v in enumerate(items))
    if not lo < hi:
        raise ValueError(f"{name} must satisfy lo < hi, got {value!r}")
    return lo, hi


def check_id_vector(x, n: int, device: torch.device, name: str, what: str = "ids", one: str = "id") -> torch.Tensor:
    """A 1-D integer tensor of n ids (``what``: "class labels", "ids") on ``device``, one
    per embedding."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer {what}, got {type(x).__name__}")
    if x.dtype == torch.bool or x.dtype.is_floating_point or x.dtype.is_complex:
        raise TypeError(f"{name} must hold integer {what}, got {x.dtype}")
    if x.dim() != 1 or x.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) (one {one} per embedding), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but the embeddings are on {device}")
    return x
