"""One-call evaluation of a similarity matrix (docs/spec.md §5): every metric in one flat dict,
optionally after Fast Re-ranking (docs/spec.md §3), and the COCO 5-fold 1K protocol."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _validation as V
from ._common import (MetricResult, caption_to_image_values, check_caption_to_image, check_graded, check_ks,
                      check_scores, check_values)
from .graded import graded_direction
from .recall import i2t_ranks, summarize, t2i_ranks
from .sets import set_direction


def _rerank_scores(sim: Tensor, rerank) -> Tuple[Tensor, Tensor]:
    """(i2t scores, t2i scores): sim twice, or fastrank.fast_rerank(sim, **kwargs)."""
    if rerank is None or rerank is False:
        return sim, sim
    if rerank is True:
        kwargs = {}
    elif isinstance(rerank, dict):
        kwargs = dict(rerank)
    else:
        raise TypeError(f"rerank must be None, a bool or a dict of fast_rerank arguments, got {type(rerank).__name__}")
    import fastrank  # late: fast_rerank lives in the package root
    i2t, t2i = fastrank.fast_rerank(sim, **kwargs)
    out = []
    for name, s in (("i2t", i2t), ("t2i", t2i)):
        s = s.detach()
        if s.shape != sim.shape or not bool(torch.isfinite(s).all()):
            raise ValueError(f"fast_rerank returned {name} scores of shape {tuple(s.shape)} that are "
                             f"not finite or not of sim's shape {tuple(sim.shape)}")
        out.append(s)
    return out[0], out[1]


def evaluate(sim: Tensor, caption_to_image: Tensor, relevance: Optional[Tensor] = None,
             ks=(1, 5, 10), cs_k=(100,), rerank=None) -> MetricResult:
    """Every retrieval metric of a similarity matrix in one flat dict (docs/spec.md §5).

    Args:
        sim: (n_images, n_captions) scores.
        caption_to_image: (n_captions,) integer tensor, the image of each caption.
        relevance: optional (n_images, n_captions) graded relevance (e.g. from
            :func:`fastrank.relevance.relevance_matrix`); enables NDCG, tau and CS@K.
        ks: the K of R@K. cs_k: the K of CS@K (an empty tuple for none).
        rerank: None / False: rank by ``sim``; True or a dict of keyword arguments: rank
            by ``fastrank.fast_rerank(sim, **kwargs)`` (i2t metrics on its i2t scores, t2i
            metrics on its t2i scores).
    Returns:
        MetricResult (a dict): the :func:`recall_at_k` keys; with ``relevance`` also
        ``i2t_ndcg``, ``t2i_ndcg`` (full-list NDCG), ``i2t_tau``, ``t2i_tau``,
        ``i2t_cs{k}``, ``t2i_cs{k}`` for k in cs_k; always ``i2t_map_r``, ``t2i_map_r``,
        ``i2t_rp``, ``t2i_rp`` (positives from caption_to_image). ``result.skipped`` counts
        the queries left out of ``*_tau``, ``*_cs{k}``, ``*_map_r`` and ``*_rp``.
    """
    sim = check_scores(sim, values=False)
    c2i = check_caption_to_image(caption_to_image, sim, values=False)
    ks = check_ks(ks, "ks")
    cs_k = () if cs_k is None or (isinstance(cs_k, (tuple, list)) and len(cs_k) == 0) else check_ks(cs_k, "cs_k")
    rel = check_graded(relevance, sim, values=False) if relevance is not None else None
    check_values(sim, rel)
    caption_to_image_values(c2i, sim, every_image=True)
    scores = dict(zip(("i2t", "t2i"), _rerank_scores(sim, rerank)))

    r_t2i = t2i_ranks(scores["t2i"], c2i)
    out = MetricResult(summarize(i2t_ranks(scores["i2t"], c2i), r_t2i, ks))
    if rel is not None:
        graded = {d: graded_direction(scores[d], rel, d, want_ndcg=True, want_tau=True, cs_ks=cs_k)
                  for d in ("i2t", "t2i")}
        for name in ["ndcg", "tau"] + [f"cs{k}" for k in cs_k]:
            for d in ("i2t", "t2i"):
                value, skipped = graded[d][name]
                out[f"{d}_{name}"] = value
                if name != "ndcg":
                    out.skipped[f"{d}_{name}"] = skipped
    sets = {d: set_direction(scores[d], "c2i", c2i, d, t2i_ranks=r_t2i) for d in ("i2t", "t2i")}
    for i, name in enumerate(("map_r", "rp")):
        for d in ("i2t", "t2i"):
            out[f"{d}_{name}"], out.skipped[f"{d}_{name}"] = sets[d][i]
    return out


def coco_5fold_1k(sim: Tensor, caption_to_image: Tensor, relevance: Optional[Tensor] = None,
                  ks=(1, 5, 10), cs_k=(100,), rerank=None) -> MetricResult:
    """The COCO 1K protocol: :func:`evaluate` on five folds, every value averaged.

    Fold f holds images [f * n/5, (f + 1) * n/5) (n = n_images, a multiple of 5; 1000
    images on the COCO 5K test set) and their own captions, in their original order
    (for the usual 5-captions-per-image layout, captions [5000 f, 5000 (f + 1))); scores,
    relevance and re-ranking are restricted to the fold. The 5K numbers are plain
    :func:`evaluate` / :func:`recall_at_k` on the whole matrix.

    Returns:
        MetricResult with evaluate's keys, each the mean over the folds (medr and meanr
        included, as in VSE++); ``skipped`` summed over the folds.
    """
    sim = check_scores(sim, values=False)
    c2i = check_caption_to_image(caption_to_image, sim, values=False)
    n_img = sim.shape[0]
    if n_img % 5:
        raise ValueError(f"coco_5fold_1k needs a number of images divisible by 5, got sim of shape {tuple(sim.shape)}")
    if relevance is not None:
        V.check_relevance(relevance, sim, values=False)
    check_values(sim, relevance)
    caption_to_image_values(c2i, sim, every_image=True)
    size = n_img // 5
    folds = []
    for f in range(5):
        lo, hi = f * size, (f + 1) * size
        cols = ((c2i >= lo) & (c2i < hi)).nonzero()[:, 0]
        rel = relevance[lo:hi][:, cols] if relevance is not None else None
        folds.append(evaluate(sim[lo:hi][:, cols], c2i[cols] - lo, rel, ks=ks, cs_k=cs_k, rerank=rerank))
    out = MetricResult({k: sum(r[k] for r in folds) / 5 for k in folds[0]},
                       {k: sum(r.skipped[k] for r in folds) for k in folds[0].skipped})
    return out


__all__ = ["evaluate", "coco_5fold_1k"]
