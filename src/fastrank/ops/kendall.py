"""kendall_loss: Python -> one fused op -> kernel (docs/spec.md §2.2, 2.1a; BCLS Eq. 17).

Native path: one forward kernel call (``fastrank::kendall``) computes every requested
direction (t2i through swapped strides) and the reduction, and, in the same pass over
the pairs, the gradient of each per-query loss, d loss[q] / d sim (csrc/cpu/kendall.cpp,
csrc/cuda/kendall.cu). Those rows are saved, one (N, M) slab per direction, so the
backward (``fastrank::kendall_backward``) is one elementwise kernel that scales them by
grad_output, read from device memory: no second O(N M^2) pass, no host sync.
Eager calls go through an autograd.Function (the cheapest path); torch.compile traces
the torch.library custom ops (both made by src/fastrank/ops/_native_op.py from ``_forward`` /
``_backward``).
Memory: sim, relevance, at most two dsim slabs and the gradient: five N x M matrices.
"""
from __future__ import annotations

from typing import List, Optional, Union

import torch
from torch import Tensor

from .. import _validation as V
from .._native import has_native, kendall_aux_numel, query_count, variant_codes
from ..reference.kendall import kendall_reference
from ._floor import pair_count, rw_bytes
from ..topk import TopKRelevance
from ._launch import (DIRECTION_CODE, REDUCTION_CODE, acc_dtype, cuda_kernels, kernel, mask_args, mat, module_for,
                      graded_relevance, relevance_args)
from . import _contract as C
from ._module import ModuleForm
from ._native_op import Backward, NativeOp
from ._row import Loss


def empty_outputs(sim: Tensor, direction: int, reduction: int, middle: Tensor) -> tuple:
    """The forward outputs of the Kendall kernels (kendall_sw's too), allocated for the kernel
    and by the fake forward alike: the loss ((queries,) for reduction "none", else a scalar), the
    op's own ``middle`` output, aux; in the accumulation type."""
    n, m = sim.shape
    acc = acc_dtype(sim.dtype)
    loss = sim.new_empty((query_count(n, m, direction),) if reduction == 0 else (), dtype=acc)
    return loss, middle, sim.new_empty((kendall_aux_numel(n, m, direction),), dtype=acc)


# the fields of KendallForward / KendallBackward (kendall.h), in order
_FORWARD = kernel("kendall_forward", "lists rel_dt sim rel mask rel_i2t rel_t2i paths alpha loss dsim aux partials")
_BACKWARD = kernel("kendall_backward", "lists dsim aux grad_out grad")


def _forward(sim: Tensor, relevance: Optional[Tensor], mask: Optional[Tensor], lists: List[Tensor],
             alpha: float, direction: int, reduction: int, paths: int):
    """sim in its kernel dtype, relevance in any float dtype (read in sim's dtype or the
    accumulation dtype), or None and ``lists`` (a TopKRelevance's rows and columns:
    ``_launch.relevance_lists``), mask bool or None (any strides). Returns (loss, dsim (n_dir,
    N, M), aux), see kendall.h. paths: the pair pass's code (``fastrank.kernel_variant``)."""
    n, m = sim.shape
    acc = acc_dtype(sim.dtype)
    rel_dt, rel, rel_lists, _held = relevance_args(sim, relevance, lists)  # lists: never an (n, m) matrix
    loss, dsim, aux = empty_outputs(sim, direction, reduction,
                                    sim.new_empty((2 if direction == 3 else 1, n, m), dtype=acc))
    # CUDA: the forward's scratch (kendall.h: each block's gathered list)
    part = sim.new_empty((module_for(sim).kendall_partials_numel(n, m, direction),), dtype=acc) \
        if cuda_kernels(sim) else None
    _FORWARD(sim, n, m, direction, reduction, rel_dt, *mat(sim), *rel, *mask_args(mask), *rel_lists, paths, alpha,
             loss.data_ptr(), dsim.data_ptr(), aux.data_ptr(), 0 if part is None else part.data_ptr())
    return loss, dsim, aux


def _backward(grad_loss: Tensor, dsim: Tensor, aux: Tensor, sim_dtype: torch.dtype, direction: int,
              reduction: int) -> Tensor:
    """d (grad_loss . loss) / d sim, contiguous, in sim's dtype (nothing else of sim is read,
    so the forward saves no tensor)."""
    n, m = dsim.shape[1], dsim.shape[2]
    go = grad_loss.to(dsim.dtype).contiguous()
    grad = torch.empty((n, m), dtype=sim_dtype, device=dsim.device)
    _BACKWARD(grad, n, m, direction, reduction, dsim.data_ptr(), aux.data_ptr(), go.data_ptr(), grad.data_ptr())
    return grad


def _fake_forward(sim, relevance, mask, lists, alpha, direction, reduction, paths):
    dsim = sim.new_empty((2 if direction == 3 else 1, *sim.shape), dtype=acc_dtype(sim.dtype))
    return empty_outputs(sim, direction, reduction, dsim)


# fastrank::kendall -> (loss, dsim, aux), fastrank::kendall_backward, the eager Function
# and the switch between them: src/fastrank/ops/_native_op.py
def _fake_backward(grad_loss, dsim, aux, sim_dtype, direction, reduction):
    return dsim.new_empty(dsim.shape[1:], dtype=sim_dtype)


KENDALL = NativeOp("kendall", _forward, ("loss", "dsim", "aux"), _fake_forward,
                   Backward("fastrank::kendall_backward", _backward, _fake_backward))
kendall_op = KENDALL.op


def floor(mode: str, size: dict, itemsize: int) -> dict:
    """The benchmarks' floor (src/fastrank/ops/_floor.py): one pass of the pairs (the hinge's
    gradient is known in the forward): ~4 fp32 instructions, or one compare+select+add, per
    unordered pair."""
    n, m = size["n"], size["m"]
    pairs = pair_count(n, m) * (0 if mode == "backward" else 1)
    return {"bytes": rw_bytes(mode, n, m, itemsize), "fp32": 4 * pairs, "cmp_select_add": pairs}


def _check_hyper(alpha, direction, reduction):
    """The hyper-parameters as the op uses them, or the error that names the bad one."""
    return V.check_nonnegative(alpha, "alpha"), V.check_direction(direction), V.check_reduction(reduction)


def kendall_loss(sim: Tensor, relevance: Union[Tensor, TopKRelevance], alpha: float = 0.1, direction: str = "both",
                 reduction: str = "mean", impl: str = "auto", mask: Optional[Tensor] = None) -> Tensor:
    """Kendall ranking loss (docs/spec.md §2.2; BCLS, Eq. 17), the full pairwise form.

    Per query: sum over pairs (j, k) with r_j > r_k + alpha of [s_k - s_j]+, divided by
    max(1, number of such pairs). The subgradient of [x]+ at 0 is 0.

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        relevance: (N, M) graded relevance, or a :class:`fastrank.TopKRelevance` (each row's k
            best entries, the rest 0: never expanded to (N, M)); no gradient flows to it. Only
            the pairs whose relevance differs by more than alpha are visited: a list with k
            nonzero entries costs O(M * k) after an O(M) sort (docs/spec.md §2.1b).
        alpha: relaxation (>= 0): pairs whose relevance differs by alpha or less are ignored.
        direction: "i2t", "t2i" or "both" (sum of the two).
        reduction: "mean", "sum" or "none".
        impl: "auto", "native" or "reference".
        mask: optional bool (N, M), True = the entry is in the list (docs/spec.md §2.1a): row
            i's list for i2t, column j's for t2i. A masked entry takes part in no pair and
            gets gradient 0; a list with no valid item has loss 0; "mean" averages over
            the lists with at least one valid item (0 if none). None = every entry.
    Returns:
        a scalar, or (N,) / (M,) / (N + M,) per-query losses for reduction="none";
        in the accumulation dtype (float32, or float64 for float64 sim).
    NaN or inf in sim or relevance: ValueError on CPU by default (docs/spec.md §1); with the
    check off (CUDA default) the loss and gradient come back non-finite.
    """
    return _kendall_loss(_check_hyper, sim, relevance, alpha, direction, reduction, impl, mask)


def _kendall_loss(check_hyper, sim, relevance, alpha, direction, reduction, impl, mask):
    """kendall_loss with its hyper-parameters checked by ``check_hyper``: the op's own, or, for
    its module form, none (the module checked them when they were set)."""
    topk, (alpha, direction, reduction), impl = V.check_graded_inputs(
        sim, relevance, mask, impl, check_hyper, (alpha, direction, reduction))
    relevance = relevance.detach()
    if not has_native(sim.device, impl, "kendall_loss"):
        acc = acc_dtype(sim.dtype)
        rel = relevance.to_dense(acc) if topk else relevance.to(acc)
        return kendall_reference(sim.to(acc), rel, alpha, direction, reduction, mask)
    rel, lists = graded_relevance(sim, relevance, direction)
    return KENDALL(sim, rel, mask, lists, alpha, DIRECTION_CODE[direction], REDUCTION_CODE[reduction],
                   variant_codes()[1])


class KendallLoss(ModuleForm, functional=kendall_loss, inputs=("sim", "relevance", "mask"),
                  check=_check_hyper, checked=_kendall_loss):
    """Module form of :func:`fastrank.kendall_loss`: ``loss = KendallLoss()(sim, relevance)``
    (or ``(sim, relevance, mask)`` for lists of different lengths)."""


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
CONTRACT = C.glue_contract(
    KENDALL, lambda x, h: (x["sim"], *C.graded(x, h), h["alpha"], *C.codes(h), variant_codes()[1]),
    C.graded_examples({"alpha": 0.1}, "i2t", {"alpha": 0.05}),
    C.TENSOR_CASES + C.RELEVANCE_CASES + C.MASK_CASES + C.HYPER_CASES + (
        C.BadInput("alpha < 0", ValueError, "alpha", hyper={"alpha": -0.1}),))


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("kendall", kendall_loss, KendallLoss, CONTRACT, floor=floor, compat=("open_clip",)),)
