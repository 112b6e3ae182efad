"""recall_at_k_loss: the Recall@k surrogate (docs/spec.md §2.9; Patel, Tolias, Matas, CVPR 2022).

Built on the same smooth rank as smooth_ndcg and smooth_ap (R_all of docs/spec.md §2.8), one
engine for the three losses. Native path: one fused forward (every requested direction,
the reduction and each query's gradient row, O(|P| * M) pair work per query) and smooth_ap's
elementwise backward (csrc/cpu/recall_at_k.cpp, csrc/cuda/recall_at_k.cu,
src/fastrank/ops/_smooth_rank.py); the pure-PyTorch reference is src/fastrank/reference/recall_at_k.py.
"""
from __future__ import annotations

import operator
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .. import _validation as V
from .._native import MAX_KS, acc_dtype, variant_codes
from .._reduce import per_positive_query
from ..reference.recall_at_k import recall_at_k_per_query
from . import _smooth_rank as SR
from . import _contract as C
from ._launch import DIRECTION_CODE, REDUCTION_CODE, kernel
from ._module import ModuleForm
from ._native_op import NativeOp
from ._row import Loss

DEFAULT_KS = (1, 2, 4, 8, 16)


# ---------------------------------------------------------------- hyper-parameters
def check_ks(ks) -> Tuple[int, ...]:
    """One positive int, or a non-empty tuple/list of them (numpy and 0-d integer tensors
    count as ints; bools and floats do not)."""
    items = ks if isinstance(ks, (tuple, list)) else (ks,)
    if not items:
        raise ValueError("ks must be a positive int or a non-empty sequence of positive ints, got an empty one")
    if MAX_KS is not None and len(items) > MAX_KS:
        raise ValueError(f"ks holds at most {MAX_KS} values (the kernels take them by value), got {len(items)}")
    out = []
    for k in items:
        try:
            if isinstance(k, bool) or (isinstance(k, Tensor) and k.dtype == torch.bool):
                raise TypeError
            v = operator.index(k)
        except TypeError:
            raise ValueError(f"ks must hold positive ints, got {k!r} in ks={ks!r}") from None
        if v < 1:
            raise ValueError(f"ks must hold positive ints (k >= 1), got {v} in ks={ks!r}")
        out.append(int(v))
    return tuple(out)


def check_tau_k(tau_k, n: int) -> Tuple[float, ...]:
    """One temperature (> 0) for every k, or a sequence of n of them."""
    if isinstance(tau_k, (tuple, list)):
        if len(tau_k) != n:
            raise ValueError(f"tau_k must be one number or one per k ({n} of them), got {len(tau_k)}: {tau_k!r}")
        return tuple(V.check_positive(t, f"tau_k[{i}]") for i, t in enumerate(tau_k))
    return (V.check_positive(tau_k, "tau_k"),) * n


# ---------------------------------------------------------------- native: one fused op
# One forward kernel call (every requested direction, the reduction, each query's gradient
# row) and smooth_ap's elementwise backward: src/fastrank/ops/_smooth_rank.py. The custom op
# fastrank::recall_at_k, the eager Function and the switch: src/fastrank/ops/_native_op.py.
_FORWARD = kernel("recall_at_k_forward", SR.FORWARD_FIELDS + " ks tk n_k")  # recall_at_k.h


def _forward(sim: Tensor, positives: Tensor, mask: Optional[Tensor], ks: list[float], tau_k: list[float],
             tau: float, direction: int, reduction: int, version: int, with_grad: bool = True):
    """(loss, ws): loss is () for mean/sum, (Q,) per-query losses (i2t first) for none; ws
    (accumulation dtype) is what the backward needs. version: the CUDA kernels'."""
    return SR.forward(_FORWARD, sim, positives, mask, (ks, tau_k, len(ks)), tau, direction, reduction, version,
                      with_grad)


def _fake_forward(sim, positives, mask, ks, tau_k, tau, direction, reduction, version):
    return SR.fake_forward(sim, direction, reduction)


RECALL_AT_K = NativeOp("recall_at_k", _forward, ("loss", "ws"), _fake_forward, SR.BACKWARD)
recall_at_k_op = RECALL_AT_K.op


# ---------------------------------------------------------------- reference
def _reference(sim: Tensor, positives: Tensor, ks: Tuple[int, ...], tau: float, tau_k: Tuple[float, ...],
               direction: str, reduction: str, mask: Optional[Tensor]) -> Tensor:
    """The pure-PyTorch path (src/fastrank/reference/recall_at_k.py), same contract."""
    # docs/spec.md §2.9: "mean" is over the queries with at least one positive in their list
    return per_positive_query(direction, reduction,
                              lambda s, pos, m: recall_at_k_per_query(s, pos, ks, tau, tau_k, m),
                              sim.to(acc_dtype(sim.dtype)), positives, mask)


# ---------------------------------------------------------------- public API
def _check_hyper(ks, tau, tau_k, direction, reduction):
    """The hyper-parameters as the op uses them, or the error that names the bad one."""
    ks = check_ks(ks)
    tau = V.check_positive(tau, "tau")
    tau_k = check_tau_k(tau_k, len(ks))
    return ks, tau, tau_k, V.check_direction(direction), V.check_reduction(reduction)


def recall_at_k_loss(sim: Tensor, positives: Optional[Tensor] = None,
                     ks: Union[int, Sequence[int]] = DEFAULT_KS, tau: float = 0.01,
                     tau_k: Union[float, Sequence[float]] = 1.0, direction: str = "both",
                     reduction: str = "mean", impl: str = "auto", mask: Optional[Tensor] = None) -> Tensor:
    """Recall@k surrogate loss, 1 - the mean over ks of a smooth recall at k (docs/spec.md §2.9;
    Patel, Tolias, Matas, "Recall@k Surrogate Loss with Large Batches and Similarity
    Mixup", CVPR 2022).

    Per query (row i for i2t, column j for t2i) with list L and positives P in L: the
    smooth rank r_j = 1 + sum_{k' in L, k' != j} sigma((s_k' - s_j) / tau) of each positive,
    R@k = min(k, sum_{j in P} sigma((k - r_j) / tau_k)) / min(k, |P|) for each k,
    loss = 1 - mean over ks of R@k.

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        positives: bool (N, M) ground-truth matches; None = the diagonal (needs N == M).
        ks: the k of each recall (a positive int, or a non-empty sequence of them).
        tau: temperature of the sigmoid that smooths the rank (> 0).
        tau_k: temperature of the sigmoid that smooths 1{r_j <= k} (> 0): one number, or
            one per k.
        direction: "i2t" (rank each row), "t2i" (each column) or "both" (their sum).
        reduction: "mean" (over the queries of each direction that have at least one
            positive in their list, directions summed; 0 if none has), "sum", or "none"
            (per-query losses, the N i2t queries first then the M t2i).
        impl: "auto", "native" or "reference".
        mask: optional bool (N, M), True = the item is in the list (docs/spec.md §2.1a). A
            masked entry is in no rank and no positive set and its gradient is exactly 0.

    A query with no positive in its list has loss 0 and does not count in "mean".
    Returns the loss in float32 (float64 for float64 sim; half inputs are computed in
    float32): a scalar, or (Q,) for "none".
    """
    return _recall_at_k_loss(_check_hyper, sim, positives, ks, tau, tau_k, direction, reduction, impl, mask)


def _recall_at_k_loss(check_hyper, sim, positives, ks, tau, tau_k, direction, reduction, impl, mask):
    """recall_at_k_loss with its hyper-parameters checked by ``check_hyper``: the op's own, or, for
    its module form, none (the module checked them when they were set)."""
    positives, (ks, tau, tau_k, direction, reduction), native = SR.checked_inputs(
        sim, positives, mask, impl, "recall_at_k_loss", check_hyper, ks, tau, tau_k, direction, reduction)
    if native:
        return RECALL_AT_K(sim, positives, mask, [float(k) for k in ks], [float(t) for t in tau_k], tau,
                           DIRECTION_CODE[direction], REDUCTION_CODE[reduction], variant_codes()[0])
    return _reference(sim, positives, ks, tau, tau_k, direction, reduction, mask)


class RecallAtKLoss(ModuleForm, functional=recall_at_k_loss, inputs=("sim", "positives", "mask"),
                    check=_check_hyper, checked=_recall_at_k_loss):
    """Module form of :func:`fastrank.recall_at_k_loss`:
    ``loss = RecallAtKLoss()(sim)``, ``(sim, positives)`` or ``(sim, positives, mask=mask)``."""


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
def _op_args(x, h):
    ks = check_ks(h["ks"])
    tau_k = check_tau_k(h["tau_k"], len(ks))
    return (x["sim"], x["positives"], x.get("mask"), [float(k) for k in ks], [float(t) for t in tau_k], h["tau"],
            *C.codes(h), variant_codes()[0])


CONTRACT = C.glue_contract(
    RECALL_AT_K, _op_args, C.subset_examples({"ks": (1, 2, 4), "tau_k": (1.0, 0.5, 2.0)}),
    C.TENSOR_CASES + C.POSITIVES_CASES + C.MASK_CASES + C.HYPER_CASES + (
        C.BadInput("tau = 0", ValueError, "tau", hyper={"tau": 0.0}),
        C.BadInput("ks holds 0", ValueError, "ks", hyper={"ks": (0, 1), "tau_k": 1.0}),
        C.BadInput("ks is empty", ValueError, "ks", hyper={"ks": (), "tau_k": 1.0}),
        C.BadInput("ks holds a float", ValueError, "ks", hyper={"ks": (1.5,), "tau_k": 1.0}),
        C.BadInput("tau_k of the wrong length", ValueError, "tau_k", hyper={"tau_k": (1.0, 1.0)}),
        C.BadInput("tau_k = 0", ValueError, "tau_k", hyper={"tau_k": 0.0})))


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("recall_at_k", recall_at_k_loss, RecallAtKLoss, CONTRACT, floor=SR.floor, cuda_matrix="test_smooth_ap.py"),)
