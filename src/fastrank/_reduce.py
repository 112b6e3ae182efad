"""Directions and reductions shared by every loss (docs/spec.md §1).

A loss is computed as per-query losses for each requested direction: i2t on the rows
of ``sim``, t2i on its columns (``sim.T`` and ``relevance.T``). ``reduce`` turns them
into the returned value:

- ``"mean"``: mean over the queries of each direction, the directions summed;
- ``"sum"``: sum over queries and directions;
- ``"none"``: the per-query losses, i2t queries first then t2i.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch


def directions(direction: str) -> List[str]:
    return ["i2t", "t2i"] if direction == "both" else [direction]


def orient(x: Optional[torch.Tensor], d: str) -> Optional[torch.Tensor]:
    """The (queries, candidates) view of an (N, M) tensor for direction d."""
    if x is None:
        return None
    return x if d == "i2t" else x.t()


def reduce(per_query: List[torch.Tensor], reduction: str) -> torch.Tensor:
    if reduction == "none":
        return torch.cat(per_query)
    if reduction == "sum":
        return sum(q.sum() for q in per_query)
    return sum(q.mean() for q in per_query)


def per_direction(direction: str, reduction: str,
                  fn: Callable[..., torch.Tensor], *tensors: Optional[torch.Tensor]) -> torch.Tensor:
    """Apply fn(*oriented tensors) -> per-query losses for each direction, then reduce."""
    parts = [fn(*(orient(t, d) for t in tensors)) for d in directions(direction)]
    return reduce(parts, reduction)


def reduce_counted(per_query: List[torch.Tensor], counted: List[torch.Tensor], reduction: str) -> torch.Tensor:
    """``reduce`` where "mean" averages each direction over the queries that count only
    (``counted``: one bool vector per direction, e.g. the queries with at least one
    positive in their list, docs/spec.md §2.8), 0 when none does; the others still appear in
    "none" (with their loss, 0) and add their loss (0) to "sum"."""
    if reduction != "mean":
        return reduce(per_query, reduction)
    return sum(q.sum() / c.sum().clamp(min=1) for q, c in zip(per_query, counted))


def per_positive_query(direction: str, reduction: str, fn: Callable[..., torch.Tensor], sim: torch.Tensor,
                       positives: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``per_direction`` for the losses on binary relevance (docs/spec.md §2.8, §2.9):
    fn(sim, positives, mask) per direction, and "mean" over the queries with at least one
    positive in their list (``reduce_counted``)."""
    parts, counted = [], []
    for d in directions(direction):
        pos, m = orient(positives, d), orient(mask, d)
        parts.append(fn(orient(sim, d), pos, m))
        counted.append((pos if m is None else pos & m).any(dim=1))
    return reduce_counted(parts, counted, reduction)

