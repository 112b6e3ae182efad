"""Gains and ideal DCG shared by the smooth-NDCG reference and the NDCG metric
(Listwise ITR, Eq. 11-13; docs/spec.md §2.1, 2.1a)."""
from __future__ import annotations

import math
from typing import Optional

import torch


def gains(relevance: torch.Tensor) -> torch.Tensor:
    """g = 2^r - 1 (Listwise ITR, Eq. 17 numerator)."""
    return torch.exp2(relevance) - 1.0


def discount(position: torch.Tensor) -> torch.Tensor:
    """1 / log2(1 + position) (Listwise ITR, Eq. 17 denominator)."""
    return math.log(2.0) / torch.log1p(position)


def idcg(relevance: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Ideal DCG of each row: gains sorted descending, discounted by 1-based position
    (standard IDCG, docs/spec.md §2.1; no gradient flows through it). Shape (Q,).

    With a bool ``mask`` (True = in the list) only the row's valid items are ranked: the
    masked ones are sorted last (key -inf; a gain is >= -1) and contribute 0."""
    g = gains(relevance.detach())
    if mask is not None:
        g = torch.where(mask, g, torch.full_like(g, -math.inf))
    g_sorted = torch.sort(g, dim=1, descending=True).values
    if mask is not None:
        g_sorted = torch.where(g_sorted == -math.inf, torch.zeros_like(g_sorted), g_sorted)
    pos = torch.arange(1, g.shape[1] + 1, device=g.device, dtype=g.dtype)
    return (g_sorted * discount(pos)).sum(dim=1)
