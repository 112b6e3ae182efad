"""Pure-PyTorch smooth-NDCG, as written in paper 000 (Eq. 16-21).

This is the baseline the benchmarks race and the oracle's partner in the tests. It
builds the (Q, C, C) tensor of pairwise differences, exactly like the paper's
"difference between two similarity matrices" (Sec. III-E).
"""
from __future__ import annotations

import torch

from .ndcg_terms import discount, gains, idcg


def smooth_ndcg_per_query(sim: torch.Tensor, relevance: torch.Tensor, tau: float) -> torch.Tensor:
    """Loss of each row of sim (Q, C): 1 - smooth NDCG; 0 for a row whose gains are all 0.

    Computed in sim's own dtype, as a PyTorch user would write it."""
    relevance = relevance.to(sim.dtype)
    c = sim.shape[1]
    # Eq. 16: pi_j = 1 + sum_{k != j} sigma((s_k - s_j) / tau)
    diff = (sim.unsqueeze(1) - sim.unsqueeze(2)) / tau          # diff[q, j, k] = (s_k - s_j) / tau
    off_diag = ~torch.eye(c, dtype=torch.bool, device=sim.device)
    pi = 1.0 + (torch.sigmoid(diff) * off_diag).sum(dim=2)
    # Eq. 17: DCG = sum_j (2^r_j - 1) / log2(1 + pi_j)
    dcg = (gains(relevance) * discount(pi)).sum(dim=1)
    # Eq. 18: NDCG = DCG / IDCG ; Eq. 20-21: loss = 1 - NDCG ; all-zero gains -> 0
    ideal = idcg(relevance)
    safe = torch.where(ideal > 0, ideal, torch.ones_like(ideal))
    return torch.where(ideal > 0, 1.0 - dcg / safe, torch.zeros_like(dcg))
