"""topk_loss: the convex top-k ranking loss (docs/spec.md §2.6, Deep Top-k Eq. 10).

Deep Top-k relaxes "the positive ranks first" to "the positive ranks in the top k"
(Eq. 8: [Delta + s_[k] over the negatives - s_p]+) and optimises the convex upper bound
of Eq. 10, which replaces the k-th largest negative score by the mean of the k largest:

    loss(q) = [margin + (1/k') sum_{the k' largest s over Neg} s - s_p]+ ,  k' = min(k, |Neg|)

averaged over the query's positives p. k = 1 is the VSE++ hardest-negative triplet.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _validation as V
from .._reduce import per_direction
from .triplet import to_acc
from ..ops._row import Loss


def topk_per_query(s: Tensor, pos: Tensor, k: int, margin: float) -> Tensor:
    """Per-query top-k loss of s (Q, C) with positives pos (Q, C); 0 for a query with no
    positive or no negative."""
    neg = ~pos
    n_neg = neg.sum(dim=1)
    n_pos = pos.sum(dim=1)
    kk = min(k, s.shape[1])
    # the kk largest negatives of each row, descending; -inf past |Neg|
    top = s.masked_fill(pos, float("-inf")).topk(kk, dim=1).values
    valid = torch.arange(kk, device=s.device).unsqueeze(0) < n_neg.unsqueeze(1)
    k_eff = n_neg.clamp(max=k).clamp(min=1).to(s.dtype)             # k capped at |Neg|
    mean_top = torch.where(valid, top, torch.zeros_like(top)).sum(dim=1) / k_eff
    # Eq. 10: [margin + mean of the k largest negatives - s_p]+, averaged over p in P
    h = torch.relu(margin + mean_top.unsqueeze(1) - s)
    loss = torch.where(pos, h, torch.zeros_like(h)).sum(dim=1) / n_pos.clamp(min=1).to(s.dtype)
    return torch.where(n_neg > 0, loss, torch.zeros_like(loss))


def topk_loss(sim: Tensor, k: int = 5, margin: float = 0.2, positives: Optional[Tensor] = None,
              direction: str = "both", reduction: str = "mean") -> Tensor:
    """Convex top-k ranking loss (docs/spec.md §2.6; Deep Top-k, Eq. 10).

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        k: how many of the largest negative scores are averaged (integer >= 1; capped at
            the number of negatives of each query).
        margin: the hinge margin Delta (>= 0).
        positives: bool (N, M) ground-truth matches; None = the diagonal (needs N == M).
            A query's loss is the mean over its positives.
        direction: ``"i2t"``, ``"t2i"`` or ``"both"`` (sum of the two).
        reduction: ``"mean"``, ``"sum"`` (the paper's Eq. 1) or ``"none"`` ((N,) i2t then (M,) t2i).

    A query with no positive or no negative has loss 0.
    """
    V.check_sim(sim, values=False)
    positives = V.check_positives(positives, sim)
    k = V.check_int(k, "k", 1)
    margin = V.check_nonnegative(margin, "margin")
    V.check_direction(direction)
    V.check_reduction(reduction)
    V.check_data(sim)

    def per_query(s, pos):
        return topk_per_query(s, pos, k, margin)

    return per_direction(direction, reduction, per_query, to_acc(sim), positives)


class TopKLoss(torch.nn.Module):
    """Module form of :func:`fastrank.topk_loss`: ``TopKLoss(k=5)(sim)``."""

    def __init__(self, k: int = 5, margin: float = 0.2, direction: str = "both",
                 reduction: str = "mean"):
        super().__init__()
        self.k = V.check_int(k, "k", 1)
        self.margin = V.check_nonnegative(margin, "margin")
        self.direction = V.check_direction(direction)
        self.reduction = V.check_reduction(reduction)

    def forward(self, sim: Tensor, positives: Optional[Tensor] = None) -> Tensor:
        return topk_loss(sim, self.k, self.margin, positives, self.direction, self.reduction)

    def extra_repr(self) -> str:
        return (f"k={self.k}, margin={self.margin}, direction={self.direction!r}, "
                f"reduction={self.reduction!r}")


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("topk", topk_loss, TopKLoss),)
