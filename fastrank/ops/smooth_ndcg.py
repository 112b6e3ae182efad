"""smooth_ndcg_loss: Python -> custom op -> kernel (SPEC.md 2.1, paper 000 Eq. 16-21).

Native path: ``fastrank::smooth_ndcg_fwd`` computes per-query losses and saves the
smooth ranks pi (Q, C); ``fastrank::smooth_ndcg_bwd`` turns them into d loss / d sim
in one more pass (csrc/cpu/smooth_ndcg.cpp, csrc/cuda/smooth_ndcg.cu). Both are
registered with torch.library, so torch.compile and opcheck see real ops.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _validation as V
from .._native import has_native
from .._reduce import per_direction
from ..reference.ndcg_terms import idcg as ideal_dcg
from ..reference.smooth_ndcg import smooth_ndcg_per_query
from ._launch import acc_dtype, call, kernel_dtype, mat


@torch.library.custom_op("fastrank::smooth_ndcg_fwd", mutates_args=())
def smooth_ndcg_fwd(sim: Tensor, relevance: Tensor, idcg: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """sim (Q, C) any strides; relevance and idcg in the accumulation dtype.
    Returns (loss (Q,), pi (Q, C)) in the accumulation dtype."""
    sim = sim.to(kernel_dtype(sim))
    acc = acc_dtype(sim.dtype)
    q, c = sim.shape
    loss = sim.new_empty((q,), dtype=acc)
    pi = sim.new_empty((q, c), dtype=acc)
    call("smooth_ndcg_forward", sim, *mat(sim), *mat(relevance), q, c,
         idcg.data_ptr(), float(tau), loss.data_ptr(), pi.data_ptr())
    return loss, pi


@smooth_ndcg_fwd.register_fake
def _(sim, relevance, idcg, tau):
    acc = acc_dtype(sim.dtype)
    return sim.new_empty((sim.shape[0],), dtype=acc), sim.new_empty(sim.shape, dtype=acc)


@torch.library.custom_op("fastrank::smooth_ndcg_bwd", mutates_args=())
def smooth_ndcg_bwd(grad_loss: Tensor, sim: Tensor, relevance: Tensor, idcg: Tensor,
                    pi: Tensor, tau: float) -> Tensor:
    """d sum_q(grad_loss[q] * loss[q]) / d sim, contiguous, in sim's dtype."""
    out_dtype = sim.dtype
    sim = sim.to(kernel_dtype(sim))
    q, c = sim.shape
    grad_loss = grad_loss.to(pi.dtype).contiguous()
    grad = torch.empty((q, c), dtype=sim.dtype, device=sim.device)
    call("smooth_ndcg_backward", sim, *mat(sim), *mat(relevance), q, c,
         idcg.data_ptr(), pi.data_ptr(), grad_loss.data_ptr(), float(tau), grad.data_ptr())
    return grad.to(out_dtype)


@smooth_ndcg_bwd.register_fake
def _(grad_loss, sim, relevance, idcg, pi, tau):
    return torch.empty(sim.shape, dtype=sim.dtype, device=sim.device)


def _setup_context(ctx, inputs, output):
    sim, relevance, idcg, tau = inputs
    ctx.save_for_backward(sim, relevance, idcg, output[1])
    ctx.tau = tau


def _backward(ctx, grad_loss, grad_pi):
    sim, relevance, idcg, pi = ctx.saved_tensors
    return smooth_ndcg_bwd(grad_loss, sim, relevance, idcg, pi, ctx.tau), None, None, None


torch.library.register_autograd("fastrank::smooth_ndcg_fwd", _backward, setup_context=_setup_context)


def smooth_ndcg_loss(sim: Tensor, relevance: Tensor, tau: float = 0.01, direction: str = "both",
                     reduction: str = "mean", impl: str = "auto") -> Tensor:
    """Smooth-NDCG listwise loss (SPEC.md 2.1; paper 000, Eq. 16-21).

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        relevance: (N, M) graded relevance (2^r - 1 gains); no gradient flows to it.
        tau: temperature of the sigmoid that smooths the rank (> 0).
        direction: "i2t", "t2i" or "both" (sum of the two).
        reduction: "mean", "sum" or "none".
        impl: "auto", "native" or "reference".
    """
    V.check_sim(sim)
    V.check_relevance(relevance, sim)
    tau = V.check_positive(tau, "tau")
    V.check_direction(direction)
    V.check_reduction(reduction)
    impl = V.check_impl(impl)
    acc = acc_dtype(sim.dtype)
    relevance = relevance.detach().to(acc)
    if not has_native(sim.device, impl, "smooth_ndcg_loss"):
        def per_query(s, r):
            return smooth_ndcg_per_query(s.to(acc), r, tau)
    else:
        def per_query(s, r):
            return smooth_ndcg_fwd(s, r, ideal_dcg(r), tau)[0]
    return per_direction(direction, reduction, per_query, sim, relevance)


class SmoothNDCGLoss(torch.nn.Module):
    """Module form of :func:`fastrank.smooth_ndcg_loss`: ``loss = SmoothNDCGLoss()(sim, relevance)``."""

    def __init__(self, tau: float = 0.01, direction: str = "both", reduction: str = "mean",
                 impl: str = "auto"):
        super().__init__()
        self.tau = V.check_positive(tau, "tau")
        self.direction = V.check_direction(direction)
        self.reduction = V.check_reduction(reduction)
        self.impl = impl if impl == "auto" else V.check_impl(impl)

    def forward(self, sim: Tensor, relevance: Tensor) -> Tensor:
        return smooth_ndcg_loss(sim, relevance, self.tau, self.direction, self.reduction, self.impl)

    def extra_repr(self) -> str:
        return f"tau={self.tau}, direction={self.direction!r}, reduction={self.reduction!r}"
