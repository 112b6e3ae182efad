"""Shared case pieces of the pairwise ranking losses (smooth_ndcg, kendall, kendall_sw and
the vectorised PyTorch losses): inputs, pair counts, bytes that must move, and the memory
estimate of an O(N^3) reference."""
from __future__ import annotations

import torch

from benchmarks import baselines


def make_inputs(size, device, dtype, requires_grad):
    """sim uniform in [-1, 1) and relevance in [0, 1) (diagonal 1 when square)."""
    n, m = size["n"], size["m"]
    sim = (torch.rand(n, m, device=device) * 2 - 1).to(dtype).requires_grad_(requires_grad)
    rel = torch.rand(n, m, device=device).to(dtype)
    if n == m:
        rel.fill_diagonal_(1.0)
    return {"sim": sim, "relevance": rel}


def pair_count(n, m):
    """Unordered pairs of both directions: N*M*(M-1)/2 + M*N*(N-1)/2."""
    return n * m * (m - 1) / 2 + m * n * (n - 1) / 2


def cubic_work(size):
    return size["n"] * size["m"] * (size["n"] + size["m"])


def rw_bytes(mode, n, m, itemsize):
    """Read sim and relevance; the backward also writes the gradient."""
    return {"forward": 2, "backward": 3, "forward+backward": 3}[mode] * n * m * itemsize


def cubic_est_bytes(impl, mode, size, itemsize):
    """Peak-memory estimate: the references hold (N, M, M) tensors, native O(N*M)."""
    n, m = size["n"], size["m"]
    cube = n * m * max(n, m) * itemsize          # one (N, M, M) tensor
    units = {"forward": 3, "backward": 4, "forward+backward": 6}[mode]
    flat = 8 * n * m * 4
    if impl in ("reference", "compiled"):
        return units * cube + flat
    if impl == "chunked":
        return units * min(cube, baselines.BLOCK_ELEMENTS * itemsize) + 2 * flat
    return flat
