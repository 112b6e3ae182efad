"""A contrastive loss plus smooth-NDCG straight from the embeddings, block by block, each block's
similarities made once for both terms (docs/spec.md §2.13).

Two passes, each over blocks of its queries: the rows pass takes ``block`` image queries at a
time, ``G = img_q[b] @ txt_all.T`` (block x m), and feeds it to InfoNCE's row logsumexp (or the
SigLIP terms of those rows) and to smooth-NDCG's i2t kernels; the columns pass takes ``block``
caption queries, ``G = txt_q[b] @ img_all.T`` (block x n), for InfoNCE's column logsumexp and
smooth-NDCG's t2i kernels. One matmul a block a pass serves both terms; the backward makes each
block again, adds the two terms' gradients of G (``logit_scale * d contrastive / d logits +
d smooth-NDCG / d G``) and does the block's two gradient matmuls once. The (n, m) matrix and its
gradient are never held: memory O((n + m) * dim + block * max(n, m) + nnz).

The queries and the candidates are separate inputs so that a rank of a data-parallel job can
score its own queries against the gathered batch (fastrank.distributed): a single process
passes (img, txt, txt, img). The positives' logits, O(n * dim), are the caller's (plain
differentiable PyTorch): the ops give each query's logsumexp, the SigLIP rows' losses and
smooth-NDCG's per-query losses.

Two custom ops, with their fakes and autograd (torch.compile(fullgraph=True) runs them):
``fastrank::contrastive_ranking_from_embeddings`` (img_q, txt_all, txt_q, img_all, scale, bias,
positives, lists -> the rows' term (InfoNCE: logsumexp; SigLIP: loss), the columns' logsumexp,
smooth-NDCG's per-query losses, i2t first) and its ``_backward``. ``contrastive``: "info_nce" or
"siglip"; ``direction``: 1 = i2t, 2 = t2i, 3 = both (of InfoNCE's logsumexps and smooth-NDCG;
SigLIP's terms are the rows pass's whatever the direction); ``lists``: the rows' (i2t) and the
columns' (t2i) Lists of the relevance, flattened.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

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


def forward(img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor, logit_scale: Tensor, logit_bias: Tensor,
            positives: Tensor, lists: List[Tensor], contrastive: str, tau: float, direction: int,
            block: int) -> Tuple[Tensor, Tensor, Tensor]:
    acc = acc_dtype(img_q.dtype)
    nr, nc = img_q.shape[0], txt_q.shape[0]
    scale, bias = logit_scale.to(acc), logit_bias.to(acc)
    row_term = img_q.new_zeros((nr,), dtype=acc)
    col_lse = img_q.new_zeros((nc,), dtype=acc)
    ndcg = img_q.new_zeros((query_counts(nr, nc, direction),), dtype=acc)
    variant = variant_codes()
    for rows_pass, Q, K, _ in _passes(img_q, txt_all, txt_q, img_all, contrastive, direction):
        lst = _ndcg_rows(lists, rows_pass)
        ranked = direction & (1 if rows_pass else 2)
        at = nr if not rows_pass and direction & 1 else 0
        for start, stop, _, G in _blocks(Q, K, block):
            if ranked:
                ndcg[at + start:at + stop] = _NDCG_FORWARD(G, lst.rows(start, stop), None, [tau], variant, False)[0]
            if contrastive == "siglip" and rows_pass:
                X = _signed(torch.mul(G, -scale).sub_(bias), positives, start, stop)   # z * logits
                row_term[start:stop] = -F.logsigmoid(X).sum(dim=1)
            elif contrastive == "info_nce" and ranked:
                (row_term if rows_pass else col_lse)[start:stop] = torch.logsumexp(G.mul_(scale), dim=1)
    return row_term, col_lse, ndcg


def gradients(g_row: Tensor, g_col: Tensor, g_ndcg: Tensor, img_q: Tensor, txt_all: Tensor, txt_q: Tensor,
              img_all: Tensor, logit_scale: Tensor, logit_bias: Tensor, positives: Tensor, lists: List[Tensor],
              row_term: Tensor, col_lse: Tensor, contrastive: str, tau: float, direction: int,
              block: int) -> Tuple[Tensor, ...]:
    """d (g_row . row_term + g_col . col_lse + g_ndcg . ndcg) / d (img_q, txt_all, txt_q,
    img_all, logit_scale, logit_bias). Per block, dG = scale * dL + dG_ndcg with dL the
    contrastive term's gradient by the logits: InfoNCE ``w_q softmax(L)`` of each query's row
    (w: g_row or g_col); SigLIP ``-z sigma(-z L)`` weighted by g_row."""
    acc = acc_dtype(img_q.dtype)
    nr = img_q.shape[0]
    scale, bias = logit_scale.to(acc), logit_bias.to(acc)
    embeddings = (img_q, txt_all, txt_q, img_all)   # a single process passes img and txt twice: one gradient each
    grads = [torch.zeros(t.shape, dtype=acc, device=t.device) for t in embeddings]
    g_scale = img_q.new_zeros((), dtype=acc)
    g_bias = img_q.new_zeros((), dtype=acc)
    variant = variant_codes()
    for rows_pass, Q, K, (iq, ik) in _passes(img_q, txt_all, txt_q, img_all, contrastive, direction):
        lst = _ndcg_rows(lists, rows_pass)
        ranked = direction & (1 if rows_pass else 2)
        at = nr if not rows_pass and direction & 1 else 0
        w = (g_row if rows_pass else g_col).to(acc)
        lse = row_term if rows_pass else col_lse
        gQ, gK = grads[iq], grads[ik]
        B = K.to(acc)
        for start, stop, A_b, G in _blocks(Q, K, block):
            dL: Optional[Tensor] = None
            if contrastive == "siglip" and rows_pass:
                X = _signed(torch.mul(G, -scale).sub_(bias), positives, start, stop)
                dL = _signed(X.neg_().sigmoid_().mul_(w[start:stop, None]), positives, start, stop)
                g_bias += dL.sum()
            elif contrastive == "info_nce" and ranked:
                dL = torch.mul(G, scale).sub_(lse[start:stop, None]).exp_().mul_(w[start:stop, None])
            dG = None
            if dL is not None:
                g_scale += torch.dot(dL.view(-1), G.view(-1))
                dG = dL.mul_(scale)
            if ranked:
                _, ws = _NDCG_FORWARD(G, lst.rows(start, stop), None, [tau], variant, True)
                d_ndcg = _NDCG_BACKWARD(g_ndcg[at + start:at + stop].to(acc), G, ws, [tau], variant)
                dG = d_ndcg if dG is None else dG.add_(d_ndcg)
            if dG is None:
                continue
            gQ[start:stop] += dG @ B
            gK.addmm_(dG.t(), A_b)
    return (*(g.to(t.dtype) for g, t in zip(grads, embeddings)),
            g_scale.to(logit_scale.dtype).reshape(logit_scale.shape),
            g_bias.to(logit_bias.dtype).reshape(logit_bias.shape))


# ---------------------------------------------------------------- the custom ops
@torch.library.custom_op("fastrank::contrastive_ranking_from_embeddings", mutates_args=())
def contrastive_ranking_from_embeddings(img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor,
                                        logit_scale: Tensor, logit_bias: Tensor, positives: Tensor,
                                        lists: List[Tensor], contrastive: str, tau: float, direction: int,
                                        block: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(the rows' contrastive term, the columns' logsumexp, smooth-NDCG's per-query losses)."""
    return forward(img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, contrastive, tau,
                   direction, block)


@contrastive_ranking_from_embeddings.register_fake
def _(img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, contrastive, tau, direction, block):
    acc = acc_dtype(img_q.dtype)
    nr, nc = img_q.shape[0], txt_q.shape[0]
    return (img_q.new_empty((nr,), dtype=acc), img_q.new_empty((nc,), dtype=acc),
            img_q.new_empty((query_counts(nr, nc, direction),), dtype=acc))


@torch.library.custom_op("fastrank::contrastive_ranking_from_embeddings_backward", mutates_args=())
def contrastive_ranking_from_embeddings_backward(
        g_row: Tensor, g_col: Tensor, g_ndcg: Tensor, img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor,
        logit_scale: Tensor, logit_bias: Tensor, positives: Tensor, lists: List[Tensor], row_term: Tensor,
        col_lse: Tensor, contrastive: str, tau: float, direction: int,
        block: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients by img_q, txt_all, txt_q, img_all, logit_scale and logit_bias."""
    return gradients(g_row, g_col, g_ndcg, img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists,
                     row_term, col_lse, contrastive, tau, direction, block)


@contrastive_ranking_from_embeddings_backward.register_fake
def _(g_row, g_col, g_ndcg, img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, row_term,
      col_lse, contrastive, tau, direction, block):
    return (torch.empty_like(img_q), torch.empty_like(txt_all), torch.empty_like(txt_q), torch.empty_like(img_all),
            torch.empty_like(logit_scale), torch.empty_like(logit_bias))


def _setup_context(ctx, inputs, output):
    img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, lists, contrastive, tau, direction, block = inputs
    row_term, col_lse, _ = output
    ctx.save_for_backward(img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, row_term, col_lse,
                          *lists)
    ctx.args = (contrastive, tau, direction, block)
    ctx.n_lists = len(lists)


def _backward(ctx, g_row, g_col, g_ndcg):
    img_q, txt_all, txt_q, img_all, logit_scale, logit_bias, positives, row_term, col_lse, *lists = ctx.saved_tensors
    nr, nc = img_q.shape[0], txt_q.shape[0]
    acc = row_term.dtype
    g_row = g_row if g_row is not None else img_q.new_zeros((nr,), dtype=acc)
    g_col = g_col if g_col is not None else img_q.new_zeros((nc,), dtype=acc)
    g_ndcg = g_ndcg if g_ndcg is not None else img_q.new_zeros((query_counts(nr, nc, ctx.args[2]),), dtype=acc)
    grads = contrastive_ranking_from_embeddings_backward(g_row, g_col, g_ndcg, img_q, txt_all, txt_q, img_all,
                                                         logit_scale, logit_bias, positives, lists, row_term,
                                                         col_lse, *ctx.args)
    return (*grads, None, [None] * ctx.n_lists, None, None, None, None)


contrastive_ranking_from_embeddings.register_autograd(_backward, setup_context=_setup_context)
