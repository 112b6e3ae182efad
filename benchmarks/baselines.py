"""The PyTorch baselines raced against the native kernels, built from the public API.

- ``reference``: the op's pure-PyTorch implementation, eager (``impl="reference"``: the
  public contract, so the bench never depends on the reference's internal names);
- ``compiled``: the same call under ``torch.compile`` (inductor; on CPU it needs a C++
  compiler, a failure is recorded as skipped with the reason);
- ``chunked``: what a user does when the reference does not fit: the queries in blocks,
  each block under ``torch.utils.checkpoint`` so only one block's intermediates are alive
  at a time, in the forward and in the backward (which recomputes the block).
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

import fastrank

# Elements of the (block, C, C) pairwise tensor a block may build: 2^24 floats = 64 MB.
BLOCK_ELEMENTS = 1 << 24


def raise_recompile_limit() -> None:
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(64, getattr(cfg, name)))


def reference(fn: Callable, **kw) -> Callable:
    return functools.partial(fn, impl="reference", **kw)


def compiled(fn: Callable, **kw) -> Callable:
    """torch.compile of the reference call (compiled lazily, on the first call), with
    dynamic shapes so that one compilation serves every size."""
    raise_recompile_limit()
    return torch.compile(functools.partial(fn, impl="reference", **kw), dynamic=True)


def chunked_per_query(fn: Callable, pair_elements: Callable[[int], int] = lambda c: c * c,
                      **kw) -> Callable:
    """``fn(sim, relevance, direction, reduction="mean")`` over blocks of queries.

    fn is a public per-query loss (smooth_ndcg_loss, kendall_loss, ...); a query's loss
    depends on its own row (i2t) or column (t2i) only, so the mean over queries is the
    sum over blocks of the block's ``reduction="sum"`` divided by the query count.
    pair_elements(C): elements one query needs (C^2 for a pairwise loss), which sets the
    block size. A TopKRelevance is made its (N, M) matrix first (the blocks slice it).
    """
    def loss(sim: torch.Tensor, relevance, direction: str = "both") -> torch.Tensor:
        if isinstance(relevance, fastrank.TopKRelevance):
            relevance = relevance.to_dense(sim.dtype)
        n, m = sim.shape
        total = sim.new_zeros(())
        sides = [side for side in (("i2t", n, m), ("t2i", m, n)) if direction in (side[0], "both")]
        for side, queries, cands in sides:
            block = max(1, BLOCK_ELEMENTS // max(1, pair_elements(cands)))

            def part(s, r, side=side):
                return fn(s, r, direction=side, reduction="sum", impl="reference", **kw)

            acc = sim.new_zeros(())
            for start in range(0, queries, block):
                idx = slice(start, start + block)
                s, r = (sim[idx], relevance[idx]) if side == "i2t" else (sim[:, idx], relevance[:, idx])
                acc = acc + checkpoint(part, s, r, use_reentrant=False)
            total = total + acc / queries
        return total
    return loss
