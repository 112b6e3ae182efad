"""kendall_loss: Python -> custom op -> kernel (SPEC.md 2.2, paper 001 Eq. 17).

Native path: ``fastrank::kendall_fwd`` computes the per-query losses and, in the same
pass over the pairs, the gradient row d loss[q] / d sim[q, :] (csrc/cpu/kendall.cpp,
csrc/cuda/kendall.cu). The row is saved, so the backward is a broadcast multiply
(grad_loss[:, None] * dsim), written in plain torch: there is no second O(C^2) pass,
which makes forward+backward about half the work of recomputing the pairs. The op is
registered with torch.library, so torch.compile and opcheck see a real op.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _validation as V
from .._native import has_native
from .._reduce import per_direction
from ..reference.kendall import kendall_per_query
from ._launch import acc_dtype, call, kernel_dtype, mat


@torch.library.custom_op("fastrank::kendall_fwd", mutates_args=())
def kendall_fwd(sim: Tensor, relevance: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
    """sim (Q, C) any strides; relevance (Q, C) (read in the accumulation dtype).
    Returns (loss (Q,), dsim (Q, C) = d loss[q] / d sim[q, :]) in the accumulation dtype."""
    sim = sim.to(kernel_dtype(sim))
    acc = acc_dtype(sim.dtype)
    relevance = relevance.to(acc)
    q, c = sim.shape
    loss = sim.new_empty((q,), dtype=acc)
    dsim = sim.new_empty((q, c), dtype=acc)
    call("kendall_forward", sim, *mat(sim), *mat(relevance), q, c, float(alpha),
         loss.data_ptr(), dsim.data_ptr())
    return loss, dsim


@kendall_fwd.register_fake
def _(sim, relevance, alpha):
    acc = acc_dtype(sim.dtype)
    return sim.new_empty((sim.shape[0],), dtype=acc), sim.new_empty(sim.shape, dtype=acc)


def _setup_context(ctx, inputs, output):
    sim, relevance, alpha = inputs
    ctx.save_for_backward(output[1])
    ctx.sim_dtype = sim.dtype


def _backward(ctx, grad_loss, grad_dsim):
    (dsim,) = ctx.saved_tensors
    grad = grad_loss.to(dsim.dtype).unsqueeze(1) * dsim
    return grad.to(ctx.sim_dtype), None, None


torch.library.register_autograd("fastrank::kendall_fwd", _backward, setup_context=_setup_context)


def kendall_loss(sim: Tensor, relevance: Tensor, alpha: float = 0.1, direction: str = "both",
                 reduction: str = "mean", impl: str = "auto") -> Tensor:
    """Kendall ranking loss (SPEC.md 2.2; paper 001, Eq. 17), the full pairwise form.

    Per query: sum over pairs (j, k) with r_j > r_k + alpha of [s_k - s_j]+, divided by
    max(1, number of such pairs). The subgradient of [x]+ at 0 is 0.

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        relevance: (N, M) graded relevance; no gradient flows to it.
        alpha: relaxation (>= 0): pairs whose relevance differs by alpha or less are ignored.
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
    V.check_direction(direction)
    V.check_reduction(reduction)
    impl = V.check_impl(impl)
    acc = acc_dtype(sim.dtype)
    relevance = relevance.detach().to(acc)
    if not has_native(sim.device, impl, "kendall_loss"):
        def per_query(s, r):
            return kendall_per_query(s.to(acc), r, alpha)
    else:
        def per_query(s, r):
            return kendall_fwd(s, r, alpha)[0]
    return per_direction(direction, reduction, per_query, sim, relevance)


class KendallLoss(torch.nn.Module):
    """Module form of :func:`fastrank.kendall_loss`: ``loss = KendallLoss()(sim, relevance)``."""

    def __init__(self, alpha: float = 0.1, direction: str = "both", reduction: str = "mean",
                 impl: str = "auto"):
        super().__init__()
        self.alpha = V.check_nonnegative(alpha, "alpha")
        self.direction = V.check_direction(direction)
        self.reduction = V.check_reduction(reduction)
        self.impl = impl if impl == "auto" else V.check_impl(impl)

    def forward(self, sim: Tensor, relevance: Tensor) -> Tensor:
        return kendall_loss(sim, relevance, self.alpha, self.direction, self.reduction, self.impl)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, direction={self.direction!r}, reduction={self.reduction!r}"
