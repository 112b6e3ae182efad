"""Pure-PyTorch Kendall SW-HS loss, as written in BCLS (Eq. 18-20; docs/spec.md §2.3).

Sliding windows over the relevance scale, and in each window the hardest pair: the
positive with the lowest score and the negative with the highest. Vectorised over the
queries, a Python loop over the windows, the way a PyTorch user would write it.
"""
from __future__ import annotations

from typing import Tuple

import torch


def sw_edges(alpha: float, beta: float, label_range: Tuple[float, float]):
    """The window edges of SW-HS in float64 (Python floats): (upper, lower) tuples of
    length M_w = round((hi - lo - alpha) / beta) (Python's round: half to even),
    u_m = hi - (m - 1) * beta and l_m = u_m - alpha for m = 1..M_w. Both non-increasing.
    Inputs are assumed validated (fastrank._validation)."""
    lo, hi = label_range
    n_w = round((hi - lo - alpha) / beta)
    upper = tuple(hi - (m - 1) * beta for m in range(1, n_w + 1))
    lower = tuple(u - alpha for u in upper)
    return upper, lower


def edge_tensors(alpha: float, beta: float, label_range: Tuple[float, float], dtype: torch.dtype,
                 device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """The edges as 1-D tensors, rounded once from float64 to ``dtype`` (the relevance
    dtype): the reference and the native kernels compare relevance against these same
    values, so they agree exactly on window membership."""
    upper, lower = sw_edges(alpha, beta, label_range)
    return (torch.tensor(upper, dtype=dtype, device=device),   # each float64 rounded to dtype
            torch.tensor(lower, dtype=dtype, device=device))


def kendall_sw_per_query(sim: torch.Tensor, relevance: torch.Tensor, upper: torch.Tensor,
                         lower: torch.Tensor) -> torch.Tensor:
    """Loss of each row of sim (Q, C), shape (Q,), for windows with edges upper, lower
    (1-D, length M_w, in relevance's dtype; see :func:`edge_tensors`):

        (1 / M_w) sum_m [s_{k*_m} - s_{j*_m}]+                                (Eq. 19)
        j*_m = argmin_{r_j >= u_m} s_j,   k*_m = argmax_{r_k < l_m} s_k       (Eq. 20)

    A window with no positive or no negative adds 0. Ties in the arg-min/max go to the
    lowest index (torch.argmin/argmax return the first occurrence). Computed in sim's
    dtype; the gradient is sparse: one +, one - per window with s_k* > s_j*."""
    n_w = upper.shape[0]
    inf = torch.tensor(float("inf"), dtype=sim.dtype, device=sim.device)
    total = sim.new_zeros(sim.shape[0])
    for m in range(n_w):
        pos = relevance >= upper[m]  # Eq. 18: positive sample set of window m
        neg = relevance < lower[m]   # Eq. 18: negative sample set of window m
        j = torch.where(pos, sim, inf).argmin(dim=1, keepdim=True)   # Eq. 20: furthest positive
        k = torch.where(neg, sim, -inf).argmax(dim=1, keepdim=True)  # Eq. 20: closest negative
        hinge = torch.relu(sim.gather(1, k) - sim.gather(1, j)).squeeze(1)
        valid = pos.any(dim=1) & neg.any(dim=1)
        total = total + torch.where(valid, hinge, torch.zeros_like(hinge))
    return total / n_w  # Eq. 19: average over the M_w windows
