"""triplet_loss: hinge triplet loss with hardest / soft / all negatives (docs/spec.md §2.4).

Listwise ITR Eq. 2-3 (VSE++ hardest negative), BCLS Eq. 1, 12 (sum over negatives)
and Eq. 14-15 (Triplet-SN: the hardest negative softened by a LogSumExp).

Per query (row i of ``sim`` for i2t, column for t2i), with P its positives and Neg the
rest, for each positive p:

- ``"hardest"``: [margin + max_{k in Neg} s_k - s_p]+
- ``"soft"``:    [margin + (1/gamma) log sum_{k in Neg} exp(gamma s_k) - s_p]+
- ``"all"``:     sum_{k in Neg} [margin + s_k - s_p]+

and the query's loss is the mean over its positives. Everything is vectorised over
queries and positives with masks; ``"all"`` never builds a (Q, C, C) tensor (see
:func:`pair_hinge_sums`).

The private helpers here (masked max / min / logsumexp, pair hinge sums) are shared by
ladder.py, topk.py and dvse.py.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _validation as V
from .._native import acc_dtype
from .._reduce import per_direction
from ..ops._row import Loss

MININGS = ("hardest", "soft", "all")


# ----------------------------------------------------------------------------- helpers

def to_acc(x: Tensor) -> Tensor:
    """float64 stays float64, everything else is computed in float32 (autograd casts the
    gradient back to the input dtype)."""
    return x.to(acc_dtype(x.dtype))


def masked_max(s: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(max over dim -1 of s where mask, whether any) ; 0 where the mask row is empty."""
    has = mask.any(dim=-1)
    m = s.masked_fill(~mask, float("-inf")).amax(dim=-1)
    return torch.where(has, m, torch.zeros_like(m)), has


def masked_min(s: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    m, has = masked_max(-s, mask)
    return -m, has


def masked_logsumexp(s: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(log sum_{mask} exp(s) over dim -1, whether any); 0 (and no NaN gradient) for an
    empty mask row."""
    has = mask.any(dim=-1)
    x = s.masked_fill(~mask, float("-inf"))
    x = torch.where(has.unsqueeze(-1), x, torch.zeros_like(x))  # keep empty rows finite
    lse = torch.logsumexp(x, dim=-1)
    return torch.where(has, lse, torch.zeros_like(lse)), has


def pair_hinge_sums(s: Tensor, b_mask: Tensor, margin: float) -> Tensor:
    """H[q, a] = sum_{b : b_mask[q, b]} [margin - s[q, a] + s[q, b]]+ for every (q, a).

    s, b_mask: (Q, C). Computed in O(Q C log C) time and O(Q C) memory: sort each row's
    B-values descending, count the b with s_b > s_a - margin (searchsorted), and read the
    sum of those from a cumulative sum, H = cumsum[count] + count * (margin - s_a).
    Differentiable a.e. (the gradient is +1 on each active b, -count on a).
    """
    q, c = s.shape
    b_vals = s.masked_fill(~b_mask, float("-inf"))
    desc, _ = b_vals.sort(dim=1, descending=True)              # valid values first
    desc0 = torch.where(torch.isfinite(desc), desc, torch.zeros_like(desc))
    csum = torch.cat([desc0.new_zeros(q, 1), desc0.cumsum(dim=1)], dim=1)  # csum[:, n] = top-n sum
    asc = desc.detach().flip(1).contiguous()                   # ascending, -inf first
    thresh = (s.detach() - margin).contiguous()
    # number of valid b with s_b > s_a - margin (the -inf fill is never counted)
    count = c - torch.searchsorted(asc, thresh, right=True)
    return csum.gather(1, count) + count.to(s.dtype) * (margin - s)


def check_mining(mining) -> str:
    return V.check_choice(mining, "mining", MININGS)


# ----------------------------------------------------------------------------- loss

def triplet_per_query(s: Tensor, pos: Tensor, margin: float, mining: str, gamma: float) -> Tensor:
    """Per-query triplet loss of s (Q, C) with positives pos (Q, C): mean over the
    positives p of the query of the hinge above; 0 for a query with no positive or no
    negative."""
    neg = ~pos
    n_pos = pos.sum(dim=1)
    if mining == "all":
        # BCLS Eq. 1: sum_{k in Neg} [margin + s_k - s_p]+, for every p at once
        h = pair_hinge_sums(s, neg, margin)
        has_neg = neg.any(dim=1)
    else:
        if mining == "hardest":
            # Listwise ITR Eq. 2-3: the hardest negative max_{k in Neg} s_k
            t, has_neg = masked_max(s, neg)
        else:
            # BCLS Eq. 14-15: (1/gamma) log sum_{k in Neg} exp(gamma s_k)
            lse, has_neg = masked_logsumexp(gamma * s, neg)
            t = lse / gamma
        h = torch.relu(margin + t.unsqueeze(1) - s)
    per_pos = torch.where(pos, h, torch.zeros_like(h)).sum(dim=1)
    loss = per_pos / n_pos.clamp(min=1).to(s.dtype)
    return torch.where(has_neg, loss, torch.zeros_like(loss))


def all_negatives_diagonal(s: Tensor, margin: float) -> Tensor:
    """``"all"`` mining when query q's only positive is candidate q (the default diagonal):
    sum_{k != q} [margin + s_k - s_q]+ for each query, directly in O(Q C) time and memory
    (as VSE++ computes it); several times faster than the sort-based
    :func:`pair_hinge_sums`, which serves any number of positives per query."""
    q, c = s.shape
    h = torch.relu(margin + s - s.diagonal().unsqueeze(1))
    own = torch.eye(q, c, dtype=torch.bool, device=s.device)
    return h.masked_fill(own, 0.0).sum(dim=1)


def triplet_loss(sim: Tensor, margin: float = 0.2, mining: str = "hardest", gamma: float = 50.0,
                 positives: Optional[Tensor] = None, direction: str = "both",
                 reduction: str = "mean") -> Tensor:
    """Hinge triplet loss (docs/spec.md §2.4; Listwise ITR Eq. 2-3, BCLS Eq. 1, 14-15).

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        margin: the hinge margin (>= 0).
        mining: ``"hardest"`` (VSE++, the largest negative), ``"soft"`` (Triplet-SN,
            (1/gamma) * logsumexp(gamma * s) over the negatives) or ``"all"`` (sum of
            the hinges over every negative).
        gamma: sharpness of the soft maximum (> 0), used by ``"soft"`` only.
        positives: bool (N, M) ground-truth matches; None = the diagonal (needs N == M).
            A query may have several positives: its loss is the mean over them.
        direction: ``"i2t"``, ``"t2i"`` or ``"both"`` (sum of the two).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (per-query losses, (N,) i2t then
            (M,) t2i).

    A query with no positive or no negative has loss 0 (and no gradient).

    Returns:
        a scalar, or a 1-D tensor for ``reduction="none"``.
    """
    V.check_sim(sim, values=False)
    diagonal = positives is None
    positives = V.check_positives(positives, sim)
    margin = V.check_nonnegative(margin, "margin")
    mining = check_mining(mining)
    gamma = V.check_positive(gamma, "gamma")
    V.check_direction(direction)
    V.check_reduction(reduction)
    V.check_data(sim)

    def per_query(s, pos):
        if diagonal and mining == "all":
            return all_negatives_diagonal(s, margin)
        return triplet_per_query(s, pos, margin, mining, gamma)

    return per_direction(direction, reduction, per_query, to_acc(sim), positives)


class TripletLoss(torch.nn.Module):
    """Module form of :func:`fastrank.triplet_loss`: ``TripletLoss(margin=0.2)(sim)``."""

    def __init__(self, margin: float = 0.2, mining: str = "hardest", gamma: float = 50.0,
                 direction: str = "both", reduction: str = "mean"):
        super().__init__()
        self.margin = V.check_nonnegative(margin, "margin")
        self.mining = check_mining(mining)
        self.gamma = V.check_positive(gamma, "gamma")
        self.direction = V.check_direction(direction)
        self.reduction = V.check_reduction(reduction)

    def forward(self, sim: Tensor, positives: Optional[Tensor] = None) -> Tensor:
        return triplet_loss(sim, self.margin, self.mining, self.gamma, positives,
                            self.direction, self.reduction)

    def extra_repr(self) -> str:
        return (f"margin={self.margin}, mining={self.mining!r}, gamma={self.gamma}, "
                f"direction={self.direction!r}, reduction={self.reduction!r}")


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("triplet", triplet_loss, TripletLoss),)
