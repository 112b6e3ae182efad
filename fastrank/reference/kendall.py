"""Pure-PyTorch Kendall ranking loss, as written in paper 001 (Eq. 17; SPEC.md 2.2).

This is the baseline the benchmarks race and the oracle's partner in the tests. It
builds the (Q, C, C) tensors of pairwise relevance comparisons and score differences,
exactly like the double sum over (j, k) of Eq. 17.
"""
from __future__ import annotations

import torch


def kendall_per_query(sim: torch.Tensor, relevance: torch.Tensor, alpha: float) -> torch.Tensor:
    """Loss of each row of sim (Q, C), shape (Q,):

        sum_{j,k} 1(r_j > r_k + alpha) * [s_k - s_j]+ / max(1, #{(j, k) : r_j > r_k + alpha})

    Computed in sim's dtype; the pair test r_j > r_k + alpha in relevance's dtype
    (r_k + alpha rounded to it, which the native kernels reproduce exactly). The
    subgradient of [x]+ at x = 0 is 0 (torch.relu's)."""
    # Eq. 17, indicator: active[q, j, k] = 1(r_j > r_k + alpha)
    active = relevance.unsqueeze(2) > (relevance + alpha).unsqueeze(1)
    # Eq. 17, hinge: [s(V_i, T_k) - s(V_i, T_j)]+ at [q, j, k]
    hinge = torch.relu(sim.unsqueeze(1) - sim.unsqueeze(2))
    total = (hinge * active).sum(dim=(1, 2))
    count = active.sum(dim=(1, 2)).clamp(min=1)
    return total / count.to(total.dtype)
