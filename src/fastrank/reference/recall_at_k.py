"""Pure-PyTorch Recall@k surrogate (Patel, Tolias, Matas, "Recall@k Surrogate Loss with
Large Batches and Similarity Mixup", CVPR 2022), with the list masks of docs/spec.md §2.1a.
The contract is docs/spec.md §2.9.

For a query with list L (its row of ``sim``; ``mask`` removes items) and positives P in L:

- recall at k:          R@k = #{j in P : r_j <= k} / min(k, |P|), r_j the rank of j in L
- smooth rank:          r_j = 1 + sum_{k' in L, k' != j} sigma((s_k' - s_j) / tau)
                        (R_all of Smooth-AP, docs/spec.md §2.8; the query itself is never a
                        candidate: it is not in sim)
- smooth count:         the step 1{r_j <= k} replaced by sigma((k - r_j) / tau_k), the sum
                        clipped at k (no more than k items fit in the top k):
                        R@k = min(k, sum_{j in P} sigma((k - r_j) / tau_k)) / min(k, |P|)
- loss:                 1 - mean over ks of R@k; 0 for a query with no positive in its list.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .smooth_rank import list_members, smooth_ranks


def recall_at_k_per_query(sim: Tensor, positives: Tensor, ks: Sequence[int], tau: float,
                          tau_k: Sequence[float], mask: Optional[Tensor] = None) -> Tensor:
    """Loss of each row of sim (Q, C): 1 - the mean over ``ks`` of the smooth recall at k.

    ``positives`` (bool (Q, C)): the row's relevant items; ``ks`` positive ints and
    ``tau_k`` one temperature per k. ``mask`` (bool (Q, C), True = in the list): a masked
    item is in no rank and no positive set, its value is never read and its gradient is
    exactly 0. A row with no positive in its list has loss 0. Computed in sim's own dtype."""
    sim, in_list, pos = list_members(sim, positives, mask)
    (rank,) = smooth_ranks(sim, (in_list,), tau)                        # r_j for every item j
    n_pos = pos.sum(dim=1).to(sim.dtype)
    recall = sim.new_zeros(sim.shape[0])
    for k, t in zip(ks, tau_k):
        # smooth count of the positives in the top k, clipped at k
        soft = torch.where(pos, torch.sigmoid((k - rank) / t), torch.zeros_like(rank))
        hits = torch.clamp(soft.sum(dim=1), max=float(k))
        recall = recall + hits / torch.clamp(n_pos, min=1.0, max=float(k))    # / min(k, |P|)
    loss = 1.0 - recall / len(ks)
    return torch.where(n_pos > 0, loss, torch.zeros_like(loss))
