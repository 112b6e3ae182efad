"""smooth_ndcg_loss: Python -> one fused op -> kernels (docs/spec.md §2.1, 2.1a; Listwise ITR, Eq. 16-21).

One native call = one forward op ``fastrank::smooth_ndcg`` (every requested direction,
the IDCG and the reduction inside the kernels; csrc/cpu/smooth_ndcg.cpp,
csrc/cuda/smooth_ndcg.cu) and one backward op ``fastrank::smooth_ndcg_backward``. The
t2i direction reads sim, relevance and mask through swapped strides. The forward returns
(loss, ws): ws holds what the backward needs (csrc/include/fastrank/smooth_ndcg.h).
Eagerly the call goes through an autograd.Function (the cheapest path); under
torch.compile through the custom ops (registered fake + autograd), both made by
src/fastrank/ops/_native_op.py from ``_forward`` / ``_backward``.
"""
from __future__ import annotations

from typing import List, Optional, Union

from torch import Tensor

from .. import _validation as V
from .._native import acc_dtype, has_native, query_count, smooth_rank_ws_numel, variant_codes
from .._reduce import directions, orient, reduce
from ..reference.smooth_ndcg import smooth_ndcg_per_query
from ..topk import TopKRelevance
from . import _smooth_rank
from . import _contract as C
from ._floor import PASSES, pair_count, rw_bytes
from ._launch import (DIRECTION_CODE, REDUCTION_CODE, cuda_kernels, dense_from_lists, kernel, mask_args, mat,
                      module_for, graded_relevance, relevance_args)
from ._module import ModuleForm
from ._native_op import NativeOp
from ._row import Loss


# the fields of SmoothNdcgForward / SmoothNdcgBackward (smooth_ndcg.h), in order
_FORWARD = kernel("smooth_ndcg_forward",
                  "lists rel_dt sim rel mask rel_i2t rel_t2i version paths tau with_grad out ws partials")
_BACKWARD = kernel("smooth_ndcg_backward", "lists version sim mask tau grad_out ws grad")


def _forward(sim: Tensor, relevance: Optional[Tensor], mask: Optional[Tensor], lists: List[Tensor],
             tau: float, direction: int, reduction: int, version: int, paths: int, with_grad: bool = True):
    """relevance: the (N, M) matrix, or None and ``lists`` (a TopKRelevance's rows and columns as
    the kernels read them: offsets, index and values of each, ``relevance_lists``). version,
    paths: the kernel variant's codes (``fastrank.kernel_variant``). sim: as its kernels read it
    (``NativeOp`` converts it once)."""
    s = sim
    acc = acc_dtype(s.dtype)
    n, m = s.shape
    cuda = cuda_kernels(s)
    if relevance is None and cuda and version == 1:
        relevance = dense_from_lists(lists, n, m)  # CUDA version 1 reads the matrix only (smooth_ndcg.h)
    # relevance in sim's dtype or the accumulation type (never rounded to half precision); lists
    # are read as they are by the CPU kernels and CUDA version 2: the (n, m) matrix is never made
    rel_dt, rel, rel_lists, _held = relevance_args(s, relevance, lists)
    out = s.new_empty((query_count(n, m, direction),) if reduction == 0 else (), dtype=acc)
    ws = s.new_empty((smooth_rank_ws_numel(n, m, direction),), dtype=acc)
    part = s.new_empty((module_for(s).smooth_ndcg_partials_numel(n, m, direction),), dtype=acc) if cuda else None
    _FORWARD(s, n, m, direction, reduction, rel_dt, *mat(s), *rel, *mask_args(mask), *rel_lists, version, paths, tau,
             int(with_grad), out.data_ptr(), ws.data_ptr(), 0 if part is None else part.data_ptr())
    return out, ws


def _backward(grad_out: Tensor, sim: Tensor, mask: Optional[Tensor], ws: Tensor, tau: float,
              direction: int, reduction: int, version: int) -> Tensor:
    # CUDA version 1's backward runs the pair pass over sim; the others are elementwise over ws
    return _smooth_rank.backward_call(_BACKWARD, grad_out, sim, ws, direction, reduction,
                                      lambda s: (version, *mat(s), *mask_args(mask), tau))


def _fake_forward(sim, relevance, mask, lists, tau, direction, reduction, version, paths):
    return _smooth_rank.fake_forward(sim, direction, reduction)


# the custom ops fastrank::smooth_ndcg -> (loss, ws) and fastrank::smooth_ndcg_backward,
# the eager autograd.Function and the switch between them: src/fastrank/ops/_native_op.py
SMOOTH_NDCG = NativeOp("smooth_ndcg", _forward, ("loss", "ws"), _fake_forward, _backward)
smooth_ndcg_op = SMOOTH_NDCG.op
smooth_ndcg_backward_op = SMOOTH_NDCG.backward.op


def floor(mode: str, size: dict, itemsize: int) -> dict:
    """The benchmarks' floor (src/fastrank/ops/_floor.py): one exp per unordered pair per pass
    (sigma(-x) = 1 - sigma(x)); the forward is one pass, the backward one more (it needs the
    finished DCG)."""
    n, m = size["n"], size["m"]
    return {"bytes": rw_bytes(mode, n, m, itemsize), "exp": PASSES[mode] * pair_count(n, m)}


# ---------------------------------------------------------------- public API
def _reference(sim: Tensor, relevance, tau: float, direction: str, reduction: str,
               mask: Optional[Tensor]) -> Tensor:
    """The pure-PyTorch path (src/fastrank/reference/smooth_ndcg.py), same contract (a
    TopKRelevance as its (N, M) matrix)."""
    acc = acc_dtype(sim.dtype)
    if isinstance(relevance, TopKRelevance):
        relevance = relevance.to_dense(acc)
    s, r = sim.to(acc), relevance.detach().to(acc)
    parts = [smooth_ndcg_per_query(orient(s, d), orient(r, d), tau, orient(mask, d))
             for d in directions(direction)]
    if mask is None or reduction != "mean":
        return reduce(parts, reduction)
    # docs/spec.md §2.1a: the mean over the lists with at least one valid item (0 if none has)
    counts = [orient(mask, d).any(dim=1).sum().clamp(min=1) for d in directions(direction)]
    return sum(p.sum() / c for p, c in zip(parts, counts))


def _check_hyper(tau, direction, reduction):
    """The hyper-parameters as the op uses them, or the error that names the bad one."""
    return V.check_positive(tau, "tau"), V.check_direction(direction), V.check_reduction(reduction)


def smooth_ndcg_loss(sim: Tensor, relevance: Union[Tensor, TopKRelevance], tau: float = 0.01,
                     direction: str = "both", reduction: str = "mean", impl: str = "auto",
                     mask: Optional[Tensor] = None) -> Tensor:
    """Smooth-NDCG listwise loss (docs/spec.md §2.1, 2.1a, 2.1b; Listwise ITR, Eq. 16-21).

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        relevance: (N, M) graded relevance >= 0 (2^r - 1 gains; in [0, 1] from
            fastrank.relevance), or a :class:`fastrank.TopKRelevance` (each row's k best
            entries, the rest 0: never expanded to (N, M)); no gradient flows to it. A list
            whose items are mostly of gain 0 costs O(M * k), not O(M^2) (docs/spec.md §2.1b).
        tau: temperature of the sigmoid that smooths the rank (a real number > 0).
        direction: "i2t" (rank each row), "t2i" (each column) or "both" (their sum).
        reduction: "mean" (over the lists of each direction, directions summed), "sum",
            or "none" (per-query losses, the N i2t queries first then the M t2i).
        impl: "auto", "native" or "reference".
        mask: optional bool (N, M), True = the item is in the list (lists of different
            lengths): row i's i2t list is {j : mask[i, j]}, column j's t2i list is
            {i : mask[i, j]}. A masked entry takes part in no rank, gain, pair or IDCG and
            its gradient is exactly 0. A list with no valid item (or all gains 0) has loss
            0; "mean" averages over the lists with at least one valid item (0 if none).

    Returns the loss in float32 (float64 for float64 sim): a scalar, or (Q,) for "none".
    The native path is one fused forward and one fused backward for both directions,
    with no host synchronisation on CUDA.

    Bad input (docs/spec.md §1): the structure of every argument is checked first, then the
    values in one pass per tensor, where the value check is on (CPU by default, CUDA only
    with ``FASTRANK_CHECK_FINITE=1``): NaN/inf in sim or relevance, or a negative
    relevance (every entry, masked ones included), raise ValueError.
    """
    return _smooth_ndcg_loss(_check_hyper, sim, relevance, tau, direction, reduction, impl, mask)


def _smooth_ndcg_loss(check_hyper, sim, relevance, tau, direction, reduction, impl, mask):
    """smooth_ndcg_loss with its hyper-parameters checked by ``check_hyper``: the op's own, or, for
    its module form, none (the module checked them when they were set)."""
    _, (tau, direction, reduction), impl = V.check_graded_inputs(
        sim, relevance, mask, impl, check_hyper, (tau, direction, reduction), relevance_min=0.0,
        loss="smooth_ndcg_loss")
    if not has_native(sim.device, impl, "smooth_ndcg_loss"):
        return _reference(sim, relevance, tau, direction, reduction, mask)
    rel, lists = graded_relevance(sim, relevance, direction)
    return SMOOTH_NDCG(sim, rel, mask, lists, tau, DIRECTION_CODE[direction], REDUCTION_CODE[reduction],
                       *variant_codes())


class SmoothNDCGLoss(ModuleForm, functional=smooth_ndcg_loss, inputs=("sim", "relevance", "mask"),
                     check=_check_hyper, checked=_smooth_ndcg_loss):
    """Module form of :func:`fastrank.smooth_ndcg_loss`:
    ``loss = SmoothNDCGLoss()(sim, relevance)`` or ``(sim, relevance, mask=mask)``."""


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
CONTRACT = C.glue_contract(
    SMOOTH_NDCG, lambda x, h: (x["sim"], *C.graded(x, h), h["tau"], *C.codes(h), *variant_codes()),
    C.graded_examples({"tau": 0.3}, "t2i", {"tau": 0.5}),
    C.TENSOR_CASES + C.RELEVANCE_CASES + C.MASK_CASES + C.HYPER_CASES + (
        C.BadInput("negative relevance", ValueError, "relevance", inputs=lambda x: {"relevance": x["relevance"] - 1}),
        C.BadInput("tau = 0", ValueError, "tau", hyper={"tau": 0.0})))


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("smooth_ndcg", smooth_ndcg_loss, SmoothNDCGLoss, CONTRACT, floor=floor,
             compat=("open_clip", "sentence_transformers")),)
