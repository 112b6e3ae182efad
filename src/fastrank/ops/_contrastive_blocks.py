"""InfoNCE and the SigLIP loss straight from the embeddings, block by block (docs/spec.md §2.12).

The queries (img) are taken ``block`` rows at a time; a block's logits
``S = logit_scale * img_b @ txt.T (+ logit_bias)`` (block x m) are made, used and dropped, as
flash-attention and Inf-CL (Cheng et al., "Breaking the Memory Barrier: Near Infinite Batch
Size Scaling for Contrastive Loss", 2024) do: the (n, m) logits and their gradient are never
held. InfoNCE keeps each row's logsumexp (i2t) and, in the same pass, each column's by an online
logsumexp over the blocks (a running max and a sum rescaled when the max grows: t2i); the
backward makes each block's logits again from the embeddings and those statistics, and adds
``dS @ txt`` to the block's rows of grad img and ``dS.T @ img_b`` to grad txt. The SigLIP loss
needs no statistic (its terms are per pair). Memory: the embeddings, their gradients, O(n + m)
statistics and a few (block, m) matrices; the work is the dense path's: one matmul a block in
the forward, three in the backward. All of it in float32 for float16 / bfloat16 embeddings
(float64 stays float64).

Four custom ops, with their fakes and autograd, so the losses run eagerly and under
torch.compile(fullgraph=True) alike: ``fastrank::info_nce_from_embeddings`` (img, txt, scale,
positives -> per-query losses, i2t first, and the row and column logsumexps) and its
``_backward``; ``fastrank::siglip_from_embeddings`` (-> per-query losses) and its ``_backward``.
``positives``: int64 (n,), query i's positive document; ``direction``: "i2t", "t2i" or "both".
"""
from __future__ import annotations

from typing import Iterator, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._native import acc_dtype
from ._blockwise import block_rows


def _blocks(img: Tensor, txt: Tensor, block: int) -> Iterator[Tuple[int, int, Tensor, Tensor]]:
    """(start, stop, img_b, G = img_b @ txt.T) of each block of queries, in the accumulation dtype."""
    acc = acc_dtype(img.dtype)
    A, B = img.to(acc), txt.to(acc)
    rows = block_rows(block, A.shape[0], B.shape[0])
    for start in range(0, A.shape[0], rows):
        stop = min(start + rows, A.shape[0])
        yield start, stop, A[start:stop], A[start:stop] @ B.t()


def _at_positives(M: Tensor, positives: Tensor, start: int, stop: int) -> Tensor:
    """M[r, positives[start + r]] of a block's (stop - start, m) matrix."""
    return M.gather(1, positives[start:stop].unsqueeze(1)).squeeze(1)


def _query_count(n: int, direction: str) -> int:
    return 2 * n if direction == "both" else n


# ---------------------------------------------------------------- InfoNCE
def info_nce_forward(img: Tensor, txt: Tensor, logit_scale: Tensor, positives: Tensor, direction: str,
                     block: int) -> Tuple[Tensor, Tensor, Tensor]:
    acc = acc_dtype(img.dtype)
    n, m = img.shape[0], txt.shape[0]
    scale = logit_scale.to(acc)
    row_lse = img.new_zeros((n,), dtype=acc)
    col_max = torch.full((m,), float("-inf"), dtype=acc, device=img.device)
    col_sum = img.new_zeros((m,), dtype=acc)
    positive = img.new_zeros((n,), dtype=acc)
    for start, stop, _, G in _blocks(img, txt, block):
        S = G.mul_(scale)
        positive[start:stop] = _at_positives(S, positives, start, stop)
        if direction != "t2i":
            row_lse[start:stop] = torch.logsumexp(S, dim=1)
        if direction != "i2t":   # online logsumexp of each column over the blocks
            new_max = torch.maximum(col_max, S.amax(dim=0))
            col_sum = col_sum * torch.exp(col_max - new_max) + S.sub_(new_max).exp_().sum(dim=0)
            col_max = new_max
    col_lse = col_max + torch.log(col_sum) if direction != "i2t" else col_sum
    parts = []
    if direction != "t2i":
        parts.append(row_lse - positive)
    if direction != "i2t":
        parts.append(col_lse[positives] - positive)
    return torch.cat(parts), row_lse, col_lse


def info_nce_gradients(grad: Tensor, img: Tensor, txt: Tensor, logit_scale: Tensor, positives: Tensor,
                       row_lse: Tensor, col_lse: Tensor, direction: str,
                       block: int) -> Tuple[Tensor, Tensor, Tensor]:
    """d (grad . losses) / d img, txt, logit_scale. With w the i2t weights and u the t2i
    weights (of the pairs), U_j = sum_{i: p_i = j} u_i:
    dS_ij = w_i softmax_row(S)_ij + U_j softmax_col(S)_ij - (w_i + u_i) [j = p_i]."""
    acc = acc_dtype(img.dtype)
    n, m = img.shape[0], txt.shape[0]
    scale = logit_scale.to(acc)
    g = grad.to(acc)
    zeros = img.new_zeros((n,), dtype=acc)
    w = g[:n] if direction != "t2i" else zeros
    u = g[-n:] if direction != "i2t" else zeros
    U = img.new_zeros((m,), dtype=acc).index_add_(0, positives, u)
    both = w + u
    B = txt.to(acc)
    g_img = torch.zeros(img.shape, dtype=acc, device=img.device)
    g_txt = torch.zeros(txt.shape, dtype=acc, device=txt.device)
    g_scale = img.new_zeros((), dtype=acc)
    for start, stop, A_b, G in _blocks(img, txt, block):
        S = G * scale
        if direction == "i2t":
            dS = S.sub_(row_lse[start:stop, None]).exp_().mul_(w[start:stop, None])
        elif direction == "t2i":
            dS = S.sub_(col_lse).exp_().mul_(U)
        else:
            dS = torch.sub(S, row_lse[start:stop, None]).exp_().mul_(w[start:stop, None])
            dS.add_(S.sub_(col_lse).exp_().mul_(U))
        dS.scatter_add_(1, positives[start:stop, None], -both[start:stop, None])
        g_scale += torch.dot(dS.view(-1), G.view(-1))
        torch.mm(dS, B, out=g_img[start:stop])
        g_txt.addmm_(dS.t(), A_b)
    g_img.mul_(scale)
    g_txt.mul_(scale)
    return g_img.to(img.dtype), g_txt.to(txt.dtype), g_scale.to(logit_scale.dtype).reshape(logit_scale.shape)


@torch.library.custom_op("fastrank::info_nce_from_embeddings", mutates_args=())
def info_nce_from_embeddings(img: Tensor, txt: Tensor, logit_scale: Tensor, positives: Tensor, direction: str,
                             block: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(per-query losses, i2t first; each row's logsumexp; each column's) of InfoNCE on
    ``logit_scale * img @ txt.T``, block by block."""
    return info_nce_forward(img, txt, logit_scale, positives, direction, block)


@info_nce_from_embeddings.register_fake
def _(img, txt, logit_scale, positives, direction, block):
    acc = acc_dtype(img.dtype)
    return (img.new_empty((_query_count(img.shape[0], direction),), dtype=acc),
            img.new_empty((img.shape[0],), dtype=acc), img.new_empty((txt.shape[0],), dtype=acc))


@torch.library.custom_op("fastrank::info_nce_from_embeddings_backward", mutates_args=())
def info_nce_from_embeddings_backward(grad: Tensor, img: Tensor, txt: Tensor, logit_scale: Tensor,
                                      positives: Tensor, row_lse: Tensor, col_lse: Tensor, direction: str,
                                      block: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradients of ``grad . losses`` by img, txt and logit_scale."""
    return info_nce_gradients(grad, img, txt, logit_scale, positives, row_lse, col_lse, direction, block)


@info_nce_from_embeddings_backward.register_fake
def _(grad, img, txt, logit_scale, positives, row_lse, col_lse, direction, block):
    return torch.empty_like(img), torch.empty_like(txt), torch.empty_like(logit_scale)


def _info_nce_setup(ctx, inputs, output):
    img, txt, logit_scale, positives, direction, block = inputs
    _, row_lse, col_lse = output
    ctx.save_for_backward(img, txt, logit_scale, positives, row_lse, col_lse)
    ctx.args = (direction, block)
    ctx.mark_non_differentiable(row_lse, col_lse)


def _info_nce_backward(ctx, grad, _grad_row_lse, _grad_col_lse):
    img, txt, logit_scale, positives, row_lse, col_lse = ctx.saved_tensors
    g_img, g_txt, g_scale = info_nce_from_embeddings_backward(grad, img, txt, logit_scale, positives, row_lse,
                                                              col_lse, *ctx.args)
    return g_img, g_txt, g_scale, None, None, None


info_nce_from_embeddings.register_autograd(_info_nce_backward, setup_context=_info_nce_setup)


# ---------------------------------------------------------------- SigLIP
def _signed_logits(G: Tensor, scale: Tensor, bias: Tensor, positives: Tensor, start: int, stop: int) -> Tensor:
    """z_ij * (scale * G_ij + bias) of a block: the logits, negated but at the positives."""
    X = torch.mul(G, -scale).sub_(bias)
    cols = positives[start:stop, None]
    return X.scatter_(1, cols, -X.gather(1, cols))


def siglip_forward(img: Tensor, txt: Tensor, logit_scale: Tensor, logit_bias: Tensor, positives: Tensor,
                   block: int) -> Tensor:
    acc = acc_dtype(img.dtype)
    scale, bias = logit_scale.to(acc), logit_bias.to(acc)
    out = img.new_empty((img.shape[0],), dtype=acc)
    for start, stop, _, G in _blocks(img, txt, block):
        out[start:stop] = -F.logsigmoid(_signed_logits(G, scale, bias, positives, start, stop)).sum(dim=1)
    return out


def siglip_gradients(grad: Tensor, img: Tensor, txt: Tensor, logit_scale: Tensor, logit_bias: Tensor,
                     positives: Tensor, block: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """d (grad . losses) / d img, txt, logit_scale, logit_bias: with X = z * L (the signed
    logits), d(-log sigma(X)) / dL = -z sigma(-X)."""
    acc = acc_dtype(img.dtype)
    scale, bias = logit_scale.to(acc), logit_bias.to(acc)
    w = grad.to(acc)
    B = txt.to(acc)
    g_img = torch.zeros(img.shape, dtype=acc, device=img.device)
    g_txt = torch.zeros(txt.shape, dtype=acc, device=txt.device)
    g_scale = img.new_zeros((), dtype=acc)
    g_bias = img.new_zeros((), dtype=acc)
    for start, stop, A_b, G in _blocks(img, txt, block):
        X = _signed_logits(G, scale, bias, positives, start, stop)
        dL = X.neg_().sigmoid_().mul_(w[start:stop, None])    # -z sigma(-X): z = -1 off the positives ...
        cols = positives[start:stop, None]
        dL.scatter_(1, cols, -dL.gather(1, cols))             # ... z = 1 at them
        g_scale += torch.dot(dL.view(-1), G.view(-1))
        g_bias += dL.sum()
        torch.mm(dL, B, out=g_img[start:stop])
        g_txt.addmm_(dL.t(), A_b)
    g_img.mul_(scale)
    g_txt.mul_(scale)
    return (g_img.to(img.dtype), g_txt.to(txt.dtype), g_scale.to(logit_scale.dtype).reshape(logit_scale.shape),
            g_bias.to(logit_bias.dtype).reshape(logit_bias.shape))


@torch.library.custom_op("fastrank::siglip_from_embeddings", mutates_args=())
def siglip_from_embeddings(img: Tensor, txt: Tensor, logit_scale: Tensor, logit_bias: Tensor, positives: Tensor,
                           block: int) -> Tensor:
    """Per-query SigLIP losses on ``logit_scale * img @ txt.T + logit_bias``, block by block."""
    return siglip_forward(img, txt, logit_scale, logit_bias, positives, block)


@siglip_from_embeddings.register_fake
def _(img, txt, logit_scale, logit_bias, positives, block):
    return img.new_empty((img.shape[0],), dtype=acc_dtype(img.dtype))


@torch.library.custom_op("fastrank::siglip_from_embeddings_backward", mutates_args=())
def siglip_from_embeddings_backward(grad: Tensor, img: Tensor, txt: Tensor, logit_scale: Tensor, logit_bias: Tensor,
                                    positives: Tensor, block: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of ``grad . losses`` by img, txt, logit_scale and logit_bias."""
    return siglip_gradients(grad, img, txt, logit_scale, logit_bias, positives, block)


@siglip_from_embeddings_backward.register_fake
def _(grad, img, txt, logit_scale, logit_bias, positives, block):
    return torch.empty_like(img), torch.empty_like(txt), torch.empty_like(logit_scale), torch.empty_like(logit_bias)


def _siglip_setup(ctx, inputs, output):
    img, txt, logit_scale, logit_bias, positives, block = inputs
    ctx.save_for_backward(img, txt, logit_scale, logit_bias, positives)
    ctx.block = block


def _siglip_backward(ctx, grad):
    img, txt, logit_scale, logit_bias, positives = ctx.saved_tensors
    return (*siglip_from_embeddings_backward(grad, img, txt, logit_scale, logit_bias, positives, ctx.block),
            None, None)


siglip_from_embeddings.register_autograd(_siglip_backward, setup_context=_siglip_setup)
