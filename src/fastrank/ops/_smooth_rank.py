"""The native path shared by the smooth-rank engine's subset heads, smooth_ap and
recall_at_k (csrc/cpu/smooth_rank.h, csrc/cuda/smooth_rank.cuh).

One forward kernel call per loss call computes every requested direction (t2i through
swapped strides), the reduction, and each query's gradient row G = d loss_q / d sim
(csrc/include/fastrank/params.h, SmoothRankLayout: the workspace ``ws``), in pair work O(|P| * M) per
query: the positives are the rows the engine ranks. The backward, the same for both heads,
is one elementwise kernel call (``fastrank::smooth_rank_backward``) that scales G by the
upstream gradient: no second pair pass, no host sync.
"""
from __future__ import annotations

from typing import Optional, Sequence

from torch import Tensor

from .. import _validation as V
from .._native import acc_dtype, has_native, query_count, smooth_rank_ws_numel
from ._floor import PASSES
from ._launch import cuda_kernels, kernel, mask_args, mat, module_for
from ._native_op import Backward


# the fields of SmoothApForward (smooth_ap.h), in order; a head adds its own after them
FORWARD_FIELDS = "lists version sim pos mask tau with_grad out ws partials"


def forward(kernel, sim: Tensor, positives: Tensor, mask: Optional[Tensor], head_args: Sequence,
            tau: float, direction: int, reduction: int, version: int, with_grad: bool = True):
    """(loss, ws) of the forward kernel ``kernel`` (smooth_ap_forward's or recall_at_k_forward's
    call, ``_launch.kernel``): loss is () for mean/sum, (Q,) for none, in the accumulation
    dtype. head_args: the head's own fields, after smooth_ap's (recall_at_k: ks, tau_k, their
    count). version: the CUDA kernels' (``fastrank.kernel_variant``). sim: as its kernels read
    it (``NativeOp`` converts it once)."""
    s = sim
    acc = acc_dtype(s.dtype)
    n, m = s.shape
    out = s.new_empty((query_count(n, m, direction),) if reduction == 0 else (), dtype=acc)
    ws = s.new_empty((smooth_rank_ws_numel(n, m, direction),), dtype=acc)
    part = s.new_empty((module_for(s).smooth_rank_partials_numel(n, m, direction),), dtype=acc) \
        if cuda_kernels(s) else None
    kernel(s, n, m, direction, reduction, version, *mat(s), *mat(positives), *mask_args(mask), tau, int(with_grad),
           out.data_ptr(), ws.data_ptr(), 0 if part is None else part.data_ptr(), *head_args)
    return out, ws


def backward_call(kernel, grad_out: Tensor, sim: Tensor, ws: Tensor, direction: int, reduction: int,
                  middle) -> Tensor:
    """The backward of a smooth-rank head (``kernel``: smooth_rank_backward's or smooth_ndcg_backward's
    call, ``_launch.kernel``):
    grad_out in ws's dtype (any stride: an expanded gradient is fine), the gradient allocated
    (n, m) in the dtype of sim, the forward's (as its kernels read it: autograd casts it back).
    ``middle(sim)``: the head's own fields between the list arguments and grad_out."""
    if grad_out.dtype != ws.dtype:
        grad_out = grad_out.to(ws.dtype)
    gs = grad_out.stride(0) if grad_out.dim() else 0
    n, m = sim.shape
    grad = sim.new_empty((n, m))
    kernel(sim, n, m, direction, reduction, *middle(sim), grad_out.data_ptr(), gs, ws.data_ptr(), grad.data_ptr())
    return grad


_BACKWARD = kernel("smooth_rank_backward", "lists mask grad_out ws grad")  # smooth_ap.h's SmoothRankBackward


def backward(grad_out: Tensor, sim: Tensor, mask: Optional[Tensor], ws: Tensor, direction: int,
             reduction: int) -> Tensor:
    """d (grad_out . loss) / d sim, contiguous, in sim's dtype."""
    return backward_call(_BACKWARD, grad_out, sim, ws, direction, reduction, lambda s: mask_args(mask))


# fastrank::smooth_rank_backward: the backward of fastrank::smooth_ap and fastrank::recall_at_k
BACKWARD = Backward("fastrank::smooth_rank_backward", backward)
smooth_rank_backward_op = BACKWARD.op


def floor(mode: str, size: dict, itemsize: int) -> dict:
    """The benchmarks' floor of Smooth-AP and Recall@k (src/fastrank/ops/_floor.py): the
    positives' smooth ranks only; with one positive per query (the diagonal), M exps per i2t
    query and N per t2i query, per pass."""
    n, m = size["n"], size["m"]
    return {"bytes": {"forward": 1, "backward": 2, "forward+backward": 2}[mode] * n * m * itemsize,
            "exp": PASSES[mode] * 2 * n * m}


def fake_forward(sim: Tensor, direction: int, reduction: int):
    """The (loss, ws) of a forward op of the engine (smooth-NDCG's, Smooth-AP's, Recall@k's),
    for its register_fake."""
    acc = acc_dtype(sim.dtype)
    n, m = sim.shape
    return (sim.new_empty((query_count(n, m, direction),) if reduction == 0 else (), dtype=acc),
            sim.new_empty((smooth_rank_ws_numel(n, m, direction),), dtype=acc))


def checked_inputs(sim: Tensor, positives, mask: Optional[Tensor], impl: str, loss: str, check_hyper, *hyper):
    """The public functions' checks of the positives-based losses (Smooth-AP, Recall@k), in
    docs/spec.md §1's order: each argument's structure, the hyper-parameters
    (``check_hyper(*hyper)``), then sim's values. Returns (positives as the kernels read it,
    the checked hyper-parameters, whether the native path runs)."""
    V.check_sim(sim, values=False)
    positives = V.check_positives(positives, sim)
    V.check_mask(mask, sim)
    hyper = check_hyper(*hyper)
    impl = V.check_impl(impl)
    V.check_data(sim, loss=loss)
    return positives, hyper, has_native(sim.device, impl, loss)
