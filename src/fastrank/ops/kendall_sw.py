"""kendall_sw_loss: Python -> one fused op -> kernels (docs/spec.md §2.3, BCLS Eq. 18-20).

Native path: one forward kernel call (``fastrank::kendall_sw``) finds, for every query
of every requested direction (t2i through swapped strides) and every window, the hard
pair (j*, k*) in one pass over the query's row, and reduces the per-query losses; it
returns the loss, those indices (int32, -1 for an empty set) and a small aux buffer
(per-query losses, reduction coefficients). ``fastrank::kendall_sw_backward`` scatters
the sparse gradient from the indices, scaling by grad_output read from device memory
(csrc/cpu/kendall_sw.cpp, csrc/cuda/kendall_sw.cu). The window edges are computed by the
kernels from (alpha, beta, hi, M_w) passed as scalars, in float64 exactly as
fastrank.reference.kendall_sw.sw_edges does, then rounded to the relevance dtype: no
tensor is built or copied per call, so the op can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _validation as V
from .._native import DTYPE_CODE, has_native, query_count
from .._reduce import per_direction
from ..reference.kendall_sw import edge_tensors, kendall_sw_per_query
from ._floor import rw_bytes
from ._launch import DIRECTION_CODE, REDUCTION_CODE, acc_dtype, kernel, kernel_relevance, mat
from .kendall import empty_outputs
from . import _contract as C
from ._module import ModuleForm
from ._native_op import NativeOp
from ._row import Loss

_INT32_MAX = 2**31 - 1


# the fields of KendallSwForward / KendallSwBackward (kendall_sw.h), in order
_FORWARD = kernel("kendall_sw_forward", "lists rel_dt sim rel alpha beta hi n_w loss idx aux")
_BACKWARD = kernel("kendall_sw_backward", "lists sim idx n_w aux grad_out grad")


def _forward(sim: Tensor, relevance: Tensor, alpha: float, beta: float, hi: float, n_w: int, direction: int,
             reduction: int):
    """sim in its kernel dtype, relevance in any float dtype (read in sim's dtype or the
    accumulation dtype; any strides). Returns (loss, idx (n_total, n_w, 2) int32, aux), see kendall_sw.h."""
    n, m = sim.shape
    relevance = kernel_relevance(sim, relevance)
    idx = torch.empty((query_count(n, m, direction), n_w, 2), dtype=torch.int32, device=sim.device)
    loss, idx, aux = empty_outputs(sim, direction, reduction, idx)
    _FORWARD(sim, n, m, direction, reduction, DTYPE_CODE[relevance.dtype], *mat(sim),
         *mat(relevance), alpha, beta, hi, n_w, loss.data_ptr(), idx.data_ptr(), aux.data_ptr())
    return loss, idx, aux


def _backward(grad_loss: Tensor, sim: Tensor, idx: Tensor, aux: Tensor, direction: int, reduction: int) -> Tensor:
    """d (grad_loss . loss) / d sim, contiguous, in sim's dtype."""
    n, m = sim.shape
    go = grad_loss.to(aux.dtype).contiguous()
    grad = torch.empty((n, m), dtype=sim.dtype, device=sim.device)
    _BACKWARD(sim, n, m, direction, reduction, *mat(sim), idx.data_ptr(), idx.shape[1],
         aux.data_ptr(), go.data_ptr(), grad.data_ptr())
    return grad


def _fake_forward(sim, relevance, alpha, beta, hi, n_w, direction, reduction):
    idx = torch.empty((query_count(*sim.shape, direction), n_w, 2), dtype=torch.int32, device=sim.device)
    return empty_outputs(sim, direction, reduction, idx)


# fastrank::kendall_sw -> (loss, idx, aux), fastrank::kendall_sw_backward, the eager
# Function and the switch between them: src/fastrank/ops/_native_op.py
KENDALL_SW = NativeOp("kendall_sw", _forward, ("loss", "idx", "aux"), _fake_forward, _backward)
kendall_sw_op = KENDALL_SW.op
kendall_sw_backward_op = KENDALL_SW.backward.op


def floor(mode: str, size: dict, itemsize: int) -> dict:
    """The benchmarks' floor (src/fastrank/ops/_floor.py): bytes-bound, one window placement
    per element and direction."""
    n, m = size["n"], size["m"]
    scans = 0 if mode == "backward" else 2 * n * m
    return {"bytes": rw_bytes(mode, n, m, itemsize), "fp32": 2 * 4 * n * m, "cmp_select_add": scans}


def _check_windows(alpha: float, beta: float, label_range) -> int:
    lo, hi = label_range
    n_w = round((hi - lo - alpha) / beta)
    if n_w < 1:
        raise ValueError(
            f"alpha={alpha}, beta={beta} and label_range={label_range} give "
            f"M_w = round((hi - lo - alpha) / beta) = {n_w} windows; need at least 1 "
            f"(alpha must be below hi - lo, and beta small enough)")
    if n_w > _INT32_MAX:
        raise ValueError(f"beta={beta} gives {n_w} windows, more than the kernels index")
    return n_w


def _check_hyper(alpha, beta, label_range, direction, reduction):
    """The hyper-parameters as the op uses them (the windows checked), or the error that names
    the bad one."""
    alpha = V.check_nonnegative(alpha, "alpha")
    beta = V.check_positive(beta, "beta")
    label_range = V.check_interval(label_range, "label_range")
    _check_windows(alpha, beta, label_range)
    return alpha, beta, label_range, V.check_direction(direction), V.check_reduction(reduction)


def kendall_sw_loss(sim: Tensor, relevance: Tensor, alpha: float = 0.1, beta: float = 0.05,
                    label_range=(0.0, 1.0), direction: str = "both", reduction: str = "mean",
                    impl: str = "auto") -> Tensor:
    """Kendall loss with sliding-window sampling and hard-sample mining, SW-HS
    (docs/spec.md §2.3; BCLS, Eq. 18-20).

    Windows m = 1..M_w, M_w = round((hi - lo - alpha) / beta), with upper edge
    u_m = hi - (m - 1) * beta and lower edge l_m = u_m - alpha (edges computed in
    float64, then rounded to the relevance dtype). Per query and window: the positive
    with the lowest score among {j : r_j >= u_m} and the negative with the highest score
    among {k : r_k < l_m} (ties: lowest index); loss = (1 / M_w) * sum_m [s_k* - s_j*]+,
    an empty set adding 0.

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        relevance: (N, M) graded relevance, every value in label_range; no gradient
            flows to it.
        alpha: window size, the relaxation (>= 0).
        beta: stride between windows (> 0).
        label_range: (lo, hi) range of the relevance labels, lo < hi.
        direction: "i2t", "t2i" or "both" (sum of the two).
        reduction: "mean", "sum" or "none".
        impl: "auto", "native" or "reference".
    Returns:
        a scalar, or (N,) / (M,) / (N + M,) per-query losses for reduction="none";
        in the accumulation dtype (float32, or float64 for float64 sim).
    Bad input (docs/spec.md §1): structure and hyper-parameters first, then one pass per tensor
    where the value check is on (CPU by default): NaN/inf, or a relevance outside
    label_range, raise ValueError.
    """
    return _kendall_sw_loss(_check_hyper, sim, relevance, alpha, beta, label_range, direction, reduction, impl)


def _kendall_sw_loss(check_hyper, sim, relevance, alpha, beta, label_range, direction, reduction, impl):
    """kendall_sw_loss with its hyper-parameters checked by ``check_hyper``: the op's own, or, for
    its module form, none (the module checked them when they were set)."""
    V.check_sim(sim, values=False)
    V.check_relevance(relevance, sim, values=False)
    alpha, beta, label_range, direction, reduction = check_hyper(alpha, beta, label_range, direction, reduction)
    n_w = _check_windows(alpha, beta, label_range)
    impl = V.check_impl(impl)
    V.check_data(sim, relevance, label_range=label_range, loss="kendall_sw_loss")
    acc = acc_dtype(sim.dtype)
    relevance = relevance.detach()
    if not has_native(sim.device, impl, "kendall_sw_loss"):
        upper, lower = edge_tensors(alpha, beta, label_range, acc, sim.device)

        def per_query(s, r):
            return kendall_sw_per_query(s.to(acc), r, upper, lower)
        return per_direction(direction, reduction, per_query, sim, relevance.to(acc))
    if max(sim.shape) > _INT32_MAX:
        raise ValueError(f"sim has {max(sim.shape)} candidates per query; the native kernels "
                         f"index at most {_INT32_MAX} (use impl='reference')")
    return KENDALL_SW(sim, relevance, alpha, beta, label_range[1], n_w, DIRECTION_CODE[direction],
                      REDUCTION_CODE[reduction])


class KendallSWLoss(ModuleForm, functional=kendall_sw_loss, inputs=("sim", "relevance"),
                    check=_check_hyper, checked=_kendall_sw_loss):
    """Module form of :func:`fastrank.kendall_sw_loss`: ``loss = KendallSWLoss()(sim, relevance)``."""


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
def _examples(dtype, seed=0, size=(5, 7)):
    g = C.gen(seed)
    sim, rel = C.scores(*size, dtype, g), torch.rand(*size, generator=g, dtype=dtype)
    return [C.Example("both, mean", {"sim": sim, "relevance": rel},
                      {"alpha": 0.1, "beta": 0.2, "label_range": (0.0, 1.0), "direction": "both",
                       "reduction": "mean", "impl": "native"}),
            C.Example("t2i, none", {"sim": sim, "relevance": rel},
                      {"alpha": 0.2, "beta": 0.1, "label_range": (0.0, 1.0), "direction": "t2i",
                       "reduction": "none", "impl": "native"})]


def _op_args(x, h):
    lo, hi = h["label_range"]
    n_w = _check_windows(h["alpha"], h["beta"], (lo, hi))
    return (x["sim"], x["relevance"], h["alpha"], h["beta"], hi, n_w, *C.codes(h))


CONTRACT = C.glue_contract(
    KENDALL_SW, _op_args, _examples,
    C.TENSOR_CASES + C.RELEVANCE_CASES + C.HYPER_CASES + (
        C.BadInput("relevance outside label_range", ValueError, "relevance",
                   inputs=lambda x: {"relevance": x["relevance"] + 2}),
        C.BadInput("alpha < 0", ValueError, "alpha", hyper={"alpha": -0.1}),
        C.BadInput("beta = 0", ValueError, "beta", hyper={"beta": 0.0}),
        C.BadInput("label_range with lo > hi", ValueError, "label_range", hyper={"label_range": (1.0, 0.0)})))


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("kendall_sw", kendall_sw_loss, KendallSWLoss, CONTRACT, floor=floor, compat=("sentence_transformers",)),)
