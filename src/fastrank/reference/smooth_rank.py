"""The smooth rank that smooth-NDCG, Smooth-AP and the Recall@k surrogate share (docs/spec.md
2.1, 2.8, 2.9), in pure PyTorch:

    R(j, S) = 1 + sum_{k in S, k != j} sigma((s_k - s_j) / tau)

the rank of item j among the items of a set S of its query's list, with the indicator
1{s_k > s_j} of the exact rank replaced by a sigmoid of temperature tau.

Smooth-AP needs it over two sets (the whole list and its positives), Recall@k over the
whole list only; both read it from :func:`smooth_ranks`, which returns R for every item of
every query. That costs O(Q * C^2) time, like the papers' code, but never holds a
(Q, C, C) tensor: the (query, item, candidate) differences are formed in blocks of at most
``block`` elements, each under ``torch.utils.checkpoint`` when autograd records, so the
backward recomputes one block at a time instead of keeping every block's sigmoids.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

#: elements of one (queries, items, candidates) block: 2^22 = 32 MiB of float64 per temporary
BLOCK = 1 << 22


def _ranks_block(s: Tensor, items: Tensor, weights: Tensor, tau: float) -> Tensor:
    """R(j, S_m) = 1 + sum_k weights[m, q, j, k] * sigma((s_k - s_j) / tau).

    s: (Q, C) the scores of each query's list; items: (Q, J) the scores s_j of the items
    whose rank is wanted; weights: (m, Q, J, C) 1 where candidate k is in the set S_m and
    k != j, else 0. Returns (m, Q, J)."""
    diff = (s.unsqueeze(1) - items.unsqueeze(2)) / tau      # diff[q, j, k] = (s_k - s_j) / tau
    return 1.0 + (torch.sigmoid(diff).unsqueeze(0) * weights).sum(dim=-1)


def smooth_ranks(sim: Tensor, sets: Sequence[Tensor], tau: float, block: int = BLOCK) -> List[Tensor]:
    """For each bool (Q, C) membership tensor S in ``sets``, the (Q, C) tensor of
    R(j, S) = 1 + sum_{k in S of row q, k != j} sigma((s_k - s_j) / tau), for every query q
    (row of ``sim``) and every item j of the row (whether or not j is in S).

    ``sim`` must hold finite values everywhere (callers replace entries that are in no set
    by 0 first). Computed in sim's dtype."""
    q, c = sim.shape
    weights = torch.stack([m.to(sim.dtype) for m in sets])                 # (m, Q, C)
    not_self = ~torch.eye(c, dtype=torch.bool, device=sim.device)          # [j, k]: k != j
    grad = torch.is_grad_enabled() and sim.requires_grad
    rows = max(1, min(q, block // max(1, c * c)))
    cols = c if rows > 1 or c * c <= block else max(1, block // c)

    def one(s, w, j0: int, j1: int):
        # weight of candidate k in the rank of item j: k in S and k != j
        wj = w.unsqueeze(2) * not_self[j0:j1].to(w.dtype)                  # (m, r, J, C)
        return _ranks_block(s, s[:, j0:j1], wj, tau)

    out = []
    for r0 in range(0, q, rows):
        s, w = sim[r0:r0 + rows], weights[:, r0:r0 + rows]
        parts = []
        for j0 in range(0, c, cols):
            j1 = min(c, j0 + cols)
            parts.append(checkpoint(one, s, w, j0, j1, use_reentrant=False) if grad else one(s, w, j0, j1))
        out.append(torch.cat(parts, dim=-1))
    ranks = torch.cat(out, dim=1)                                          # (m, Q, C)
    return list(ranks.unbind(0))


def list_members(sim: Tensor, positives: Tensor, mask: Optional[Tensor]):
    """(sim with the entries outside the list replaced by 0, the list, the positives in it)
    for docs/spec.md §2.1a: a masked entry's value is never read and takes part in nothing."""
    if mask is None:
        return sim, torch.ones_like(positives), positives
    sim = torch.where(mask, sim, torch.zeros_like(sim))
    return sim, mask, positives & mask
