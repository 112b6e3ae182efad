"""smooth_ap_loss: Smooth-AP (docs/spec.md §2.8; Brown et al., ECCV 2020), binary relevance.

Smooth-AP is built on the smooth rank of smooth-NDCG (docs/spec.md §2.1): per query, each
positive's rank among the whole list, R_all, and among the positives, R_pos. One engine
serves the three smooth-rank losses (smooth_ndcg, smooth_ap, recall_at_k).

Native path: one fused forward (every requested direction, the reduction and each query's
gradient row, O(|P| * M) pair work per query) and one elementwise backward
(csrc/cpu/smooth_ap.cpp, csrc/cuda/smooth_ap.cu, src/fastrank/ops/_smooth_rank.py); the
pure-PyTorch reference is src/fastrank/reference/smooth_ap.py.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .. import _validation as V
from .._native import acc_dtype, variant_codes
from .._reduce import per_positive_query
from ..reference.smooth_ap import smooth_ap_per_query
from . import _smooth_rank as SR
from . import _contract as C
from ._launch import DIRECTION_CODE, REDUCTION_CODE, kernel
from ._module import ModuleForm
from ._native_op import NativeOp
from ._row import Loss


# ---------------------------------------------------------------- native: one fused op
# One forward kernel call (every requested direction, the reduction, each query's gradient
# row) and one elementwise backward: src/fastrank/ops/_smooth_rank.py. The custom op
# fastrank::smooth_ap, the eager Function and the switch: src/fastrank/ops/_native_op.py.
_FORWARD = kernel("smooth_ap_forward", SR.FORWARD_FIELDS)


def _forward(sim: Tensor, positives: Tensor, mask: Optional[Tensor], tau: float, direction: int, reduction: int,
             version: int, with_grad: bool = True):
    """(loss, ws): loss is () for mean/sum, (Q,) per-query losses (i2t first) for none; ws
    (accumulation dtype) is what the backward needs. version: the CUDA kernels'."""
    return SR.forward(_FORWARD, sim, positives, mask, (), tau, direction, reduction, version, with_grad)


def _fake_forward(sim, positives, mask, tau, direction, reduction, version):
    return SR.fake_forward(sim, direction, reduction)


SMOOTH_AP = NativeOp("smooth_ap", _forward, ("loss", "ws"), _fake_forward, SR.BACKWARD)
smooth_ap_op = SMOOTH_AP.op


# ---------------------------------------------------------------- reference
def _reference(sim: Tensor, positives: Tensor, tau: float, direction: str, reduction: str,
               mask: Optional[Tensor]) -> Tensor:
    """The pure-PyTorch path (src/fastrank/reference/smooth_ap.py), same contract."""
    # docs/spec.md §2.8: "mean" is over the queries with at least one positive in their list
    return per_positive_query(direction, reduction, lambda s, pos, m: smooth_ap_per_query(s, pos, tau, m),
                              sim.to(acc_dtype(sim.dtype)), positives, mask)


# ---------------------------------------------------------------- public API
def _check_hyper(tau, direction, reduction):
    """The hyper-parameters as the op uses them, or the error that names the bad one."""
    return V.check_positive(tau, "tau"), V.check_direction(direction), V.check_reduction(reduction)


def smooth_ap_loss(sim: Tensor, positives: Optional[Tensor] = None, tau: float = 0.01, direction: str = "both",
                   reduction: str = "mean", impl: str = "auto", mask: Optional[Tensor] = None) -> Tensor:
    """Smooth-AP loss, 1 - smoothed average precision per query (docs/spec.md §2.8; Brown et al.,
    "Smooth-AP", ECCV 2020).

    Per query (row i for i2t, column j for t2i) with list L and positives P in L:
    R_all(j) = 1 + sum_{k in L, k != j} sigma((s_k - s_j) / tau), R_pos(j) the same over P,
    AP = mean over j in P of R_pos(j) / R_all(j), loss = 1 - AP.

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        positives: bool (N, M) ground-truth matches; None = the diagonal (needs N == M).
        tau: temperature of the sigmoid that smooths the rank (> 0).
        direction: "i2t" (rank each row), "t2i" (each column) or "both" (their sum).
        reduction: "mean" (over the queries of each direction that have at least one
            positive in their list, directions summed; 0 if none has), "sum", or "none"
            (per-query losses, the N i2t queries first then the M t2i).
        impl: "auto", "native" or "reference".
        mask: optional bool (N, M), True = the item is in the list (docs/spec.md §2.1a): row i's
            i2t list is {j : mask[i, j]}, column j's t2i list is {i : mask[i, j]}. A masked
            entry is in no rank and no positive set and its gradient is exactly 0.

    A query with no positive in its list has loss 0 and does not count in "mean".
    Returns the loss in float32 (float64 for float64 sim; half inputs are computed in
    float32): a scalar, or (Q,) for "none".
    """
    return _smooth_ap_loss(_check_hyper, sim, positives, tau, direction, reduction, impl, mask)


def _smooth_ap_loss(check_hyper, sim, positives, tau, direction, reduction, impl, mask):
    """smooth_ap_loss with its hyper-parameters checked by ``check_hyper``: the op's own, or, for
    its module form, none (the module checked them when they were set)."""
    positives, (tau, direction, reduction), native = SR.checked_inputs(
        sim, positives, mask, impl, "smooth_ap_loss", check_hyper, tau, direction, reduction)
    if native:
        return SMOOTH_AP(sim, positives, mask, tau, DIRECTION_CODE[direction], REDUCTION_CODE[reduction],
                         variant_codes()[0])
    return _reference(sim, positives, tau, direction, reduction, mask)


class SmoothAPLoss(ModuleForm, functional=smooth_ap_loss, inputs=("sim", "positives", "mask"),
                   check=_check_hyper, checked=_smooth_ap_loss):
    """Module form of :func:`fastrank.smooth_ap_loss`:
    ``loss = SmoothAPLoss()(sim)``, ``(sim, positives)`` or ``(sim, positives, mask=mask)``."""


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
CONTRACT = C.glue_contract(
    SMOOTH_AP, lambda x, h: (x["sim"], x["positives"], x.get("mask"), h["tau"], *C.codes(h), variant_codes()[0]),
    C.subset_examples({}),
    C.TENSOR_CASES + C.POSITIVES_CASES + C.MASK_CASES + C.HYPER_CASES + (
        C.BadInput("tau < 0", ValueError, "tau", hyper={"tau": -1.0}),))


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("smooth_ap", smooth_ap_loss, SmoothAPLoss, CONTRACT, floor=SR.floor, compat=("sentence_transformers",)),)
