"""A contrastive loss plus smooth-NDCG straight from the embeddings (docs/spec.md §2.13): InfoNCE
(or SigLIP) + ``weight`` x smooth-NDCG on a TopKRelevance, equal to open_clip's ClipLoss (or
SigLipLoss) + ``weight * smooth_ndcg_loss(img @ txt.T, relevance)``, each block's similarities
made once for both terms and the (n, m) matrix never held.

Python -> two custom ops (src/fastrank/ops/_contrastive_listwise_blocks.py): per block of queries
one matmul, InfoNCE's logsumexp (or SigLIP's terms) and smooth-NDCG's kernels on it. Where a
gradient is wanted the reduced loss (:func:`loss`) passes the reduction's weights and the op makes
the gradients in the forward, block by block (fused: three matmuls a block a pass, the backward
scaling them); the per-query terms (:func:`terms`, :func:`both_terms`) make each block again in
the backward. The positives' logits are done here, in plain PyTorch (for one process's batch
in both directions, once for both); fastrank.distributed calls the same :func:`loss` with a
rank's own queries.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import _validation as V
from .._native import acc_dtype, has_native
from .._reduce import reduce
from ..reference import contrastive as R
from ..topk import TopKRelevance
from . import _contract as C
from . import contrastive as CL
from . import smooth_ndcg as SN
from ._contrastive_listwise_blocks import contrastive_ranking_from_embeddings
from ._launch import DIRECTION_CODE, relevance_lists
from ._module import ModuleForm
from ._row import Loss

CONTRASTIVE = ("info_nce", "siglip")


# ---------------------------------------------------------------- checks
def _check_hyper(contrastive, weight, tau, direction, reduction, block):
    """The hyper-parameters as the op uses them, or the error that names the bad one."""
    return (V.check_choice(contrastive, "contrastive", CONTRASTIVE), V.check_nonnegative(weight, "weight"),
            V.check_positive(tau, "tau"), V.check_direction(direction),
            V.check_choice(reduction, "reduction", ("mean", "sum")), CL._check_block(block))


def check_inputs(img, txt, relevance, logit_scale, logit_bias, positives, contrastive: str,
                 shape: Optional[Tuple[int, int]] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """(scale, bias, positives) after the structure and (where the check is on) the values of
    every input; ``shape``: the relevance's (n, m) when img and txt are one rank's share."""
    V.check_embedding_pair(img, "img", txt, "txt", same_dtype=True)
    V.check_topk_relevance(relevance, img, shape=shape or (img.shape[0], txt.shape[0]), like="img @ txt.T")
    if contrastive == "siglip" and logit_bias is None:
        raise ValueError("logit_bias must be given for contrastive='siglip' (open_clip's SigLIP starts at -10)")
    if contrastive == "info_nce" and logit_bias is not None:
        raise ValueError("logit_bias must be None for contrastive='info_nce' (only SigLIP's logits have a bias)")
    scalars = [("logit_scale", logit_scale)] + ([("logit_bias", logit_bias)] if logit_bias is not None else [])
    scalars, pos = CL._check_inputs(img, txt, positives, scalars)
    if V.check_finite_enabled(img.device):
        V.check_topk_values(relevance, minimum=0.0, loss="smooth_ndcg")
    bias = scalars[1] if len(scalars) > 1 else torch.zeros((), dtype=scalars[0].dtype, device=img.device)
    return scalars[0], bias, pos


# ---------------------------------------------------------------- the terms
def _positive_logits(img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor, s: Tensor, positives: Tensor,
                     t2i_pairs: Tuple[Tensor, Tensor], direction: str, shared: bool) -> List[Tensor]:
    """InfoNCE's logit of each query's positive, of each direction (i2t first). ``shared`` (one
    process's batch, :func:`_single_process`: txt_q is txt_all, img_all is img_q and the t2i
    pairs are (positives, arange(n))) in both directions: caption positives[i]'s pair is image
    i, i2t's pair i read the other way, so its logit is the same number; it is made once (one
    gather, one graph) and stands for both directions."""
    acc = acc_dtype(img_q.dtype)
    out = []
    if direction != "t2i":
        out.append(s * (img_q.to(acc) * txt_all.to(acc)[positives]).sum(dim=1))
    if shared and direction == "both":
        out.append(out[0])
    elif direction != "i2t":
        cols, imgs = t2i_pairs
        out.append(s * (txt_q.to(acc)[cols] * img_all.to(acc)[imgs]).sum(dim=1))
    return out


def terms(img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor, scale: Tensor, bias: Tensor,
          positives: Tensor, t2i_pairs: Tuple[Tensor, Tensor], lists: List[Tensor], contrastive: str, tau: float,
          direction: str, block: int, shared: bool = False) -> Tuple[Tensor, List[Tensor]]:
    """(the contrastive per-query losses, smooth-NDCG's per-query losses of each direction) of
    the image queries ``img_q`` against ``txt_all`` and the caption queries ``txt_q`` against
    ``img_all``: ``positives`` (of img_q, into txt_all) for InfoNCE's i2t and SigLIP; InfoNCE's
    t2i queries are the pairs ``t2i_pairs`` = (caption query, its positive image in img_all);
    ``lists``: the relevance of img_q's rows and of txt_q's columns; ``shared``: one process's
    batch (as :func:`loss`'s). Their gradients, for any upstream weights, make each block again
    in the backward."""
    row_term, col_lse, ndcg = contrastive_ranking_from_embeddings(
        img_q, txt_all, txt_q, img_all, scale, bias, positives, lists, [], contrastive, tau, DIRECTION_CODE[direction],
        block, False)[:3]
    if contrastive == "siglip":
        per_query = row_term
    else:
        s = scale.to(row_term.dtype).reshape(())
        lse = ([row_term] if direction != "t2i" else []) + ([col_lse[t2i_pairs[0]]] if direction != "i2t" else [])
        positive = _positive_logits(img_q, txt_all, txt_q, img_all, s, positives, t2i_pairs, direction, shared)
        per_query = torch.cat([a - b for a, b in zip(lse, positive)])
    nr = img_q.shape[0]
    ranked = [ndcg[:nr], ndcg[nr:]] if direction == "both" else [ndcg]
    return per_query, ranked


def reduction_weights(reduction: str, n: int, m: int, contrastive: str, direction: str, weight: float
                      ) -> Tuple[float, List[float]]:
    """(the weight of each contrastive per-query loss, of each smooth-NDCG direction's) in the
    combined loss on n images and m captions (the whole batch's, also for one rank's part of
    it): "sum" 1 and ``weight``; "mean" 1 / the contrastive term's query count (n images, and n
    positive pairs for InfoNCE's t2i) and ``weight`` / each direction's query count."""
    counts = {"both": (n, m), "i2t": (n,), "t2i": (m,)}[direction]
    if reduction == "sum":
        return 1.0, [weight] * len(counts)
    queries = n * (2 if contrastive == "info_nce" and direction == "both" else 1)
    return 1.0 / queries, [weight / c for c in counts]


def loss(img_q: Tensor, txt_all: Tensor, txt_q: Tensor, img_all: Tensor, scale: Tensor, bias: Tensor,
         positives: Tensor, t2i_pairs: Tuple[Tensor, Tensor], lists: List[Tensor], contrastive: str, tau: float,
         direction: str, block: int, contrastive_weight: float, ndcg_weights: List[float],
         shared: bool = False) -> Tensor:
    """``contrastive_weight`` x the sum of :func:`terms`' contrastive per-query losses + the sum
    of each smooth-NDCG direction's times its ``ndcg_weights`` entry (the arguments are
    :func:`terms`'): the combined loss reduced. Where a gradient is wanted the op makes it in the
    forward, block by block while the block's similarities are in hand (fused: two passes of
    three matmuls, none in the backward, which scales the made gradients); otherwise the op
    gives the per-query losses only. ``shared``: txt_q is txt_all, img_all is img_q and
    ``t2i_pairs`` is (positives, arange(n)) (one process's batch, :func:`_single_process`): the op
    sums each embedding's two gradients into one buffer, and InfoNCE's positives' logits are made
    once for both directions."""
    wanted = torch.is_grad_enabled() and any(t.requires_grad for t in (img_q, txt_all, txt_q, img_all, scale, bias))
    if not wanted:
        per_query, ranked = terms(img_q, txt_all, txt_q, img_all, scale, bias, positives, t2i_pairs, lists,
                                  contrastive, tau, direction, block, shared)
        return contrastive_weight * per_query.sum() + sum(w * r.sum() for w, r in zip(ndcg_weights, ranked))
    acc = acc_dtype(img_q.dtype)
    nr, nc = img_q.shape[0], txt_q.shape[0]
    w_row = img_q.new_full((nr,), contrastive_weight if contrastive == "siglip" or direction != "t2i" else 0.0,
                           dtype=acc)
    w_col = img_q.new_zeros((nc,), dtype=acc)
    if contrastive == "info_nce" and direction != "i2t":   # each caption's logsumexp, once a query it is
        cols = t2i_pairs[0]
        w_col.index_add_(0, cols, img_q.new_full(cols.shape, contrastive_weight, dtype=acc))
    queries = [nr, nc] if direction == "both" else [nr if direction == "i2t" else nc]
    w_ndcg = torch.cat([img_q.new_full((q,), w, dtype=acc) for q, w in zip(queries, ndcg_weights)])
    total = contrastive_ranking_from_embeddings(
        img_q, txt_all, txt_q, img_all, scale, bias, positives, lists, [w_row, w_col, w_ndcg], contrastive, tau,
        DIRECTION_CODE[direction], block, shared)[3]
    if contrastive == "siglip":
        return total
    s = scale.to(acc).reshape(())
    positive = _positive_logits(img_q, txt_all, txt_q, img_all, s, positives, t2i_pairs, direction, shared)
    return total - contrastive_weight * sum(p.sum() for p in positive)


def _reference(img, txt, relevance, scale, bias, positives, contrastive, tau, direction, reduction):
    """The same two terms on the (n, m) similarity in plain PyTorch: O(n * m) memory."""
    acc = acc_dtype(img.dtype)
    a, b, s = img.to(acc), txt.to(acc), scale.to(acc).reshape(())
    if contrastive == "siglip":
        per_query = R.siglip_per_query(a, b, s, bias.to(acc).reshape(()), positives)
    else:
        per_query = torch.cat(R.info_nce_per_query(a, b, s, positives, direction))
    ranked = SN.smooth_ndcg_loss(a @ b.t(), relevance.to_dense(acc), tau, direction, reduction, impl="reference")
    return reduce([per_query], reduction), ranked


def _checked(check_hyper, img, txt, relevance, logit_scale, logit_bias, positives, contrastive, weight, tau, direction,
             reduction, block, impl) -> tuple:
    """(contrastive, weight, tau, direction, reduction, block, scale, bias, positives, native) as
    the loss uses them, ``native`` False where the reference path runs; or the error that names
    the bad argument. The hyper-parameters are checked by ``check_hyper``: the op's own, or, for
    its module form, none (the module checked them when they were set)."""
    hyper = check_hyper(contrastive, weight, tau, direction, reduction, block)
    impl = V.check_impl(impl)
    scale, bias, pos = check_inputs(img, txt, relevance, logit_scale, logit_bias, positives, hyper[0])
    return (*hyper, scale, bias, pos, has_native(img.device, impl, "smooth_ndcg_loss"))


def _single_process(img: Tensor, txt: Tensor, relevance: TopKRelevance, scale: Tensor, bias: Tensor,
                    positives: Tensor, direction: str) -> tuple:
    """:func:`terms`' (and :func:`loss`'s) tensor arguments for one process's batch."""
    t2i_pairs = (positives, torch.arange(img.shape[0], device=img.device))
    # the blocks compute in the accumulation dtype anyway; upcast here, each embedding once, so
    # that its two gradients (queries of one pass, documents of the other) are summed there and
    # rounded to a half dtype once, not each rounded and then summed in it
    acc = acc_dtype(img.dtype)
    a, b = img.to(acc), txt.to(acc)
    return a, b, b, a, scale, bias, positives, t2i_pairs, relevance_lists(relevance.detach(), direction)


def both_terms(img: Tensor, txt: Tensor, relevance: TopKRelevance, logit_scale, logit_bias=None,
               positives: Optional[Tensor] = None, contrastive: str = "info_nce", tau: float = 0.01,
               direction: str = "both", reduction: str = "mean", block: Optional[int] = None,
               impl: str = "auto") -> Tuple[Tensor, Tensor]:
    """(the contrastive loss, smooth-NDCG unweighted) of
    :func:`contrastive_smooth_ndcg_loss_from_embeddings`, for the callers that report them apart
    (fastrank.compat.open_clip's ``output_dict``); the arguments are that function's. Each term
    takes its own upstream gradient: the backward makes the blocks again (not fused)."""
    contrastive, _, tau, direction, reduction, block, scale, bias, pos, native = _checked(
        _check_hyper, img, txt, relevance, logit_scale, logit_bias, positives, contrastive, 0.0, tau, direction,
        reduction, block, impl)
    if not native:
        return _reference(img, txt, relevance, scale, bias, pos, contrastive, tau, direction, reduction)
    per_query, ranked = terms(*_single_process(img, txt, relevance, scale, bias, pos, direction), contrastive, tau,
                              direction, block or 0, shared=True)
    return reduce([per_query], reduction), reduce(ranked, reduction)


# ---------------------------------------------------------------- the loss
def contrastive_smooth_ndcg_loss_from_embeddings(
        img: Tensor, txt: Tensor, relevance: TopKRelevance, logit_scale, logit_bias=None,
        positives: Optional[Tensor] = None, contrastive: str = "info_nce", weight: float = 1.0, tau: float = 0.01,
        direction: str = "both", reduction: str = "mean", block: Optional[int] = None,
        impl: str = "auto") -> Tensor:
    """A contrastive loss plus ``weight`` x smooth-NDCG (docs/spec.md §2.13), from the embeddings:
    ``info_nce_loss_from_embeddings(img, txt, logit_scale, positives, direction, reduction)``
    (or ``siglip_loss_from_embeddings(img, txt, logit_scale, logit_bias, positives, reduction)``)
    ``+ weight * smooth_ndcg_loss(img @ txt.T, relevance, tau, direction, reduction)``, each block
    of similarities made once for both terms and the (n, m) matrix and its gradient never held.

    With the defaults it equals ``open_clip.ClipLoss()(img, txt, logit_scale) + weight *
    fastrank.smooth_ndcg_loss(img @ txt.T, relevance, tau)``, value and the gradients of img,
    txt and logit_scale (and with ``contrastive="siglip"``, SigLipLoss and logit_bias's).

    Args:
        img: (n, dim) image (query) embeddings; txt: (m, dim) caption (document) embeddings,
            same dtype and device.
        relevance: a :class:`fastrank.TopKRelevance` of shape (n, m): each image's k graded
            captions (>= 0), the graded target of smooth-NDCG.
        logit_scale: the contrastive logits' multiplier, a one-element tensor (learnable) or a
            number (open_clip passes ``logit_scale.exp()``); smooth-NDCG ranks the unscaled
            similarities ``img @ txt.T`` (its own temperature is ``tau``).
        logit_bias: SigLIP's bias (required with ``contrastive="siglip"``, None with InfoNCE).
        positives: None (image i's positive is caption i: needs n == m) or an int64 (n,)
            tensor, each image's positive caption.
        contrastive: "info_nce" (CLIP's symmetric cross-entropy) or "siglip".
        weight: the multiplier of smooth-NDCG (>= 0).
        tau: smooth-NDCG's temperature (> 0).
        direction: "both", "i2t" or "t2i": InfoNCE's and smooth-NDCG's directions (SigLIP's terms
            are per pair).
        reduction: "mean" (each term's own: InfoNCE's mean over its per-query losses, SigLIP's
            over the images, smooth-NDCG's mean of each direction, the directions summed) or
            "sum". No "none": the two terms' queries differ.
        block: queries per block (None: as many as keep a block's similarities near 4M values).
        impl: "auto", "native" (the blocks) or "reference" (the (n, m) matrix in plain
            PyTorch: O(n * m) memory).

    Memory: O((n + m) * dim + block * max(n, m) + n * k); work: two passes of blocks (images
    against captions for i2t, captions against images for t2i), the smooth-NDCG kernels'
    O(n * m * k) sparse path. Where a gradient is wanted (grad mode on and an input requiring
    it), each block's gradient is made in the forward while its similarities are in hand: three
    matmuls a block a pass and none in the backward (the matrix path's three, twice); otherwise
    one a block a pass.
    """
    return _contrastive_smooth_ndcg_loss_from_embeddings(_check_hyper, img, txt, relevance, logit_scale, logit_bias,
                                                         positives, contrastive, weight, tau, direction, reduction,
                                                         block, impl)


def _contrastive_smooth_ndcg_loss_from_embeddings(check_hyper, img, txt, relevance, logit_scale, logit_bias, positives,
                                                  contrastive, weight, tau, direction, reduction, block, impl):
    """contrastive_smooth_ndcg_loss_from_embeddings with its hyper-parameters checked by
    ``check_hyper``: the op's own, or, for its module form, none (the module checked them when
    they were set)."""
    contrastive, weight, tau, direction, reduction, block, scale, bias, pos, native = _checked(
        check_hyper, img, txt, relevance, logit_scale, logit_bias, positives, contrastive, weight, tau, direction,
        reduction, block, impl)
    if not native:
        contrastive_loss, ranked = _reference(img, txt, relevance, scale, bias, pos, contrastive, tau, direction,
                                              reduction)
        return contrastive_loss + weight * ranked
    return loss(*_single_process(img, txt, relevance, scale, bias, pos, direction), contrastive, tau, direction,
                block or 0, *reduction_weights(reduction, img.shape[0], txt.shape[0], contrastive, direction, weight),
                shared=True)


class ContrastiveSmoothNDCGLossFromEmbeddings(ModuleForm, functional=contrastive_smooth_ndcg_loss_from_embeddings,
                                              inputs=("img", "txt", "relevance", "logit_scale", "logit_bias",
                                                      "positives"),
                                              check=_check_hyper,
                                              checked=_contrastive_smooth_ndcg_loss_from_embeddings):
    """Module form of :func:`fastrank.contrastive_smooth_ndcg_loss_from_embeddings`:
    ``loss = ContrastiveSmoothNDCGLossFromEmbeddings(weight=0.5, tau=0.05)(img, txt, relevance, logit_scale)``."""


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
def _examples(dtype, seed=0, size=(5, 7)):
    g = C.gen(seed)
    n, m = size
    img = torch.nn.functional.normalize(torch.randn(n, 6, generator=g, dtype=torch.float64), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(m, 6, generator=g, dtype=torch.float64), dim=1)
    rel = torch.rand(size, generator=g, dtype=torch.float64) * (torch.rand(size, generator=g) < 0.4)
    x = {"img": (img * 2).to(dtype), "txt": (txt * 2).to(dtype),
         "relevance": TopKRelevance.from_dense(rel.to(dtype), min(3, m)),
         "logit_scale": torch.tensor(4.0, dtype=dtype), "positives": torch.randint(0, m, (n,), generator=g)}
    siglip = {**x, "logit_bias": torch.tensor(-1.5, dtype=dtype)}
    return [C.Example("info_nce, both, mean, block 2", x,
                      {"weight": 0.7, "tau": 0.3, "direction": "both", "reduction": "mean", "block": 2,
                       "impl": "native"}, ("img", "txt", "logit_scale")),
            C.Example("siglip, t2i, sum", siglip,
                      {"contrastive": "siglip", "tau": 0.5, "direction": "t2i", "reduction": "sum", "impl": "native"},
                      ("img", "txt", "logit_scale", "logit_bias"))]


def _samples(ex):
    h, x = ex.hyper, ex.inputs
    direction, contrastive = h.get("direction", "both"), h.get("contrastive", "info_nce")
    img, txt, scale = (x[k].detach().clone().requires_grad_(True) for k in ("img", "txt", "logit_scale"))
    bias = x.get("logit_bias", torch.zeros((), dtype=scale.dtype)).detach().clone().requires_grad_(True)
    lists = relevance_lists(x["relevance"], direction)
    hyper = (contrastive, h["tau"], DIRECTION_CODE[direction], h.get("block") or 0, False)
    args = (img, txt, txt, img, scale, bias, x["positives"], lists)
    outs = contrastive_ranking_from_embeddings(*(a.detach() for a in args[:7]), lists, [], *hyper)[:3]
    weights = [C.upstream(o) for o in outs]
    return [("fastrank::contrastive_ranking_from_embeddings", (*args, [], *hyper)),
            ("fastrank::contrastive_ranking_from_embeddings", (*args, weights, *hyper)),
            ("fastrank::contrastive_ranking_from_embeddings", (*args, weights, *hyper[:-1], True)),   # one batch
            ("fastrank::contrastive_ranking_from_embeddings_backward",
             (*weights, *(a.detach() for a in args[:7]), lists, *hyper[:-1]))]


_BAD = CL._BAD + (
    C.BadInput("relevance as a matrix", TypeError, "relevance", inputs=lambda x: {"relevance": x["relevance"].to_dense()}),
    C.BadInput("relevance of other rows", ValueError, "relevance",
               inputs=lambda x: {"relevance": x["relevance"].rows_of(1, x["img"].shape[0])}),
    C.BadInput("a negative relevance", ValueError, "relevance",
               inputs=lambda x: {"relevance": TopKRelevance(x["relevance"].indices, -x["relevance"].values - 1,
                                                            x["relevance"].num_columns)}),
    C.BadInput("logit_bias with InfoNCE", ValueError, "logit_bias", inputs=lambda x: {"logit_bias": 1.0}),
    C.BadInput("contrastive is not one", ValueError, "contrastive", hyper={"contrastive": "triplet"}),
    C.BadInput("weight < 0", ValueError, "weight", hyper={"weight": -1.0}),
    C.BadInput("tau = 0", ValueError, "tau", hyper={"tau": 0.0}),
    C.BadInput("reduction none", ValueError, "reduction", hyper={"reduction": "none"}),
    C.BadInput("direction is not a direction", ValueError, "direction", hyper={"direction": "up"}),
)

# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (
    Loss("contrastive_smooth_ndcg_from_embeddings", contrastive_smooth_ndcg_loss_from_embeddings,
         ContrastiveSmoothNDCGLossFromEmbeddings,
         C.Contract(("fastrank::contrastive_ranking_from_embeddings",
                     "fastrank::contrastive_ranking_from_embeddings_backward"), _examples, _samples, _BAD),
         combined=False, cuda_matrix="test_contrastive_smooth_ndcg.py"),
)
