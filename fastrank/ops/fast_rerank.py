"""fast_rerank: Python -> custom op -> kernel (SPEC.md 3, paper 004 Eq. 13-15).

Native path: ``fastrank::fast_rerank_fwd`` computes the column log-sum-exp of gamma1 * sim
and the row log-sum-exp of lam1 * sim in one read of sim, then writes both score matrices
in one more sweep; it also returns the two statistics (O(N + M)), which are all that
``fastrank::fast_rerank_bwd`` needs besides sim to write d loss / d sim in two sweeps
(csrc/cpu/fast_rerank.cpp, csrc/cuda/fast_rerank.cu). Nothing (N, M)-sized is allocated
besides the outputs (and the gradient). ``fastrank::fast_rerank_lse`` is the statistics
sweep alone, used by :func:`fastrank.fast_rerank_topk`.

Gradient (G1 = dL/d i2t, G2 = dL/d t2i, P = softmax over each column of gamma1 * sim,
Q = softmax over each row of lam1 * sim):
    dL/d sim = gamma2 G1 - gamma1 P * colsum(G1) + lam2 G2 - lam1 Q * rowsum(G2).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _validation as V
from .._native import native_module
from ..reference.fast_rerank import fast_rerank as fast_rerank_reference
from ._launch import acc_dtype, call, kernel_dtype, mat, module_for


def _workspace(x: Tensor) -> Tensor:
    """Per-tile partial statistics of the kernels: O(N * M / 64) values at most."""
    n, m = x.shape
    size = int(module_for(x).fast_rerank_workspace(n, m))
    return torch.empty((size,), dtype=acc_dtype(x.dtype), device=x.device)


@torch.library.custom_op("fastrank::fast_rerank_lse", mutates_args=())
def fast_rerank_lse(sim: Tensor, gamma1: float, lam1: float) -> tuple[Tensor, Tensor]:
    """sim (N, M) any strides. Returns (col_lse (M,), row_lse (N,)) in the accumulation
    dtype: col_lse[j] = logsumexp_l(gamma1 * sim[l, j]), row_lse[i] = logsumexp_l(lam1 * sim[i, l])."""
    x = sim.to(kernel_dtype(sim))
    acc = acc_dtype(x.dtype)
    n, m = x.shape
    col_lse = x.new_empty((m,), dtype=acc)
    row_lse = x.new_empty((n,), dtype=acc)
    ws = _workspace(x)  # held in a variable: it must outlive the call
    call("fast_rerank_lse", x, *mat(x), n, m, float(gamma1), float(lam1), ws.data_ptr(),
         col_lse.data_ptr(), row_lse.data_ptr())
    return col_lse, row_lse


@fast_rerank_lse.register_fake
def _(sim, gamma1, lam1):
    acc = acc_dtype(sim.dtype)
    return sim.new_empty((sim.shape[1],), dtype=acc), sim.new_empty((sim.shape[0],), dtype=acc)


@torch.library.custom_op("fastrank::fast_rerank_fwd", mutates_args=())
def fast_rerank_fwd(sim: Tensor, gamma1: float, gamma2: float, lam1: float,
                    lam2: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """sim (N, M) any strides. Returns (i2t (N, M), t2i (N, M)) contiguous in sim's dtype and
    (col_lse (M,), row_lse (N,)) in the accumulation dtype."""
    out_dtype = sim.dtype
    x = sim.to(kernel_dtype(sim))
    acc = acc_dtype(x.dtype)
    n, m = x.shape
    i2t = torch.empty((n, m), dtype=x.dtype, device=x.device)
    t2i = torch.empty((n, m), dtype=x.dtype, device=x.device)
    col_lse = x.new_empty((m,), dtype=acc)
    row_lse = x.new_empty((n,), dtype=acc)
    ws = _workspace(x)
    call("fast_rerank_forward", x, *mat(x), n, m, float(gamma1), float(gamma2), float(lam1), float(lam2),
         ws.data_ptr(), col_lse.data_ptr(), row_lse.data_ptr(), i2t.data_ptr(), t2i.data_ptr())
    return i2t.to(out_dtype), t2i.to(out_dtype), col_lse, row_lse


@fast_rerank_fwd.register_fake
def _(sim, gamma1, gamma2, lam1, lam2):
    n, m = sim.shape
    acc = acc_dtype(sim.dtype)
    return (sim.new_empty((n, m)), sim.new_empty((n, m)), sim.new_empty((m,), dtype=acc),
            sim.new_empty((n,), dtype=acc))


def _strided(g: Optional[Tensor], dtype: torch.dtype):
    """(tensor kept alive, pointer, row stride, column stride); pointer 0 = zero gradient."""
    if g is None:
        return None, 0, 0, 0
    g = g.to(dtype)
    return (g, *mat(g))


@torch.library.custom_op("fastrank::fast_rerank_bwd", mutates_args=())
def fast_rerank_bwd(grad_i2t: Optional[Tensor], grad_t2i: Optional[Tensor], sim: Tensor, col_lse: Tensor,
                    row_lse: Tensor, gamma1: float, gamma2: float, lam1: float, lam2: float) -> Tensor:
    """d (sum(grad_i2t * i2t) + sum(grad_t2i * t2i)) / d sim, contiguous, in sim's dtype.
    A None gradient counts as zero; gradients may have any strides (expanded ones too)."""
    out_dtype = sim.dtype
    x = sim.to(kernel_dtype(sim))
    n, m = x.shape
    g1_keep, g1_ptr, g1_sr, g1_sc = _strided(grad_i2t, x.dtype)
    g2_keep, g2_ptr, g2_sr, g2_sc = _strided(grad_t2i, x.dtype)
    grad = torch.empty((n, m), dtype=x.dtype, device=x.device)
    ws = _workspace(x)
    call("fast_rerank_backward", x, *mat(x), n, m, g1_ptr, g1_sr, g1_sc, g2_ptr, g2_sr, g2_sc,
         col_lse.data_ptr(), row_lse.data_ptr(), float(gamma1), float(gamma2), float(lam1), float(lam2),
         ws.data_ptr(), grad.data_ptr())
    del g1_keep, g2_keep
    return grad.to(out_dtype)


@fast_rerank_bwd.register_fake
def _(grad_i2t, grad_t2i, sim, col_lse, row_lse, gamma1, gamma2, lam1, lam2):
    return torch.empty(sim.shape, dtype=sim.dtype, device=sim.device)


def _setup_context(ctx, inputs, output):
    sim, gamma1, gamma2, lam1, lam2 = inputs
    ctx.save_for_backward(sim, output[2], output[3])
    ctx.mark_non_differentiable(output[2], output[3])
    ctx.hyper = (gamma1, gamma2, lam1, lam2)


def _backward(ctx, grad_i2t, grad_t2i, grad_col_lse, grad_row_lse):
    sim, col_lse, row_lse = ctx.saved_tensors
    grad = fast_rerank_bwd(grad_i2t, grad_t2i, sim, col_lse, row_lse, *ctx.hyper)
    return grad, None, None, None, None


torch.library.register_autograd("fastrank::fast_rerank_fwd", _backward, setup_context=_setup_context)


def fast_rerank(sim: Tensor, gamma: Tuple[float, float] = (25.0, 25.0), lam: Tuple[float, float] = (20.0, 20.0),
                impl: str = "auto") -> Tuple[Tensor, Tensor]:
    """Fast re-ranking of a similarity matrix (SPEC.md 3; paper 004, Eq. 13-15), in log space.

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        gamma: (gamma1, gamma2) > 0 of the i2t scores (each column normalised).
        lam: (lam1, lam2) > 0 of the t2i scores (each row normalised).
        impl: "auto", "native" or "reference".

    Returns:
        (i2t_scores, t2i_scores), both (N, M) in sim's dtype:
        i2t_scores[i, j] = gamma2 * sim[i, j] - logsumexp_l(gamma1 * sim[l, j]) ranks the
        captions j of image i; t2i_scores[i, j] = lam2 * sim[i, j] - logsumexp_l(lam1 * sim[i, l])
        ranks the images i of caption j. exp() of them are the paper's matrices.
        Differentiable with respect to sim.
    """
    V.check_tensor(sim, "sim", 2, finite=False)
    g1, g2 = V.check_pair(gamma, "gamma")
    l1, l2 = V.check_pair(lam, "lam")
    impl = V.check_impl(impl)
    if native_module(sim.device, impl, "fast_rerank") is None:
        V.check_sim(sim)
        i2t, t2i = fast_rerank_reference(sim.to(acc_dtype(sim.dtype)), (g1, g2), (l1, l2))
        return i2t.to(sim.dtype), t2i.to(sim.dtype)
    i2t, t2i, col_lse, row_lse = fast_rerank_fwd(sim, g1, g2, l1, l2)
    check_statistics(col_lse, row_lse)
    return i2t, t2i


def check_statistics(col_lse: Tensor, row_lse: Tensor) -> None:
    """The finiteness check of sim, from the kernels' O(N + M) statistics: a NaN or +-inf in
    sim (or gamma1 * sim, lam1 * sim overflowing) makes them non-finite. Reading them instead
    of sim spares a pass over sim and the (N, M) temporaries of torch.isfinite(sim)."""
    if V.check_finite_enabled() and not bool(torch.isfinite(col_lse).all() & torch.isfinite(row_lse).all()):
        raise ValueError("sim contains NaN or infinite values (or gamma[0] * sim or lam[0] * sim "
                         "overflows the dtype)")


class FastRerank(torch.nn.Module):
    """Module form of :func:`fastrank.fast_rerank`: ``i2t, t2i = FastRerank()(sim)``."""

    def __init__(self, gamma: Tuple[float, float] = (25.0, 25.0), lam: Tuple[float, float] = (20.0, 20.0),
                 impl: str = "auto"):
        super().__init__()
        self.gamma = V.check_pair(gamma, "gamma")
        self.lam = V.check_pair(lam, "lam")
        self.impl = impl if impl == "auto" else V.check_impl(impl)

    def forward(self, sim: Tensor) -> Tuple[Tensor, Tensor]:
        return fast_rerank(sim, self.gamma, self.lam, self.impl)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, lam={self.lam}"
