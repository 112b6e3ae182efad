"""allRank's ``approxNDCGLoss`` on fastrank's smooth-NDCG kernel.

allRank (https://github.com/allegro/allRank) trains learning-to-rank models on slates:
``y_pred`` and ``y_true`` of shape (batch, slate_length), padded items marked by
``y_true == padded_value_indicator`` (-1). Its approxNDCG loss (Qin et al., "A General
Approximation Framework for Direct Optimization of Information Retrieval Measures") is,
for each slate with valid items V:

    g_j      = 2^max(y_j, 0) - 1                                   (gains)
    maxDCG   = max(sum_p g_(p) / log2(1 + p), eps)                  (ideal DCG, sorted gains)
    pos_j    = 1 + sum_{k in V, k != j} max(sigma(alpha (s_k - s_j)), eps)
    NDCG     = sum_{j in V} (g_j / maxDCG) / log2(1 + pos_j)

and the loss is ``-mean(NDCG)`` over every slate of the batch (a slate with no positive
gain, or no valid item, counts 0). This is fastrank's smooth-NDCG (docs/spec.md §2.1) with
tau = 1 / alpha on each slate as a list of its own (docs/spec.md §2.1a, ``mask=``): NDCG =
1 - loss where the slate's ideal DCG > 0, else 0. The adapter keeps allRank's
conventions (mean over all slates, the sign), so it is a drop-in replacement.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _validation as V
from .._native import acc_dtype
from ..ops.smooth_ndcg import smooth_ndcg_loss

__all__ = ["approxNDCGLoss", "DEFAULT_EPS", "PADDED_Y_VALUE"]

DEFAULT_EPS = 1e-10   # allrank.models.losses.DEFAULT_EPS
PADDED_Y_VALUE = -1   # allrank.data.dataset_loading.PADDED_Y_VALUE


def _check_slates(y_pred, y_true) -> None:
    V.check_tensor(y_pred, "y_pred", 2, finite=False)  # padded scores are never read
    if not isinstance(y_true, Tensor):
        raise TypeError(f"y_true must be a torch.Tensor, got {type(y_true).__name__}")
    if y_true.dtype == torch.bool or y_true.dtype.is_complex:
        raise TypeError(f"y_true must hold real labels (a float or integer tensor), got {y_true.dtype}")
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true must have the same shape as y_pred (batch, slate_length) "
                         f"{tuple(y_pred.shape)}, got {tuple(y_true.shape)}")
    if y_true.device != y_pred.device:
        raise ValueError(f"y_true is on {y_true.device} but y_pred is on {y_pred.device}")


def _check_indicator(value) -> float:
    """The label of padded items: any real number but NaN (which equals no label)."""
    x = V.as_real(value, "padded_value_indicator")
    if x != x:
        raise ValueError(f"padded_value_indicator must be a number (the label of padded items), got {value!r}")
    return x


def approxNDCGLoss(y_pred: Tensor, y_true: Tensor, eps: float = DEFAULT_EPS,
                   padded_value_indicator: float = PADDED_Y_VALUE, alpha: float = 1.0, *,
                   impl: str = "auto") -> Tensor:
    """allRank's ``approxNDCGLoss`` (same signature, same value), on fastrank's kernel.

    Args:
        y_pred: (batch, slate_length) predicted scores.
        y_true: (batch, slate_length) graded labels; entries equal to
            ``padded_value_indicator`` are padding (not in the slate: they take part in
            no rank, gain or ideal DCG, and their score gets gradient 0). Negative labels
            other than the indicator count as gain 0, as in allRank.
        eps: allRank's numerical floor (> 0), see "Differences" below.
        padded_value_indicator: the label that marks a padded item (allRank: -1).
        alpha: the sigmoid's sharpness (> 0); fastrank's tau = 1 / alpha.
        impl: fastrank's ``"auto"`` / ``"native"`` / ``"reference"`` (keyword only).

    Returns:
        the scalar ``-mean over slates of approx NDCG``.

    Differences from allRank's code, all below float rounding unless scores differ by
    more than ~23 / alpha: allRank floors each pairwise sigmoid at ``eps`` (1e-10; a
    pair's term differs from fastrank's by at most 1e-10, next to a rank >= 1), and
    floors the ideal DCG at ``eps``, which only matters for a slate whose ideal DCG lies
    in (0, eps) (labels below ~1e-10): fastrank scores such a slate as an ordinary one,
    and a slate with ideal DCG 0 as 0, like allRank. allRank computes the ideal DCG's
    discounts log2(1 + p) in float32 even for float64 inputs (a relative difference of
    ~1e-9 from fastrank's float64 result). Half-precision inputs are computed in float32
    (docs/spec.md §1).
    """
    _check_slates(y_pred, y_true)
    eps = V.check_positive(eps, "eps")
    padded_value_indicator = _check_indicator(padded_value_indicator)
    alpha = V.check_positive(alpha, "alpha")
    # eps is only validated: fastrank's kernel has no floors (see "Differences" above)

    valid = y_true != padded_value_indicator                       # (B, L) True = in the slate
    acc = acc_dtype(y_pred.dtype)
    zero = torch.zeros((), dtype=y_pred.dtype, device=y_pred.device)
    sim = torch.where(valid, y_pred, zero)                         # padded scores never read
    labels = y_true.detach().to(acc).clamp(min=0.0)
    relevance = torch.where(valid, labels, torch.zeros((), dtype=acc, device=labels.device))
    # values last, under the caller's names (docs/spec.md §1: CPU by default): the non-padded items
    if V.check_finite_enabled(sim.device):
        if not V.all_finite(sim):
            raise ValueError("y_pred contains NaN or infinite values (in a non-padded item)")
        if not V.all_finite(relevance):
            raise ValueError("y_true contains NaN or infinite labels (in a non-padded item)")
    loss = smooth_ndcg_loss(sim, relevance, tau=1.0 / alpha, direction="i2t", reduction="none",
                            mask=valid, impl=impl)                 # (B,) 1 - NDCG; 0 if no gain
    has_gain = (relevance > 0).any(dim=1)
    ndcg = torch.where(has_gain, 1.0 - loss, torch.zeros_like(loss))
    return -ndcg.mean()
