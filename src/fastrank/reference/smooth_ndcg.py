"""Pure-PyTorch smooth-NDCG, as written in Listwise ITR (Eq. 16-21), with the list masks of
docs/spec.md §2.1a.

This is the baseline the benchmarks race and the oracle's partner in the tests. It
builds the (Q, C, C) tensor of pairwise differences, exactly like the paper's
"difference between two similarity matrices" (Sec. III-E).
"""
from __future__ import annotations

from typing import Optional

import torch

from .ndcg_terms import discount, gains, idcg


def smooth_ndcg_per_query(sim: torch.Tensor, relevance: torch.Tensor, tau: float,
                          mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Loss of each row of sim (Q, C): 1 - smooth NDCG; 0 for a row whose gains are all 0.

    ``mask`` (bool (Q, C), True = in the list): the row's list is its valid items only; a
    masked item takes part in no rank, gain, pair or IDCG and gets a zero gradient, so a
    row with no valid item has loss 0. Computed in sim's own dtype, as a PyTorch user
    would write it."""
    relevance = relevance.to(sim.dtype)
    c = sim.shape[1]
    off_diag = ~torch.eye(c, dtype=torch.bool, device=sim.device)
    pairs = off_diag                                            # pairs[j, k]: k != j
    if mask is not None:
        # a masked entry's value is never read (not even a NaN there)
        sim = torch.where(mask, sim, torch.zeros_like(sim))
        relevance = torch.where(mask, relevance, torch.zeros_like(relevance))
        pairs = off_diag & mask.unsqueeze(1)                    # pairs[q, j, k]: k != j, k in the list
    # Eq. 16: pi_j = 1 + sum_{k != j, k in the list} sigma((s_k - s_j) / tau)
    diff = (sim.unsqueeze(1) - sim.unsqueeze(2)) / tau          # diff[q, j, k] = (s_k - s_j) / tau
    pi = 1.0 + (torch.sigmoid(diff) * pairs).sum(dim=2)
    # Eq. 17: DCG = sum_{j in the list} (2^r_j - 1) / log2(1 + pi_j)
    terms = gains(relevance) * discount(pi)
    if mask is not None:
        terms = terms * mask
    dcg = terms.sum(dim=1)
    # Eq. 18: NDCG = DCG / IDCG ; Eq. 20-21: loss = 1 - NDCG ; all-zero gains (or no item) -> 0
    ideal = idcg(relevance, mask)
    safe = torch.where(ideal > 0, ideal, torch.ones_like(ideal))
    return torch.where(ideal > 0, 1.0 - dcg / safe, torch.zeros_like(dcg))
