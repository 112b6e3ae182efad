"""Slow, obvious loop oracles of the smooth-rank losses with positives (docs/spec.md §2.8, 2.9),
shared by tests/test_smooth_ap.py, tests/test_recall_at_k.py and tests/test_memory.py.

Every query is a ragged Python list of floats (its row or column with the masked entries
deleted, docs/spec.md §2.1a) and a list of bools (its positives); every sum is a Python loop.
"""
import math

import torch


def sig(x):
    """The logistic function on a Python float, without overflow."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def smooth_rank(s, j, members, tau):
    """1 + sum over the k in members, k != j, of sigma((s_k - s_j) / tau)."""
    return 1.0 + sum(sig((s[k] - s[j]) / tau) for k in members if k != j)


def smooth_ap_query(s, pos, tau):
    """docs/spec.md §2.8 for one list: 1 - mean over the positives of R_pos / R_all; None when the
    list has no positive."""
    every = list(range(len(s)))
    positives = [j for j in every if pos[j]]
    if not positives:
        return None
    ap = 0.0
    for j in positives:
        ap += smooth_rank(s, j, positives, tau) / smooth_rank(s, j, every, tau)
    return 1.0 - ap / len(positives)


def recall_at_k_query(s, pos, tau, ks, tau_k):
    """docs/spec.md §2.9 for one list: 1 - mean over ks of min(k, sum_P sigma((k - r_j) / tau_k))
    / min(k, |P|); None when the list has no positive."""
    every = list(range(len(s)))
    positives = [j for j in every if pos[j]]
    if not positives:
        return None
    ranks = {j: smooth_rank(s, j, every, tau) for j in positives}
    total = 0.0
    for k, t in zip(ks, tau_k):
        hits = 0.0
        for j in positives:
            hits += sig((k - ranks[j]) / t)
        total += min(k, hits) / min(k, len(positives))
    return 1.0 - total / len(ks)


def lists(sim, positives, mask, direction):
    """[(scores, positive flags)] per query of one direction, masked entries deleted."""
    S, P = sim.tolist(), positives.tolist()
    K = mask.tolist() if mask is not None else [[True] * len(S[0]) for _ in S]
    n, m = len(S), len(S[0])
    if direction == "i2t":
        return [([S[i][j] for j in range(m) if K[i][j]], [P[i][j] for j in range(m) if K[i][j]])
                for i in range(n)]
    return [([S[i][j] for i in range(n) if K[i][j]], [P[i][j] for i in range(n) if K[i][j]])
            for j in range(m)]


def oracle(query_fn, sim, positives, direction="both", reduction="mean", mask=None):
    """query_fn(scores, flags) -> loss or None (no positive) on every query; "mean" averages
    each direction over its queries that have a positive (0 if none has), directions summed."""
    dirs = ["i2t", "t2i"] if direction == "both" else [direction]
    per_dir = [[query_fn(s, p) for s, p in lists(sim, positives, mask, d)] for d in dirs]
    if reduction == "none":
        return torch.tensor([0.0 if x is None else x for xs in per_dir for x in xs], dtype=torch.float64)
    if reduction == "sum":
        return torch.tensor(sum(x for xs in per_dir for x in xs if x is not None), dtype=torch.float64)
    total = 0.0
    for xs in per_dir:
        counted = [x for x in xs if x is not None]
        total += sum(counted) / len(counted) if counted else 0.0
    return torch.tensor(total, dtype=torch.float64)


def rand_case(n, m, seed, dtype=torch.float64, ties=False, scale=1.0, p_pos=0.3):
    """(sim, positives): random scores and random positives (some rows and columns without)."""
    g = torch.Generator().manual_seed(seed)
    sim = torch.randn(n, m, generator=g, dtype=torch.float64) * scale
    if ties:
        sim = (sim * 2).round() / 2
    positives = torch.rand(n, m, generator=g) < p_pos
    return sim.to(dtype), positives


def rand_mask(n, m, seed, p=0.7):
    return torch.rand(n, m, generator=torch.Generator().manual_seed(seed)) < p
