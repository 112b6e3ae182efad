"""Pure-PyTorch Kendall ranking loss, as written in BCLS (Eq. 17; docs/spec.md §2.2, 2.1a).

This is the baseline the benchmarks race and the oracle's partner in the tests. It
builds the (Q, C, C) tensors of pairwise relevance comparisons and score differences,
exactly like the double sum over (j, k) of Eq. 17. Lists of different lengths
(docs/spec.md §2.1a) are a bool mask: a masked entry takes part in no pair.
"""
from __future__ import annotations

from typing import Optional

import torch

from .._reduce import directions, orient


def kendall_per_query(sim: torch.Tensor, relevance: torch.Tensor, alpha: float,
                      mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Loss of each row of sim (Q, C), shape (Q,):

        sum_{j,k} 1(r_j > r_k + alpha) * [s_k - s_j]+ / max(1, #{(j, k) : r_j > r_k + alpha})

    over the entries with mask True (all when mask is None). Computed in sim's dtype; the
    pair test r_j > r_k + alpha in relevance's dtype (r_k + alpha rounded to it, which the
    native kernels reproduce exactly). The subgradient of [x]+ at x = 0 is 0 (torch.relu's)."""
    # Eq. 17, indicator: active[q, j, k] = 1(r_j > r_k + alpha)
    active = relevance.unsqueeze(2) > (relevance + alpha).unsqueeze(1)
    if mask is not None:
        # docs/spec.md §2.1a: only pairs of two list members; masked values are never read
        active = active & mask.unsqueeze(2) & mask.unsqueeze(1)
        sim = torch.where(mask, sim, torch.zeros_like(sim))
    # Eq. 17, hinge: [s(V_i, T_k) - s(V_i, T_j)]+ at [q, j, k]
    hinge = torch.relu(sim.unsqueeze(1) - sim.unsqueeze(2))
    total = (hinge * active).sum(dim=(1, 2))
    count = active.sum(dim=(1, 2)).clamp(min=1)
    return total / count.to(total.dtype)


def kendall_reference(sim: torch.Tensor, relevance: torch.Tensor, alpha: float, direction: str = "both",
                      reduction: str = "mean", mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """kendall_loss of docs/spec.md §2.2 / 2.1a: per-query losses of each direction (t2i on the
    columns), then the reduction. "mean" averages over the lists with at least one valid
    item (every list when mask is None), 0 when there is none."""
    parts, valid = [], []
    for d in directions(direction):
        m = orient(mask, d)
        parts.append(kendall_per_query(orient(sim, d), orient(relevance, d), alpha, m))
        valid.append(None if m is None else m.any(dim=1))
    if reduction == "none":
        return torch.cat(parts)
    if reduction == "sum":
        return sum(p.sum() for p in parts)
    if mask is None:
        return sum(p.mean() for p in parts)
    # docs/spec.md §2.1a: the mean over the lists with a valid item (an empty list's loss is 0)
    return sum(p.sum() / v.sum().clamp(min=1).to(p.dtype) for p, v in zip(parts, valid))
