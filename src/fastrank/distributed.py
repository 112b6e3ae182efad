"""Ranking losses over the global batch of a data-parallel job ("local loss + gather with grad").

Each of the W ranks holds B_i image and B_t caption embeddings. The full-batch loss ranks,
for each of the N = W*B_i images, the M = W*B_t captions of *all* ranks (and the other
way round). Computing the full (N, M) matrix on every rank would cost an O(N^3) loss
N*M^2 work per rank, and W times the same work overall. :class:`LocalLoss` (the
open_clip scheme) instead lets every rank

1. gather all embeddings with :func:`all_gather_with_grad` (rank order, concatenated on
   dim 0, so rank r's rows are ``r*B .. (r+1)*B - 1`` of the gathered tensor);
2. score *its own* queries against all candidates: the i2t rows of its images
   ``sim_fn(img_local, txt_all)`` (B_i, M) and the t2i columns of its captions
   ``sim_fn(img_all, txt_local)`` (N, B_t); an O(N^3) loss then costs B_i*M^2 + B_t*N^2
   per rank, 1/W of the full work;
3. evaluate the loss on those queries with the matching slices of ``positives`` (the
   default diagonal becomes column ``r*B_t + i`` for local image i) and ``relevance``
   (rows ``relevance[r*B_i:(r+1)*B_i, :]``, columns ``relevance[:, r*B_t:(r+1)*B_t]``).

Gradient convention (checked by tests/test_distributed.py with 2 gloo processes):

- **Values.** Rank r returns L_r such that ``sum_r L_r == L_full``, the single-process
  loss of the gathered batch (same direction and reduction). With ``reduction="mean"``
  each direction's local per-query losses are summed and divided by the *global* number
  of queries of that direction (N for i2t, M for t2i), not by the local count; with
  ``"sum"`` they are summed; with ``"none"`` rank r returns its own per-query losses
  (B_i i2t then B_t t2i). Log ``L_r * W`` (or all-reduce L_r) to see the full loss.
- **Embedding gradients.** The backward of the gather sums, over ranks, the gradients
  that every rank's L_r sends to each gathered row (a reduce-scatter). So once *every*
  rank has called ``L_r.backward()`` (the backward is a collective: all ranks must run
  it), the gradient reaching rank r's local embeddings is exactly
  d L_full / d (rank r's embeddings): the single-process gradient, no rescaling.
- **Parameter gradients under DDP.** A parameter's gradient on rank r is then rank r's
  share of d L_full / d theta (the shares sum to the full gradient). DDP *averages*
  gradients over ranks, which gives d L_full / d theta divided by W. To train with
  exactly the single-process gradient, backpropagate ``loss * world_size``
  (``(local_loss(img, txt) * dist.get_world_size()).backward()``); leaving it out is
  the same as dividing the learning rate by W.

Without an initialised process group (or with world size 1) everything reduces to the
single-process loss.

The loss may be any fastrank loss on a 2-D ``sim`` that takes ``direction`` and
``reduction`` (all of section 2 of docs/spec.md except the DVSE losses): a functional
(``fastrank.triplet_loss``) with its keyword arguments, or a module of ``fastrank.nn``
(``fastrank.nn.SmoothNDCGLoss(tau=0.05)``), whose direction and reduction are used.
Every rank must hold the same number of images (and of captions): the gather needs
equal shapes.
"""
from __future__ import annotations

import copy
import inspect
import warnings
from typing import Callable, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

from . import _validation as V
from .topk import TopKRelevance

__all__ = ["all_gather_with_grad", "LocalLoss", "is_distributed", "local_contrastive_smooth_ndcg_loss"]


def is_distributed(group=None) -> bool:
    """True when a process group is initialised and has more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def all_gather_with_grad(x: Tensor, group=None) -> Tensor:
    """All ranks' ``x`` concatenated on dim 0 in rank order: (W * B, ...) from (B, ...).

    Differentiable: the backward sums, over ranks, the gradients that reached each
    rank's block (``torch.distributed.nn.functional.all_gather``). Identity when no
    process group is initialised or the world size is 1. Every rank must pass a tensor
    of the same shape.
    """
    if not is_distributed(group):
        return x
    from torch.distributed.nn import functional as dist_fn
    with warnings.catch_warnings():
        # deprecated in favour of _functional_collectives.all_gather_single, whose gloo
        # backend aborted at process exit in our tests; the autograd semantics are the same
        warnings.simplefilter("ignore", FutureWarning)
        parts = dist_fn.all_gather(x, group=dist.group.WORLD if group is None else group)
    return torch.cat(parts, dim=0)


def _params_of(fn) -> set:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


Pair = Tuple[Tensor, Tensor]


class LocalLoss(torch.nn.Module):
    """This rank's part of a fastrank loss over the gathered global batch (see the
    module docstring for the gradient convention: ``sum_r L_r == L_full``).

    Args:
        loss: a fastrank functional (``fastrank.triplet_loss``, ``fastrank.smooth_ndcg_loss``,
            ...) or a ``fastrank.nn`` module (its ``direction`` and ``reduction`` are used).
        sim_fn: ``sim_fn(img, txt) -> (n, m)`` scores; default ``img @ txt.T``. Must score
            each (image, caption) pair independently (e.g. a scaled dot product).
        group: the process group (default: the world).
        direction, reduction: for a functional ``loss`` (defaults "both", "mean").
        **loss_kwargs: further keyword arguments of a functional ``loss`` (``margin=0.2``, ...).

    ``forward(img_local, txt_local, relevance=None, positives=None)``:
        img_local: (B_i, D) this rank's image embeddings; txt_local: (B_t, D) its captions.
        relevance: for losses that take it: the global (N, M) matrix (N = W*B_i, M = W*B_t,
            rank-major order; relevance needs no gradient, so it can be built from gathered
            caption embeddings), a :class:`fastrank.TopKRelevance` of that shape (for the
            losses that take one), or the pair (rows (B_i, M), columns (N, B_t)) of this rank.
        positives: bool, the same two forms; None = the diagonal (needs B_i == B_t).
    Returns L_r: a scalar (``"mean"``/``"sum"``) or the local per-query losses (``"none"``).
    """

    def __init__(self, loss: Union[Callable, torch.nn.Module], sim_fn: Optional[Callable] = None,
                 group=None, direction: Optional[str] = None, reduction: Optional[str] = None,
                 **loss_kwargs):
        super().__init__()
        if isinstance(loss, torch.nn.Module):
            if direction is not None or reduction is not None or loss_kwargs:
                raise ValueError("LocalLoss: with a module loss, set direction, reduction and "
                                 "hyper-parameters on the module itself")
            if not (hasattr(loss, "direction") and hasattr(loss, "reduction")):
                raise ValueError(f"LocalLoss: {type(loss).__name__} has no direction/reduction "
                                 "attributes; pass a fastrank loss")
            self.loss = loss
            self.direction = V.check_direction(loss.direction)
            self.reduction = V.check_reduction(loss.reduction)
            params = _params_of(loss.forward)
        elif callable(loss):
            params = _params_of(loss)
            if not {"direction", "reduction"} <= params:
                raise ValueError("LocalLoss: loss must take direction= and reduction= "
                                 "(a fastrank functional on a 2-D sim)")
            self.loss = loss
            self.direction = V.check_direction("both" if direction is None else direction)
            self.reduction = V.check_reduction("mean" if reduction is None else reduction)
        else:
            raise TypeError(f"LocalLoss: loss must be a callable or nn.Module, got {type(loss).__name__}")
        self.loss_kwargs = dict(loss_kwargs)
        self.needs_relevance = "relevance" in params
        self.takes_positives = "positives" in params
        self.sim_fn = sim_fn
        self.group = group

    def _per_query(self, sim: Tensor, rel: Optional[Tensor], pos: Optional[Tensor], d: str) -> Tensor:
        """Per-query losses of direction d on this rank's block of the global sim."""
        args = [sim] + ([rel] if self.needs_relevance else [])
        kwargs = {"positives": pos} if self.takes_positives else {}
        if isinstance(self.loss, torch.nn.Module):
            view = copy.copy(self.loss)          # same hyper-parameters, one direction, per query
            view.direction, view.reduction = d, "none"
            return view(*args, **kwargs)
        return self.loss(*args, **kwargs, **self.loss_kwargs, direction=d, reduction="none")

    def forward(self, img_local: Tensor, txt_local: Tensor,
                relevance: Optional[Union[Tensor, Pair]] = None,
                positives: Optional[Union[Tensor, Pair]] = None) -> Tensor:
        V.check_tensor(img_local, "img_local", 2, finite=False)
        V.check_tensor(txt_local, "txt_local", 2, finite=False)
        if txt_local.device != img_local.device:
            raise ValueError(f"txt_local is on {txt_local.device} but img_local is on {img_local.device}")
        if self.needs_relevance and relevance is None:
            raise ValueError("LocalLoss: this loss needs relevance (global (N, M) or a (rows, cols) pair)")
        # values after the structure, before the collectives (docs/spec.md §1: CPU by default)
        V.check_finite(img_local, "img_local")
        V.check_finite(txt_local, "txt_local")
        rank = dist.get_rank(self.group) if is_distributed(self.group) else 0
        img_all = all_gather_with_grad(img_local, self.group)
        txt_all = all_gather_with_grad(txt_local, self.group)
        bi, bt = img_local.shape[0], txt_local.shape[0]
        n, m = img_all.shape[0], txt_all.shape[0]
        oi, ot = rank * bi, rank * bt
        sim_fn = self.sim_fn or (lambda a, b: a @ b.t())

        def split(x, name):
            """(rows (B_i, M), cols (N, B_t)) of a global (N, M) tensor or a given pair."""
            if isinstance(x, (tuple, list)):
                if len(x) != 2:
                    raise ValueError(f"{name} must be an (N, M) tensor or a (rows, cols) pair")
                rows, cols = x
                for t, shape, part in ((rows, (bi, m), "rows"), (cols, (n, bt), "cols")):
                    if not isinstance(t, Tensor) or tuple(t.shape) != shape:
                        raise ValueError(f"{name} {part} must be a tensor of shape {shape}, got "
                                         f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
                return rows, cols
            if isinstance(x, TopKRelevance):   # docs/spec.md §2.1b: sliced without the (N, M) matrix
                if tuple(x.shape) != (n, m):
                    raise ValueError(f"{name} must have the global shape (N, M) = {(n, m)}, got {tuple(x.shape)}")
                return x.rows_of(oi, oi + bi), x.columns_of(ot, ot + bt)
            if not isinstance(x, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, a TopKRelevance or a (rows, cols) pair, got "
                                f"{type(x).__name__}")
            if tuple(x.shape) != (n, m):
                raise ValueError(f"{name} must have the global shape (N, M) = {(n, m)}, got {tuple(x.shape)}")
            return x[oi:oi + bi], x[:, ot:ot + bt]

        rel_rows = rel_cols = pos_rows = pos_cols = None
        if self.needs_relevance:
            rel_rows, rel_cols = split(relevance, "relevance")
        if self.takes_positives:
            if positives is None:
                if bi != bt:
                    raise ValueError(f"positives=None means the diagonal, which needs as many images "
                                     f"as captions per rank; got {bi} and {bt}: pass positives")
                positives = torch.eye(n, dtype=torch.bool, device=img_local.device)
            pos_rows, pos_cols = split(positives, "positives")

        parts = []
        if self.direction in ("i2t", "both"):
            # this rank's image queries: rows oi..oi+bi of the global sim
            q = self._per_query(sim_fn(img_local, txt_all), rel_rows, pos_rows, "i2t")
            parts.append((q, n))
        if self.direction in ("t2i", "both"):
            # this rank's caption queries: columns ot..ot+bt of the global sim
            q = self._per_query(sim_fn(img_all, txt_local), rel_cols, pos_cols, "t2i")
            parts.append((q, m))
        if self.reduction == "none":
            return torch.cat([q for q, _ in parts])
        if self.reduction == "sum":
            return sum(q.sum() for q, _ in parts)
        # "mean": divide by the global query count so the ranks' values sum to the full mean
        return sum(q.sum() / total for q, total in parts)

    def extra_repr(self) -> str:
        name = getattr(self.loss, "__name__", type(self.loss).__name__)
        return f"loss={name}, direction={self.direction!r}, reduction={self.reduction!r}"


def local_contrastive_smooth_ndcg_loss(img_local: Tensor, txt_local: Tensor, relevance: TopKRelevance, logit_scale,
                                       logit_bias=None, contrastive: str = "info_nce", weight: float = 1.0,
                                       tau: float = 0.01, direction: str = "both", reduction: str = "mean",
                                       block: Optional[int] = None, group=None) -> Tensor:
    """This rank's part of :func:`fastrank.contrastive_smooth_ndcg_loss_from_embeddings` over the
    gathered global batch, with :class:`LocalLoss`'s convention (``sum_r L_r == L_full``; the
    gradient reaching each rank's embeddings is the single-process gradient of its rows; a
    learnable ``logit_scale`` / ``logit_bias`` gets this rank's share of its gradient).

    Rank r gathers the embeddings, then scores its own image queries against every caption and
    its own caption queries against every image, block by block, both terms from each block:
    1/W of the work of the whole batch, and no (N, M) (or (B, M)) matrix. The positives are the
    diagonal (image i with caption i of the global batch: every rank holds as many images as
    captions); ``relevance`` is the global (N, M) :class:`fastrank.TopKRelevance`, each rank
    taking its rows and its columns. The other arguments are the single-process function's.
    """
    from .ops import contrastive_smooth_ndcg as CS
    from .ops._launch import relevance_lists
    contrastive, weight, tau, direction, reduction, block = CS._check_hyper(contrastive, weight, tau, direction,
                                                                            reduction, block)
    V.check_embedding_pair(img_local, "img_local", txt_local, "txt_local", same_dtype=True)
    bi, bt = img_local.shape[0], txt_local.shape[0]
    if bi != bt:
        raise ValueError(f"txt_local must hold as many captions as img_local holds images (the diagonal "
                         f"positives), got {bt} and {bi}")
    rank = dist.get_rank(group) if is_distributed(group) else 0
    img_all = all_gather_with_grad(img_local, group)
    txt_all = all_gather_with_grad(txt_local, group)
    scale, bias, _ = CS.check_inputs(img_all, txt_all, relevance, logit_scale, logit_bias, None, contrastive)
    n, m, o = img_all.shape[0], txt_all.shape[0], rank * bi
    own = torch.arange(o, o + bi, device=img_local.device)
    rows = relevance_lists(relevance.rows_of(o, o + bi), "i2t")[:3]   # this rank's image rows
    lists = [*rows, *relevance.columns_of(o, o + bt).column_lists()]
    return CS.loss(img_local, txt_all, txt_local, img_all, scale, bias, own, (torch.arange(bt, device=own.device), own),
                   lists, contrastive, tau, direction, block or 0,
                   # the global batch's query counts, so that the ranks' values sum to the full mean
                   *CS.reduction_weights(reduction, n, m, contrastive, direction, weight))
