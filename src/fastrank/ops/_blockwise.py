"""The smooth-rank losses straight from the embeddings, block by block (docs/spec.md §2.11).

``loss(q, d, lists) = loss(q @ d.T, ...)`` without the (n, m) similarity or its gradient: the
queries of a direction are taken ``block`` at a time; a block's similarities S = A_b @ B.T
(block x C: i2t A = q, B = d; t2i A = d, B = q) go through the row loss's own kernels
(direction i2t on S: smooth_ndcg, smooth_ap, recall_at_k, the sparse path included), and are
dropped. The forward keeps only the per-query losses; the backward takes the same blocks again
(the matmul and the kernels' forward recomputed, as flash-attention recomputes its scores) with
the upstream weight of each query, and adds dS @ B to the block's rows of grad_A and dS.T @ A_b
to grad_B. Memory: q, d, their gradients, the lists, and a few (block, C) matrices at a time:
O((n + m) * dim + block * C + n * k).

Two custom ops serve the three losses: ``fastrank::ranking_from_embeddings`` (q, d, lists ->
per-query losses, i2t first) and ``fastrank::ranking_from_embeddings_backward`` (their
gradients for upstream weights), with their fakes and autograd, so the losses run eagerly and
under torch.compile(fullgraph=True) alike.

``lists``: the relevance or the positives as :class:`fastrank.topk.Lists` of both directions,
flattened: [row offsets, row index, row values, column offsets, column index, column values].
``hyper``: the loss's numbers: smooth_ndcg [tau]; smooth_ap [tau]; recall_at_k [tau, len(ks),
*ks, *tau_k].
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor

from .._native import acc_dtype, variant_codes
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
I2T, NONE = DIRECTION_CODE["i2t"], REDUCTION_CODE["none"]


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


def per_query_losses(q: Tensor, d: Tensor, lists: List[Tensor], loss: str, hyper: List[float], direction: int,
                     block: int) -> Tensor:
    forward, _ = HEADS[loss]
    out = q.new_empty((query_count(q, d, direction),), dtype=acc_dtype(q.dtype))
    for A, B, offset, start, stop, rows, positives in _blocks(q, d, lists, direction, block):
        losses, _ = forward(_similarities(A, B, start, stop), rows, positives, hyper, variant_codes(), False)
        out[offset + start:offset + stop] = losses
    return out


def gradients(grad: Tensor, q: Tensor, d: Tensor, lists: List[Tensor], loss: str, hyper: List[float],
              direction: int, block: int) -> Tuple[Tensor, Tensor]:
    """(d (grad . losses) / d q, d (grad . losses) / d d), in q's and d's dtypes."""
    forward, backward = HEADS[loss]
    acc = acc_dtype(q.dtype)
    gq = torch.zeros(q.shape, dtype=acc, device=q.device)
    gd = torch.zeros(d.shape, dtype=acc, device=d.device)
    w_all = grad.to(acc)
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
                            direction: int, block: int) -> Tensor:
    """Per-query losses (i2t first) of ``loss`` on q @ d.T, block by block."""
    return per_query_losses(q, d, lists, loss, hyper, direction, block)


@ranking_from_embeddings.register_fake
def _(q, d, lists, loss, hyper, direction, block):
    return q.new_empty((query_count(q, d, direction),), dtype=acc_dtype(q.dtype))


@torch.library.custom_op("fastrank::ranking_from_embeddings_backward", mutates_args=())
def ranking_from_embeddings_backward(grad: Tensor, q: Tensor, d: Tensor, lists: List[Tensor], loss: str,
                                     hyper: List[float], direction: int, block: int) -> Tuple[Tensor, Tensor]:
    """The gradients of ``grad . ranking_from_embeddings(...)`` by q and d."""
    return gradients(grad, q, d, lists, loss, hyper, direction, block)


@ranking_from_embeddings_backward.register_fake
def _(grad, q, d, lists, loss, hyper, direction, block):
    return q.new_empty(q.shape), d.new_empty(d.shape)


def _setup_context(ctx, inputs, output):
    q, d, lists, loss, hyper, direction, block = inputs
    ctx.save_for_backward(q, d, *lists)
    ctx.args = (loss, hyper, direction, block)
    ctx.n_lists = len(lists)


def _backward(ctx, grad):
    q, d, *lists = ctx.saved_tensors
    gq, gd = ranking_from_embeddings_backward(grad, q, d, lists, *ctx.args)
    return gq, gd, [None] * ctx.n_lists, None, None, None, None


ranking_from_embeddings.register_autograd(_backward, setup_context=_setup_context)
