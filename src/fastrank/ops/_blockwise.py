"""The smooth-rank losses straight from the embeddings, block by block (docs/spec.md §2.11).

``loss(q, d, lists) = loss(q @ d.T, ...)`` without the (n, m) similarity or its gradient: the
queries of a direction are taken ``block`` at a time; a block's similarities S = A_b @ B.T
(block x C: i2t A = q, B = d; t2i A = d, B = q) go through the row loss's own kernels
(direction i2t on S: smooth_ndcg, smooth_ap, recall_at_k, the sparse path included), and are
dropped. The forward keeps only the per-query losses and reduces them; the backward takes the
same blocks again (the matmul and the kernels' forward recomputed, as flash-attention recomputes
its scores) with the upstream weight of each query, and adds dS @ B to the block's rows of
grad_A and dS.T @ A_b to grad_B. Memory: q, d, their gradients, the lists, and a few (block, C)
matrices at a time: O((n + m) * dim + block * C + n * k).

Two custom ops serve the three losses, with their fakes and autograd, so the losses run eagerly
and under torch.compile(fullgraph=True) alike:

- ``fastrank::ranking_from_embeddings`` (q, d, lists, ..., reduction, mean_over_positives) -> the
  loss reduced as every op reduces (docs/spec.md §1, ``_reduce.reduce_counted``): a 0-dim tensor
  for "mean" and "sum", the (Q,) per-query losses (i2t first) for "none"; "mean" averages each
  direction over all its queries, or (``mean_over_positives``: Smooth-AP, Recall@k) over those
  with a positive in their list, and sums the directions;
- ``fastrank::ranking_from_embeddings_backward`` (the upstream gradient of that output, q, d,
  the same arguments) -> the gradients by q and d: the gradient becomes each query's weight
  (:func:`query_weights`: for "mean" the scalar over its direction's count, for "sum" the
  scalar, for "none" the query's own) and the blocks run with those weights.

``lists``: the relevance or the positives as :class:`fastrank.topk.Lists` of both directions,
flattened: [row offsets, row index, row values, column offsets, column index, column values].
``hyper``: the loss's numbers: smooth_ndcg [tau]; smooth_ap [tau]; recall_at_k [tau, len(ks),
*ks, *tau_k].
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .._native import acc_dtype, variant_codes
from .._reduce import reduce_counted
from ..topk import Lists
from ._launch import DIRECTION_CODE, REDUCTION_CODE
from . import recall_at_k as RK
from . import smooth_ap as SA
from . import smooth_ndcg as SN

#: the similarities of a block, in elements, when the caller gives no block size
BLOCK_ELEMENTS = 1 << 22


def block_rows(block: int, rows: int, columns: int) -> int:
    """Queries per block: ``block``, or (0) as many as keep a block near BLOCK_ELEMENTS."""
    if block > 0:
        return min(block, max(rows, 1))
    return max(1, min(rows, BLOCK_ELEMENTS // max(columns, 1)))


# ---------------------------------------------------------------- the three row losses on a block
# Each head runs its op's own fill functions (the NativeOp's ``forward`` and ``backward.fill``: the
# kernels, no autograd) on a block: S is (block, C), direction i2t, reduction none, so the lists of
# the block's rows stand in for the columns' (i2t alone never reads them, as in relevance_lists).
# forward(S, lists of the block's rows, dense positives builder, hyper, (version, paths), with_grad) ->
# (per-query losses, ws); backward(w, S, ws, hyper, (version, paths)) -> dS.
# (None where fastrank is imported without its native module: no op of this file runs then)
I2T, NONE, MEAN = DIRECTION_CODE.get("i2t"), REDUCTION_CODE.get("none"), REDUCTION_CODE.get("mean")
_REDUCTION_NAME = {code: name for name, code in REDUCTION_CODE.items()}


def _ndcg_forward(S, rows: Lists, positives, hyper, variant, with_grad):
    return SN.SMOOTH_NDCG.forward(S, None, None, [*rows, *rows], hyper[0], I2T, NONE, *variant, with_grad)


def _ndcg_backward(w, S, ws, hyper, variant):
    return SN.SMOOTH_NDCG.backward.fill(w, S, None, ws, hyper[0], I2T, NONE, variant[0])


def _ap_forward(S, rows: Lists, positives, hyper, variant, with_grad):
    return SA.SMOOTH_AP.forward(S, positives(), None, hyper[0], I2T, NONE, variant[0], with_grad)


def _recall_forward(S, rows: Lists, positives, hyper, variant, with_grad):
    n_ks = int(hyper[1])
    ks, tau_k = list(hyper[2:2 + n_ks]), list(hyper[2 + n_ks:2 + 2 * n_ks])
    return RK.RECALL_AT_K.forward(S, positives(), None, ks, tau_k, hyper[0], I2T, NONE, variant[0], with_grad)


def _rank_backward(w, S, ws, hyper, variant):
    # Smooth-AP and Recall@k share the smooth-rank engine's backward
    return SA.SMOOTH_AP.backward.fill(w, S, None, ws, I2T, NONE)


HEADS: Dict[str, Tuple[Callable, Callable]] = {
    "smooth_ndcg": (_ndcg_forward, _ndcg_backward),
    "smooth_ap": (_ap_forward, _rank_backward),
    "recall_at_k": (_recall_forward, _rank_backward),
}


def _directions(direction: int):
    """(code, rows are q) of each requested direction: 1 = i2t (q ranks d), 2 = t2i."""
    return [(d, d == 1) for d in (1, 2) if direction & d]


def _blocks(q: Tensor, d: Tensor, lists: List[Tensor], direction: int, block: int):
    """For each direction and block: (rows A, columns B, offset of the block's queries in the
    per-query losses, start, stop, the block's Lists, a builder of its dense bool positives)."""
    offset = 0
    for _, i2t in _directions(direction):
        A, B = (q, d) if i2t else (d, q)
        lst = Lists(*lists[0:3]) if i2t else Lists(*lists[3:6])
        row_of: List[Tensor] = []   # each entry's row, made once a direction on first use
        bs = block_rows(block, A.shape[0], B.shape[0])
        for start in range(0, A.shape[0], bs):
            stop = min(start + bs, A.shape[0])

            def positives(start=start, stop=stop, lst=lst, C=B.shape[0], row_of=row_of):
                if not row_of:   # the smooth-NDCG head never asks
                    row_of.append(lst.row_of_entries())
                return lst.dense(start, stop, C, torch.bool, row_of[0])
            yield A, B, offset, start, stop, lst.rows(start, stop), positives
        offset += A.shape[0]


def _similarities(A: Tensor, B: Tensor, start: int, stop: int) -> Tensor:
    """S = A[start:stop] @ B.T in the accumulation dtype (half embeddings: float32)."""
    acc = acc_dtype(A.dtype)
    return A[start:stop].to(acc) @ B.to(acc).t()


def query_count(q: Tensor, d: Tensor, direction: int) -> int:
    return (q.shape[0] if direction & 1 else 0) + (d.shape[0] if direction & 2 else 0)


def _counted(lists: List[Tensor], rows: int, columns: int) -> Tensor:
    """Which queries of a direction's Lists have a listed entry (a positive)."""
    lst = Lists(*lists)
    row_of = lst.row_of_entries()
    valid = (lst.index >= 0) & (lst.index < columns) & (row_of >= 0) & (row_of < rows)
    count = torch.zeros(rows + 1, dtype=torch.int64, device=lst.index.device)
    count.scatter_add_(0, torch.where(valid, row_of, torch.full_like(row_of, rows)), valid.to(torch.int64))
    return count[:rows] > 0


def _direction_queries(q: Tensor, d: Tensor, lists: List[Tensor], direction: int, reduction: int,
                       mean_over_positives: bool) -> List[Tuple[int, Optional[Tensor]]]:
    """(queries, which of them "mean" counts) of each requested direction, i2t first; which they
    are: every query, or (``mean_over_positives``) those with a positive in their list, asked
    for "mean" only (None otherwise)."""
    out = []
    for _, i2t in _directions(direction):
        rows, columns = (q.shape[0], d.shape[0]) if i2t else (d.shape[0], q.shape[0])
        counted = None
        if reduction == MEAN:
            counted = _counted(lists[0:3] if i2t else lists[3:6], rows, columns) if mean_over_positives \
                else torch.ones(rows, dtype=torch.bool, device=q.device)
        out.append((rows, counted))
    return out


def reduced_losses(q: Tensor, d: Tensor, lists: List[Tensor], loss: str, hyper: List[float], direction: int,
                   reduction: int, mean_over_positives: bool, block: int) -> Tensor:
    """The per-query losses reduced (``reduce_counted``: "mean" over the counted queries of each
    direction, the directions summed; "sum"; "none": the (Q,) losses, i2t first)."""
    per_query = per_query_losses(q, d, lists, loss, hyper, direction, block)
    if reduction == NONE:
        return per_query
    parts, counted, at = [], [], 0
    for rows, counted_rows in _direction_queries(q, d, lists, direction, reduction, mean_over_positives):
        parts.append(per_query[at:at + rows])
        counted.append(counted_rows)
        at += rows
    return reduce_counted(parts, counted, _REDUCTION_NAME[reduction])


def query_weights(grad: Tensor, q: Tensor, d: Tensor, lists: List[Tensor], direction: int, reduction: int,
                  mean_over_positives: bool) -> Tensor:
    """The (Q,) weight of each query's loss in the gradient of ``grad . reduced_losses(...)``:
    "none": grad itself; "sum": the scalar grad for every query; "mean": the scalar grad over
    its direction's count (at least 1) for every query of the direction (a query "mean" does not
    count has loss 0 and no gradient), the gradient of ``reduce_counted``'s mean."""
    if reduction == NONE:
        return grad
    parts = []
    for rows, counted in _direction_queries(q, d, lists, direction, reduction, mean_over_positives):
        w = grad if counted is None else grad / counted.sum().clamp(min=1)
        parts.append(w.expand(rows))
    return torch.cat(parts)


def per_query_losses(q: Tensor, d: Tensor, lists: List[Tensor], loss: str, hyper: List[float], direction: int,
                     block: int) -> Tensor:
    forward, _ = HEADS[loss]
    out = q.new_empty((query_count(q, d, direction),), dtype=acc_dtype(q.dtype))
    for A, B, offset, start, stop, rows, positives in _blocks(q, d, lists, direction, block):
        losses, _ = forward(_similarities(A, B, start, stop), rows, positives, hyper, variant_codes(), False)
        out[offset + start:offset + stop] = losses
    return out


def gradients(weights: Tensor, q: Tensor, d: Tensor, lists: List[Tensor], loss: str, hyper: List[float],
              direction: int, block: int) -> Tuple[Tensor, Tensor]:
    """(d (weights . losses) / d q, d (weights . losses) / d d), in q's and d's dtypes: ``weights``
    one per query, i2t first."""
    forward, backward = HEADS[loss]
    acc = acc_dtype(q.dtype)
    gq = torch.zeros(q.shape, dtype=acc, device=q.device)
    gd = torch.zeros(d.shape, dtype=acc, device=d.device)
    w_all = weights.to(acc)
    variant = variant_codes()
    for A, B, offset, start, stop, rows, positives in _blocks(q, d, lists, direction, block):
        S = _similarities(A, B, start, stop)
        _, ws = forward(S, rows, positives, hyper, variant, True)
        dS = backward(w_all[offset + start:offset + stop], S, ws, hyper, variant)
        gA, gB = (gq, gd) if A is q else (gd, gq)
        gA[start:stop] += dS @ B.to(acc)
        gB += dS.t() @ A[start:stop].to(acc)
    return gq.to(q.dtype), gd.to(d.dtype)


# ---------------------------------------------------------------- the custom ops
@torch.library.custom_op("fastrank::ranking_from_embeddings", mutates_args=())
def ranking_from_embeddings(q: Tensor, d: Tensor, lists: List[Tensor], loss: str, hyper: List[float],
                            direction: int, reduction: int, mean_over_positives: bool, block: int) -> Tensor:
    """``loss`` on q @ d.T, block by block, reduced: 0-dim for mean / sum, (Q,) for none."""
    return reduced_losses(q, d, lists, loss, hyper, direction, reduction, mean_over_positives, block)


@ranking_from_embeddings.register_fake
def _(q, d, lists, loss, hyper, direction, reduction, mean_over_positives, block):
    shape = (query_count(q, d, direction),) if reduction == NONE else ()
    return q.new_empty(shape, dtype=acc_dtype(q.dtype))


@torch.library.custom_op("fastrank::ranking_from_embeddings_backward", mutates_args=())
def ranking_from_embeddings_backward(grad: Tensor, q: Tensor, d: Tensor, lists: List[Tensor], loss: str,
                                     hyper: List[float], direction: int, reduction: int, mean_over_positives: bool,
                                     block: int) -> Tuple[Tensor, Tensor]:
    """The gradients of ``grad . ranking_from_embeddings(...)`` by q and d (``grad`` shaped like
    that output)."""
    weights = query_weights(grad, q, d, lists, direction, reduction, mean_over_positives)
    return gradients(weights, q, d, lists, loss, hyper, direction, block)


@ranking_from_embeddings_backward.register_fake
def _(grad, q, d, lists, loss, hyper, direction, reduction, mean_over_positives, block):
    return q.new_empty(q.shape), d.new_empty(d.shape)


def _setup_context(ctx, inputs, output):
    q, d, lists, *args = inputs
    ctx.save_for_backward(q, d, *lists)
    ctx.args = tuple(args)
    ctx.n_lists = len(lists)


def _backward(ctx, grad):
    q, d, *lists = ctx.saved_tensors
    gq, gd = ranking_from_embeddings_backward(grad, q, d, lists, *ctx.args)
    return (gq, gd, [None] * ctx.n_lists, *[None] * len(ctx.args))


ranking_from_embeddings.register_autograd(_backward, setup_context=_setup_context)
