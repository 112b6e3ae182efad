"""Pure-PyTorch fast re-ranking, as written in DVSE (Eq. 13-15), in log space.

This is the baseline the benchmarks race and the oracle's partner in the tests.
DVSE normalises the similarity matrix A = sim twice (Eq. 14-15):

- i2t (row-wise retrieval, softmax0): each element is divided by the sum over its
  *column* of exp(gamma1 * A): A_i2t[i, j] = exp(gamma2 A[i, j]) / sum_l exp(gamma1 A[l, j]);
- t2i (column-wise retrieval, softmax1): each element is divided by the sum over its
  *row* of exp(lam1 * A): A_t2i[i, j] = exp(lam2 A[i, j]) / sum_l exp(lam1 A[i, l]).

fastrank returns the logarithms (docs/spec.md §3): the ranking is the same, and distinct
scores never underflow into ties.
"""
from __future__ import annotations

from typing import Tuple

import torch


def fast_rerank(sim: torch.Tensor, gamma: Tuple[float, float] = (25.0, 25.0),
                lam: Tuple[float, float] = (20.0, 20.0)) -> Tuple[torch.Tensor, torch.Tensor]:
    """(i2t_scores, t2i_scores) of sim (N, M), both (N, M), in sim's dtype.

    i2t_scores[i, j] = gamma2 * sim[i, j] - logsumexp_l(gamma1 * sim[l, j])   (Eq. 14, 15 softmax0)
    t2i_scores[i, j] = lam2 * sim[i, j] - logsumexp_l(lam1 * sim[i, l])       (Eq. 15 softmax1)
    """
    g1, g2 = gamma
    l1, l2 = lam
    i2t = g2 * sim - torch.logsumexp(g1 * sim, dim=0, keepdim=True)
    t2i = l2 * sim - torch.logsumexp(l1 * sim, dim=1, keepdim=True)
    return i2t, t2i
