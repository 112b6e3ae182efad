"""A contrastive loss plus smooth-NDCG straight from the embeddings, block by block, each block's
similarities made once for both terms (docs/spec.md §2.13).

Two passes, each over blocks of its queries: the rows pass takes ``block`` image queries at a
time, ``G = img_q[b] @ txt_all.T`` (block x m), and feeds it to InfoNCE's row logsumexp (or the
SigLIP terms of those rows) and to smooth-NDCG's i2t kernels; the columns pass takes ``block``
caption queries, ``G = txt_q[b] @ img_all.T`` (block x n), for InfoNCE's column logsumexp and
smooth-NDCG's t2i kernels. One matmul a block a pass serves both terms. A block's gradient adds
the two terms' gradients of G (``logit_scale * d contrastive / d logits + d smooth-NDCG / d G``)
and does the block's two gradient matmuls once: given the per-query outputs' weights (the
reduction's: fused, as Liger-Kernel's fused linear cross-entropy) the forward does it while G is
in hand, since a block holds whole rows (3 matmuls a block a pass, the backward scaling the made
gradients); without, the backward makes each block again. The (n, m) matrix and its gradient
are never held: memory O((n + m) * dim + block * max(n, m) + nnz), the made gradients the
embeddings' size.

The queries and the candidates are separate inputs so that a rank of a data-parallel job can
score its own queries against the gathered batch (fastrank.distributed): a single process
passes (img, txt, txt, img). The positives' logits, O(n * dim), are the caller's (plain
differentiable PyTorch): the ops give each query's logsumexp, the SigLIP rows' losses and
smooth-NDCG's per-query losses.

Two custom ops, with their fakes and autograd (torch.compile(fullgraph=True) runs them):
``fastrank::contrastive_ranking_from_embeddings`` (img_q, txt_all, txt_q, img_all, scale, bias,
positives, lists, weights -> the rows' term (InfoNCE: logsumexp; SigLIP: loss), the columns'
logsumexp, smooth-NDCG's per-query losses, i2t first; the weighted total and its gradients when
``weights`` = [w_row, w_col, w_ndcg] is given: then only the total is differentiable) and its
``_backward`` (the unfused gradients). ``contrastive``: "info_nce" or
"siglip"; ``direction``: 1 = i2t, 2 = t2i, 3 = both (of InfoNCE's logsumexps and smooth-NDCG;
SigLIP's terms are the rows pass's whatever the direction); ``lists``: the rows' (i2t) and the
columns' (t2i) Lists of the relevance, flattened.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._native import acc_dtype, variant_codes
from ..topk import Lists
from ._blockwise import HEADS
from ._contrastive_blocks import _blocks

_NDCG_FORWARD, _NDCG_BACKWARD = HEADS["smooth_ndcg"]


def _passes(img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor, contrastive: str, direction: int):
    """(is the rows pass, queries, candidates, their positions among the four embeddings) of
    each pass that runs: the rows pass for i2t or SigLIP, the columns pass for t2i."""
    out = []
    if direction & 1 or contrastive == "siglip":
        out.append((True, img_q, txt_all, (0, 1)))
    if direction & 2:
        out.append((False, txt_q, img_all, (2, 3)))
    return out


def _signed(X: Tensor, positives: Tensor, start: int, stop: int) -> Tensor:
    """X with its entries at the block's positives negated (in place)."""
    cols = positives[start:stop, None]
    return X.scatter_(1, cols, -X.gather(1, cols))


def _ndcg_rows(lists: List[Tensor], rows_pass: bool) -> Lists:
    return Lists(*lists[0:3]) if rows_pass else Lists(*lists[3:6])


def query_counts(nr: int, nc: int, direction: int) -> int:
    return (nr if direction & 1 else 0) + (nc if direction & 2 else 0)


def forward_or_fused(img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor, logit_scale: Tensor,
                     logit_bias: Tensor, positives: Tensor, lists: List[Tensor], weights: List[Tensor],
                     contrastive: str, tau: float, direction: int, block: int,
                     shared: bool = False) -> Tuple[Tensor, ...]:
    """(row_term, col_lse, ndcg, total, *gradients): with ``weights`` = [w_row, w_col, w_ndcg]
    (fused) ``total = w_row . row_term + w_col . col_lse + w_ndcg . ndcg`` and its gradients by
    img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, made in the same sweep (``shared``:
    see :func:`sweep`); with no weights, total 0 and no gradient (empty tensors)."""
    values, grads = sweep(img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, contrastive,
                          tau, direction, block, weights or None, True, shared)
    if not weights:
        return (*values, values[0].new_zeros(()), *_no_gradients(img_q))
    total = sum(torch.dot(w.to(v.dtype), v) for w, v in zip(weights, values))
    return (*values, total, *grads)


def _no_gradients(like: Tensor) -> Tuple[Tensor, ...]:
    return tuple(like.new_empty((0,)) for _ in range(6))


def sweep(img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor, logit_scale: Tensor, logit_bias: Tensor,
          positives: Tensor, lists: List[Tensor], contrastive: str, tau: float, direction: int, block: int,
          weights: Optional[Sequence[Tensor]], values: bool,
          shared: bool = False) -> Tuple[Tuple[Tensor, Tensor, Tensor], Optional[Tuple[Tensor, ...]]]:
    """((row_term, col_lse, ndcg) if ``values``, else zeros; for ``weights`` = (w_row, w_col,
    w_ndcg) the gradients of ``w_row . row_term + w_col . col_lse + w_ndcg . ndcg`` by (img_q,
    txt_all, txt_q, img_all, logit_scale, logit_bias), else None). Per block, dG = scale * dL +
    dG_ndcg with dL the contrastive term's gradient by the logits: InfoNCE ``w_q softmax(L)`` of
    each query's row (the block holds whole rows, so its logsumexp is the block's own); SigLIP
    ``-z sigma(-z L)`` weighted by w_row; then the block's two gradient matmuls. ``shared``: txt_q
    is txt_all and img_all is img_q (one process's batch): each embedding's two gradients are
    summed into one buffer, given in img_q's and txt_all's places, txt_q's and img_all's empty
    (two embedding-sized buffers, not four, held from the forward to the backward)."""
    acc = acc_dtype(img_q.dtype)
    nr, nc = img_q.shape[0], txt_q.shape[0]
    scale, bias = logit_scale.to(acc), logit_bias.to(acc)
    row_term = img_q.new_zeros((nr,), dtype=acc)
    col_lse = img_q.new_zeros((nc,), dtype=acc)
    ndcg = img_q.new_zeros((query_counts(nr, nc, direction),), dtype=acc)
    embeddings = (img_q, txt_all, txt_q, img_all)   # a single process passes img and txt twice: one gradient each
    grads = [torch.zeros(t.shape, dtype=acc, device=t.device) for t in embeddings[:2 if shared else 4]]
    if shared:
        grads = [grads[0], grads[1], grads[1], grads[0]]
    g_scale = img_q.new_zeros((), dtype=acc)
    g_bias = img_q.new_zeros((), dtype=acc)
    variant = variant_codes()
    for rows_pass, Q, K, (iq, ik) in _passes(img_q, txt_all, txt_q, img_all, contrastive, direction):
        lst = _ndcg_rows(lists, rows_pass)
        ranked = direction & (1 if rows_pass else 2)
        at = nr if not rows_pass and direction & 1 else 0
        term = row_term if rows_pass else col_lse
        w = weights[0 if rows_pass else 1].to(acc) if weights is not None else None
        B = K.to(acc)
        for start, stop, A_b, G in _blocks(Q, K, block):
            dL: Optional[Tensor] = None
            if contrastive == "siglip" and rows_pass:
                X = _signed(torch.mul(G, -scale).sub_(bias), positives, start, stop)   # z * logits
                if values:
                    term[start:stop] = -F.logsigmoid(X).sum(dim=1)
                if w is not None:
                    dL = _signed(X.neg_().sigmoid_().mul_(w[start:stop, None]), positives, start, stop)
                    g_bias += dL.sum()
            elif contrastive == "info_nce" and ranked:
                S = torch.mul(G, scale)
                top = S.amax(dim=1, keepdim=True)
                E = S.sub_(top).exp_()
                total = E.sum(dim=1)
                if values:
                    term[start:stop] = top.squeeze(1) + total.log()
                if w is not None:
                    dL = E.mul_((w[start:stop] / total)[:, None])   # w_q softmax
            d_ndcg: Optional[Tensor] = None
            if ranked:
                losses, ws = _NDCG_FORWARD(G, lst.rows(start, stop), None, [tau], variant, weights is not None)
                if values:
                    ndcg[at + start:at + stop] = losses
                if weights is not None:
                    d_ndcg = _NDCG_BACKWARD(weights[2][at + start:at + stop].to(acc), G, ws, [tau], variant)
            if weights is None:
                continue
            dG = d_ndcg
            if dL is not None:
                g_scale += torch.dot(dL.view(-1), G.view(-1))
                dL.mul_(scale)
                dG = dL if dG is None else dL.add_(dG)
            if dG is None:
                continue
            grads[iq][start:stop] += dG @ B
            grads[ik].addmm_(dG.t(), A_b)
    if weights is None:
        return (row_term, col_lse, ndcg), None
    made = [g.to(t.dtype) for g, t in zip(grads, embeddings)]
    if shared:
        made[2:] = [img_q.new_empty((0,)), img_q.new_empty((0,))]
    return (row_term, col_lse, ndcg), (*made,
                                       g_scale.to(logit_scale.dtype).reshape(logit_scale.shape),
                                       g_bias.to(logit_bias.dtype).reshape(logit_bias.shape))


# ---------------------------------------------------------------- the custom ops
@torch.library.custom_op("fastrank::contrastive_ranking_from_embeddings", mutates_args=())
def contrastive_ranking_from_embeddings(img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor,
                                        logit_scale: Tensor, logit_bias: Tensor, positives: Tensor,
                                        lists: List[Tensor], weights: List[Tensor], contrastive: str, tau: float,
                                        direction: int, block: int, shared: bool) -> Tuple[(Tensor,) * 10]:
    """(the rows' contrastive term, the columns' logsumexp, smooth-NDCG's per-query losses, the
    weighted total, its gradients by img_q, txt_all, txt_q, img_all, logit_scale, logit_bias)
    (:func:`forward_or_fused`: with no ``weights``, total 0 and the gradients empty)."""
    return forward_or_fused(img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, weights,
                            contrastive, tau, direction, block, shared)


@contrastive_ranking_from_embeddings.register_fake
def _(img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, weights, contrastive, tau,
      direction, block, shared):
    acc = acc_dtype(img_q.dtype)
    nr, nc = img_q.shape[0], txt_q.shape[0]
    values = [img_q.new_empty((nr,), dtype=acc), img_q.new_empty((nc,), dtype=acc),
              img_q.new_empty((query_counts(nr, nc, direction),), dtype=acc), img_q.new_empty((), dtype=acc)]
    if not weights:
        return (*values, *_no_gradients(img_q))
    made = [torch.empty_like(t) for t in (img_q, txt_all, txt_q, img_all, logit_scale, logit_bias)]
    if shared:
        made[2:4] = [img_q.new_empty((0,)), img_q.new_empty((0,))]
    return (*values, *made)


@torch.library.custom_op("fastrank::contrastive_ranking_from_embeddings_backward", mutates_args=())
def contrastive_ranking_from_embeddings_backward(
        g_row: Tensor, g_col: Tensor, g_ndcg: Tensor, img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor,
        logit_scale: Tensor, logit_bias: Tensor, positives: Tensor, lists: List[Tensor], contrastive: str, tau: float,
        direction: int, block: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of ``g_row . row_term + g_col . col_lse + g_ndcg . ndcg`` by img_q, txt_all,
    txt_q, img_all, logit_scale and logit_bias: each block made again (the unfused path)."""
    return sweep(img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, contrastive, tau,
                 direction, block, (g_row, g_col, g_ndcg), False)[1]


@contrastive_ranking_from_embeddings_backward.register_fake
def _(g_row, g_col, g_ndcg, img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, contrastive,
      tau, direction, block):
    return (torch.empty_like(img_q), torch.empty_like(txt_all), torch.empty_like(txt_q), torch.empty_like(img_all),
            torch.empty_like(logit_scale), torch.empty_like(logit_bias))


def _setup_context(ctx, inputs, output):
    img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, weights, *args = inputs
    ctx.fused, ctx.shared = bool(weights), args[4]
    if ctx.fused:   # the gradients are made: only the total is differentiable, and its backward scales them
        ctx.save_for_backward(*output[4:])
        ctx.mark_non_differentiable(*output[:3], *output[4:])
    else:           # the per-query outputs are differentiable: the backward makes each block again
        ctx.save_for_backward(img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, *lists)
        ctx.mark_non_differentiable(*output[3:])
        ctx.args = tuple(args[:4])   # contrastive, tau, direction, block
    ctx.n_lists, ctx.n_weights = len(lists), len(weights)


def _backward(ctx, g_row, g_col, g_ndcg, g_total, *_made):
    if ctx.fused:
        made = ctx.saved_tensors
        inputs = [None] * 6 if g_total is None else [g_total.to(g.dtype) * g for g in made]
        if ctx.shared:   # each embedding's two gradients are the first two (summed in the sweep)
            inputs[2:4] = [None, None]
    else:
        img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, *lists = ctx.saved_tensors
        nr, nc = img_q.shape[0], txt_q.shape[0]
        acc = acc_dtype(img_q.dtype)
        g_row = g_row if g_row is not None else img_q.new_zeros((nr,), dtype=acc)
        g_col = g_col if g_col is not None else img_q.new_zeros((nc,), dtype=acc)
        g_ndcg = g_ndcg if g_ndcg is not None else img_q.new_zeros((query_counts(nr, nc, ctx.args[2]),), dtype=acc)
        inputs = list(contrastive_ranking_from_embeddings_backward(
            g_row, g_col, g_ndcg, img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists,
            *ctx.args))
    return (*inputs, None, [None] * ctx.n_lists, [None] * ctx.n_weights, None, None, None, None, None)


contrastive_ranking_from_embeddings.register_autograd(_backward, setup_context=_setup_context)
