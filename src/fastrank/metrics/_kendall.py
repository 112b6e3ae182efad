"""Discordant-pair counting for Kendall tau-b, vectorised over many queries.

tau-b needs, per query, the number of discordant pairs D = #{(i, j): x_i < x_j, y_i > y_j}
(strict on both sides). With the items sorted by x and both sides given as dense ranks this
is an inversion count, O(n log n) per query:

- CPU: SciPy's compiled Fenwick-tree counter (``scipy.stats._stats._kendall_dis``, the one
  ``scipy.stats.kendalltau`` itself calls; it releases the GIL), run over the rows of a
  block on a few threads. The sorting and tie counting around it are vectorised.
- other devices (and the CPU when that SciPy function is missing): a pure-PyTorch
  inversion count by bit partitioning (MSD radix: an inverted pair is counted at the
  highest bit where the two values differ), ``ceil(log2 n)`` vectorised passes.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ._common import argsort_rows, parallel_rows, use_numpy

try:  # private, but stable since SciPy 1.0; guarded with a pure-PyTorch fallback
    from scipy.stats._stats import _kendall_dis as _scipy_kendall_dis
except Exception:  # pragma: no cover - depends on the installed SciPy
    _scipy_kendall_dis = None


def inversions(q: Tensor) -> Tensor:
    """Inversion count #{(a < b): q[a] > q[b]} of each row of q, an (R, n) integer tensor
    whose rows are permutations of 0..n-1. Returns (R,) int64. Vectorised on q's device.

    The rows are padded to N = 2^B with the values n..N-1 (increasing, at the end: no new
    inversion). Level b (from the top bit down) holds the elements grouped by value prefix
    v >> (b + 1), each group in position order; a group of 2h = 2^(b+1) values has h with
    bit b set ("ones") and h without. The level adds the (one before zero) pairs of every
    group, h (2h - 1) - h (h - 1) / 2 - sum of the ones' offsets in the group, then splits
    each group stably into its zeros and its ones, the groups of the next level.
    """
    rows, n = q.shape
    if n < 2 or rows == 0:
        return torch.zeros(rows, dtype=torch.int64, device=q.device)
    bits = math.ceil(math.log2(n))
    size = 1 << bits
    dt = torch.int16 if size <= (1 << 15) else torch.int32
    a = torch.empty(rows, size, dtype=dt, device=q.device)
    a[:, :n] = q
    if size > n:
        a[:, n:] = torch.arange(n, size, dtype=dt, device=q.device)
    total = torch.zeros(rows, dtype=torch.int64, device=q.device)
    for b in range(bits - 1, -1, -1):
        h = 1 << b
        groups = size // (2 * h)
        one = (a & h) != 0
        offset = torch.arange(2 * h, dtype=torch.int64, device=q.device)
        s = (one.view(rows, groups, 2 * h) * offset).sum(dim=(1, 2))
        total += groups * (h * (2 * h - 1) - h * (h - 1) // 2) - s
        if b:
            zeros = a[~one].view(rows, groups, h)
            ones = a[one].view(rows, groups, h)
            a = torch.stack((zeros, ones), dim=2).view(rows, size)
    return total


def _discordant_torch(xd: Tensor, yd: Tensor) -> Tensor:
    """Discordant pairs from dense ranks via one inversion count: positions ordered by
    (x, y), values ranked by (y, position), so pairs tied in x or in y never invert."""
    rows, n = xd.shape
    ar = torch.arange(n, device=xd.device)
    order = argsort_rows(xd * (n + 1) + yd)            # lexicographic (x, y)
    y_in_order = yd.gather(1, order)
    q = argsort_rows(y_in_order * n + ar)              # lexicographic (y, position)
    return inversions(q)


def _discordant_scipy(xd: Tensor, yd: Tensor) -> Tensor:
    xn = np.ascontiguousarray(xd.numpy(), dtype=np.intp)
    yn = np.ascontiguousarray(yd.numpy(), dtype=np.intp)
    out = np.empty(xn.shape[0], dtype=np.int64)

    def work(lo, hi):
        for r in range(lo, hi):
            out[r] = _scipy_kendall_dis(xn[r], yn[r])

    parallel_rows(work, xn.shape[0])
    return torch.from_numpy(out)


def discordant_pairs(xd: Tensor, yd: Tensor, impl: str = "auto") -> Tensor:
    """Discordant pairs per row. xd: (R, n) int64 dense ranks of x (1-based), nondecreasing
    along each row (the items sorted by x); yd: (R, n) int64 dense ranks of y (1-based) of
    the same items. Returns (R,) int64. impl: "auto", "scipy" or "torch"."""
    if impl == "auto":
        impl = "scipy" if (use_numpy(xd) and _scipy_kendall_dis is not None) else "torch"
    if impl == "scipy":
        return _discordant_scipy(xd, yd)
    return _discordant_torch(xd, yd)
