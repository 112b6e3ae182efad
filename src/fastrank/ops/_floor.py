"""The counting pieces of the ops' floors: the work no implementation of an op avoids.

An op declares its floor with its glue, as ``floor(mode, size, itemsize) -> counts`` (mode
``"forward"``, ``"backward"`` or ``"forward+backward"``; size ``{"n": N, "m": M}``; itemsize
the bytes of sim's dtype), and its row of the table of losses (registry.py) carries it to the
benchmarks, whose ceilings (benchmarks/ceilings.py) turn the counts into seconds with a
device's measured rates. The counts: ``bytes`` that must move (inputs read once, outputs
written once), ``exp`` exponentials, ``fp32`` other float instructions, ``mm_flop`` matmul
flops, ``cmp_select_add`` Kendall-like pair work.
"""
from __future__ import annotations

#: the pair passes of a mode: the forward is one, the backward one more
PASSES = {"forward": 1, "backward": 1, "forward+backward": 2}


def pair_count(n: int, m: int) -> float:
    """Unordered pairs of both directions: N*M*(M-1)/2 + M*N*(N-1)/2."""
    return n * m * (m - 1) / 2 + m * n * (n - 1) / 2


def rw_bytes(mode: str, n: int, m: int, itemsize: int) -> int:
    """Read sim and relevance; the backward also writes the gradient."""
    return {"forward": 2, "backward": 3, "forward+backward": 3}[mode] * n * m * itemsize
