"""kendall_sw_loss: Python -> custom ops -> kernels (SPEC.md 2.3, paper 001 Eq. 18-20).

Native path: ``fastrank::kendall_sw_fwd`` finds, for every query and window, the hard
pair (j*, k*) in one pass over the query's row and returns the per-query losses and
those indices (int32, -1 for an empty set); ``fastrank::kendall_sw_bwd`` scatters the
sparse gradient from the indices (csrc/cpu/kendall_sw.cpp, csrc/cuda/kendall_sw.cu).
The window edges are computed once in float64 and rounded to the relevance dtype by
fastrank.reference.kendall_sw.edge_tensors, for both the kernels and the reference.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _validation as V
from .._native import has_native
from .._reduce import per_direction
from ..reference.kendall_sw import edge_tensors, kendall_sw_per_query
from ._launch import acc_dtype, call, kernel_dtype, mat

_INT32_MAX = 2**31 - 1


@torch.library.custom_op("fastrank::kendall_sw_fwd", mutates_args=())
def kendall_sw_fwd(sim: Tensor, relevance: Tensor, upper: Tensor, lower: Tensor) -> tuple[Tensor, Tensor]:
    """sim (Q, C) any strides; relevance (Q, C); upper, lower (M_w,) window edges, all
    read in the accumulation dtype. Returns (loss (Q,) in the accumulation dtype,
    idx (Q, M_w, 2) int32 = (j*, k*) per window, -1 for an empty set)."""
    sim = sim.to(kernel_dtype(sim))
    acc = acc_dtype(sim.dtype)
    relevance = relevance.to(acc)
    upper = upper.to(acc).contiguous()
    lower = lower.to(acc).contiguous()
    q, c = sim.shape
    n_w = upper.shape[0]
    loss = sim.new_empty((q,), dtype=acc)
    idx = torch.empty((q, n_w, 2), dtype=torch.int32, device=sim.device)
    call("kendall_sw_forward", sim, *mat(sim), *mat(relevance), q, c, upper.data_ptr(),
         lower.data_ptr(), n_w, loss.data_ptr(), idx.data_ptr())
    return loss, idx


@kendall_sw_fwd.register_fake
def _(sim, relevance, upper, lower):
    q = sim.shape[0]
    return (sim.new_empty((q,), dtype=acc_dtype(sim.dtype)),
            torch.empty((q, upper.shape[0], 2), dtype=torch.int32, device=sim.device))


@torch.library.custom_op("fastrank::kendall_sw_bwd", mutates_args=())
def kendall_sw_bwd(grad_loss: Tensor, sim: Tensor, idx: Tensor) -> Tensor:
    """d sum_q(grad_loss[q] * loss[q]) / d sim, contiguous, in sim's dtype."""
    out_dtype = sim.dtype
    sim = sim.to(kernel_dtype(sim))
    q, c = sim.shape
    grad_loss = grad_loss.to(acc_dtype(sim.dtype)).contiguous()
    idx = idx.contiguous()
    grad = torch.empty((q, c), dtype=sim.dtype, device=sim.device)
    call("kendall_sw_backward", sim, *mat(sim), q, c, idx.data_ptr(), idx.shape[1],
         grad_loss.data_ptr(), grad.data_ptr())
    return grad.to(out_dtype)


@kendall_sw_bwd.register_fake
def _(grad_loss, sim, idx):
    return torch.empty(sim.shape, dtype=sim.dtype, device=sim.device)


def _setup_context(ctx, inputs, output):
    sim, relevance, upper, lower = inputs
    ctx.save_for_backward(sim, output[1])


def _backward(ctx, grad_loss, grad_idx):
    sim, idx = ctx.saved_tensors
    return kendall_sw_bwd(grad_loss, sim, idx), None, None, None


torch.library.register_autograd("fastrank::kendall_sw_fwd", _backward, setup_context=_setup_context)


def _check_windows(alpha: float, beta: float, label_range) -> None:
    lo, hi = label_range
    n_w = round((hi - lo - alpha) / beta)
    if n_w < 1:
        raise ValueError(
            f"alpha={alpha}, beta={beta} and label_range={label_range} give "
            f"M_w = round((hi - lo - alpha) / beta) = {n_w} windows; need at least 1 "
            f"(alpha must be below hi - lo, and beta small enough)")
    if n_w > _INT32_MAX:
        raise ValueError(f"beta={beta} gives {n_w} windows, more than the kernels index")


def kendall_sw_loss(sim: Tensor, relevance: Tensor, alpha: float = 0.1, beta: float = 0.05,
                    label_range=(0.0, 1.0), direction: str = "both", reduction: str = "mean",
                    impl: str = "auto") -> Tensor:
    """Kendall loss with sliding-window sampling and hard-sample mining, SW-HS
    (SPEC.md 2.3; paper 001, Eq. 18-20).

    Windows m = 1..M_w, M_w = round((hi - lo - alpha) / beta), with upper edge
    u_m = hi - (m - 1) * beta and lower edge l_m = u_m - alpha (edges computed in
    float64, then rounded to the relevance dtype). Per query and window: the positive
    with the lowest score among {j : r_j >= u_m} and the negative with the highest score
    among {k : r_k < l_m} (ties: lowest index); loss = (1 / M_w) * sum_m [s_k* - s_j*]+,
    an empty set adding 0.

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        relevance: (N, M) graded relevance; no gradient flows to it.
        alpha: window size, the relaxation (>= 0).
        beta: stride between windows (> 0).
        label_range: (lo, hi) range of the relevance labels, lo < hi.
        direction: "i2t", "t2i" or "both" (sum of the two).
        reduction: "mean", "sum" or "none".
        impl: "auto", "native" or "reference".
    Returns:
        a scalar, or (N,) / (M,) / (N + M,) per-query losses for reduction="none";
        in the accumulation dtype (float32, or float64 for float64 sim).
    """
    V.check_sim(sim)
    V.check_relevance(relevance, sim)
    alpha = V.check_nonnegative(alpha, "alpha")
    beta = V.check_positive(beta, "beta")
    label_range = V.check_interval(label_range, "label_range")
    _check_windows(alpha, beta, label_range)
    V.check_direction(direction)
    V.check_reduction(reduction)
    impl = V.check_impl(impl)
    acc = acc_dtype(sim.dtype)
    relevance = relevance.detach().to(acc)
    upper, lower = edge_tensors(alpha, beta, label_range, acc, sim.device)
    if not has_native(sim.device, impl, "kendall_sw_loss"):
        def per_query(s, r):
            return kendall_sw_per_query(s.to(acc), r, upper, lower)
    else:
        if max(sim.shape) > _INT32_MAX:
            raise ValueError(f"sim has {max(sim.shape)} candidates per query; the native kernels "
                             f"index at most {_INT32_MAX} (use impl='reference')")

        def per_query(s, r):
            return kendall_sw_fwd(s, r, upper, lower)[0]
    return per_direction(direction, reduction, per_query, sim, relevance)


class KendallSWLoss(torch.nn.Module):
    """Module form of :func:`fastrank.kendall_sw_loss`: ``loss = KendallSWLoss()(sim, relevance)``."""

    def __init__(self, alpha: float = 0.1, beta: float = 0.05, label_range=(0.0, 1.0),
                 direction: str = "both", reduction: str = "mean", impl: str = "auto"):
        super().__init__()
        self.alpha = V.check_nonnegative(alpha, "alpha")
        self.beta = V.check_positive(beta, "beta")
        self.label_range = V.check_interval(label_range, "label_range")
        _check_windows(self.alpha, self.beta, self.label_range)
        self.direction = V.check_direction(direction)
        self.reduction = V.check_reduction(reduction)
        self.impl = impl if impl == "auto" else V.check_impl(impl)

    def forward(self, sim: Tensor, relevance: Tensor) -> Tensor:
        return kendall_sw_loss(sim, relevance, self.alpha, self.beta, self.label_range, self.direction,
                               self.reduction, self.impl)

    def extra_repr(self) -> str:
        return (f"alpha={self.alpha}, beta={self.beta}, label_range={self.label_range}, "
                f"direction={self.direction!r}, reduction={self.reduction!r}")
