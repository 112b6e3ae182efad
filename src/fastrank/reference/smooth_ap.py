"""Pure-PyTorch Smooth-AP (Brown, Xie, Kalogeiton, Zisserman, "Smooth-AP: Smoothing the
Path Towards Large-Scale Image Retrieval", ECCV 2020), with the list masks of docs/spec.md §2.1a.
The contract is docs/spec.md §2.8.

For a query with list L (its row of ``sim``; ``mask`` removes items), positives P in L:

- AP (paper Eq. 2):            AP = (1 / |P|) sum_{j in P} R(j, P) / R(j, L)
- rank (paper Eq. 3, 4):       R(j, S) = 1 + sum_{k in S, k != j} 1{D_jk > 0}, D_jk = s_k - s_j
- Smooth-AP (paper Sec. 3.2):  the indicator replaced by the sigmoid sigma(D_jk / tau), so
                               R(j, L) = R_all(j) and R(j, P) = R_pos(j) of docs/spec.md §2.8
- loss:                        1 - AP; 0 for a query with no positive in its list.

The ranks come from :func:`fastrank.reference.smooth_rank.smooth_ranks`, the same smooth
rank as smooth-NDCG's (docs/spec.md §2.1). This reference computes them for every item of the
list, as the paper does, in bounded memory (blocks; see that module).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .smooth_rank import list_members, smooth_ranks


def smooth_ap_per_query(sim: Tensor, positives: Tensor, tau: float, mask: Optional[Tensor] = None) -> Tensor:
    """Loss of each row of sim (Q, C): 1 - Smooth-AP of the row's positives.

    ``positives`` (bool (Q, C)): the row's relevant items. ``mask`` (bool (Q, C), True = in
    the list): a masked item is in no rank and no positive set, its value is never read and
    its gradient is exactly 0. A row with no positive in its list has loss 0. Computed in
    sim's own dtype."""
    sim, in_list, pos = list_members(sim, positives, mask)
    # R_all(j) = R(j, L) and R_pos(j) = R(j, P) (paper Eq. 3 with the sigmoid of Sec. 3.2)
    r_all, r_pos = smooth_ranks(sim, (in_list, pos), tau)
    # paper Eq. 2: AP = (1 / |P|) sum_{j in P} R(j, P) / R(j, L)   (R(j, L) >= 1)
    ratio = torch.where(pos, r_pos / r_all, torch.zeros_like(r_all))
    n_pos = pos.sum(dim=1)
    ap = ratio.sum(dim=1) / n_pos.clamp(min=1).to(sim.dtype)
    # loss = 1 - AP; a query without a positive has loss 0 (docs/spec.md §2.8)
    return torch.where(n_pos > 0, 1.0 - ap, torch.zeros_like(ap))
