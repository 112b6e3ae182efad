"""ladder_loss: the ladder loss with hard contrastive sampling (docs/spec.md §2.5, Ladder Loss Eq. 5-8).

The negatives of a query are split by relevance into L levels with thresholds
theta_1 > theta_2 > ... > theta_{L-1}:

    Lev_1 = {k in Neg : r_k >= theta_1},  Lev_l = {k in Neg : theta_l <= r_k < theta_{l-1}},
    Lev_L = {k in Neg : r_k < theta_{L-1}}.

Eq. 6: loss(q) = sum_l beta_l * rung_l(q), where
- rung 1 (Eq. 7, first line) is the triplet loss of the positives against every negative
  with margin alpha_1 (hardest negative if ``hard``, else the sum over negatives), averaged
  over the query's positives like :func:`fastrank.triplet_loss`;
- rung l = 2..L (Eq. 7-8) pushes the closer set C = Lev_{l-1} above the farther set
  F = Lev_l U ... U Lev_L by alpha_l:
  hard (Eq. 8): [alpha_l - min_C s + max_F s]+ ; not hard (Eq. 7): sum_{c in C, f in F}
  [alpha_l - s_c + s_f]+. An empty C or F adds 0 (docs/spec.md §6: the Ladder Loss code can add a
  spurious term there).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import _validation as V
from .._reduce import per_direction
from .triplet import masked_max, masked_min, pair_hinge_sums, to_acc, triplet_per_query
from ..ops._row import Loss


def _check_ladder(thresholds, margins, weights):
    thr = V.check_sequence(thresholds, "thresholds", V.check_real, nonempty=False)
    if any(a <= b for a, b in zip(thr, thr[1:])):
        raise ValueError(f"thresholds must be strictly decreasing, got {thr!r}")
    mar = V.check_sequence(margins, "margins", V.check_nonnegative)
    wei = V.check_sequence(weights, "weights", V.check_nonnegative)
    if len(mar) != len(thr) + 1:
        raise ValueError(f"margins must have len(thresholds) + 1 = {len(thr) + 1} entries "
                         f"(one per level), got {len(mar)}")
    if len(wei) != len(thr) + 1:
        raise ValueError(f"weights must have len(thresholds) + 1 = {len(thr) + 1} entries "
                         f"(one per level), got {len(wei)}")
    return thr, mar, wei


def ladder_per_query(s: Tensor, r: Tensor, pos: Tensor, thresholds: Sequence[float],
                     margins: Sequence[float], weights: Sequence[float], hard: bool) -> Tensor:
    """Per-query ladder loss of s (Q, C) with relevance r (Q, C) and positives pos (Q, C)."""
    neg = ~pos
    # level of each candidate: 1 + #{l : r < theta_l}  (1 = most relevant), negatives only
    thr = torch.tensor(thresholds, dtype=r.dtype, device=r.device)
    level = 1 + (r.unsqueeze(-1) < thr).sum(dim=-1)
    # rung 1 (Eq. 7, L^1): triplet of the positives against all negatives, margin alpha_1
    loss = weights[0] * triplet_per_query(s, pos, margins[0], "hardest" if hard else "all", 1.0)
    for l in range(2, len(thresholds) + 2):
        if weights[l - 1] == 0:
            continue
        alpha = margins[l - 1]
        closer = neg & (level == l - 1)          # C = Lev_{l-1}
        farther = neg & (level >= l)             # F = Lev_l U ... U Lev_L
        if hard:
            # Eq. 8: i* = argmin_C s (furthest of C), j* = argmax_F s (closest of F)
            c_min, has_c = masked_min(s, closer)
            f_max, has_f = masked_max(s, farther)
            rung = torch.relu(alpha - c_min + f_max)
            rung = torch.where(has_c & has_f, rung, torch.zeros_like(rung))
        else:
            # Eq. 7: sum_{c in C, f in F} [alpha - s_c + s_f]+
            h = pair_hinge_sums(s, farther, alpha)
            rung = torch.where(closer, h, torch.zeros_like(h)).sum(dim=1)
        loss = loss + weights[l - 1] * rung
    return loss


def ladder_loss(sim: Tensor, relevance: Tensor, thresholds: Sequence[float] = (0.63,),
                margins: Sequence[float] = (0.2, 0.01), weights: Sequence[float] = (1.0, 0.25),
                hard: bool = True, positives: Optional[Tensor] = None, direction: str = "both",
                reduction: str = "mean") -> Tensor:
    """Ladder loss (docs/spec.md §2.5; Ladder Loss, Eq. 5-8).

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        relevance: (N, M) graded relevance in [0, 1]; splits the negatives into levels
            (no gradient flows to it). t2i uses its columns.
        thresholds: L-1 strictly decreasing level thresholds theta_1 > ... > theta_{L-1}
            (may be empty: then the loss is the triplet rung alone).
        margins: L margins alpha_1..alpha_L (>= 0), one per rung.
        weights: L weights beta_1..beta_L (>= 0), one per rung.
        hard: hard contrastive sampling (Eq. 8, and the hardest negative in rung 1);
            False sums over all pairs (Eq. 7).
        positives: bool (N, M) ground-truth matches; None = the diagonal (needs N == M).
        direction: ``"i2t"``, ``"t2i"`` or ``"both"`` (sum of the two).
        reduction: ``"mean"``, ``"sum"`` (the paper's code) or ``"none"`` ((N,) i2t then (M,) t2i).

    A rung whose C or F is empty adds 0; rung 1 is 0 for a query with no positive or no
    negative. NaN/inf in sim or relevance, or a negative relevance, raise ValueError where
    the value check is on (docs/spec.md §1: CPU by default), after every structure check.
    """
    V.check_sim(sim, values=False)
    V.check_relevance(relevance, sim, values=False)
    positives = V.check_positives(positives, sim)
    thresholds, margins, weights = _check_ladder(thresholds, margins, weights)
    if not isinstance(hard, bool):
        raise ValueError(f"hard must be a bool, got {hard!r}")
    V.check_direction(direction)
    V.check_reduction(reduction)
    V.check_data(sim, relevance, relevance_min=0.0, loss="ladder_loss")
    s = to_acc(sim)
    relevance = relevance.detach()   # only compared with the thresholds, in its own dtype

    def per_query(sq, rq, pq):
        return ladder_per_query(sq, rq, pq, thresholds, margins, weights, hard)

    return per_direction(direction, reduction, per_query, s, relevance, positives)


class LadderLoss(torch.nn.Module):
    """Module form of :func:`fastrank.ladder_loss`: ``LadderLoss()(sim, relevance)``."""

    def __init__(self, thresholds: Sequence[float] = (0.63,), margins: Sequence[float] = (0.2, 0.01),
                 weights: Sequence[float] = (1.0, 0.25), hard: bool = True,
                 direction: str = "both", reduction: str = "mean"):
        super().__init__()
        self.thresholds, self.margins, self.weights = _check_ladder(thresholds, margins, weights)
        if not isinstance(hard, bool):
            raise ValueError(f"hard must be a bool, got {hard!r}")
        self.hard = hard
        self.direction = V.check_direction(direction)
        self.reduction = V.check_reduction(reduction)

    def forward(self, sim: Tensor, relevance: Tensor, positives: Optional[Tensor] = None) -> Tensor:
        return ladder_loss(sim, relevance, self.thresholds, self.margins, self.weights, self.hard,
                           positives, self.direction, self.reduction)

    def extra_repr(self) -> str:
        return (f"thresholds={self.thresholds}, margins={self.margins}, weights={self.weights}, "
                f"hard={self.hard}, direction={self.direction!r}, reduction={self.reduction!r}")


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("ladder", ladder_loss, LadderLoss),)
