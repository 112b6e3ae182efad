"""Recall@K, median and mean rank: the VSE++ / VSE-infinity evaluation (docs/spec.md §5).

``sim`` (n_images, n_captions), ``caption_to_image`` (n_captions,) maps each caption to
its image (COCO / Flickr30K: caption j belongs to image j // 5; any layout works).

- i2t rank of image i: the best (smallest) rank among its own captions in row i;
- t2i rank of caption j: the rank of its image in column j;
- ranks are 1-based; a score tied with a negative counts against the query (rank =
  1 + number of negatives scoring >= the positive), so constant scores give the worst
  rank, never the best;
- R@K = 100 * fraction of queries with rank <= K; rsum = sum of all R@K of both
  directions; medr = floor(median rank) and meanr = mean rank, exactly as VSE++
  (``np.floor(np.median(ranks0)) + 1`` with its 0-based ranks).
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
import torch
from torch import Tensor

from ._common import (blocks, caption_lists, caption_to_image_values, check_caption_to_image, check_ks,
                      check_scores, check_values, count_at_least, use_numpy)


def i2t_ranks(sim: Tensor, caption_to_image: Tensor) -> Tensor:
    """(n_images,) int64: 1-based rank of the best-ranked own caption of each image,
    1 + #{captions >= best own score} - #{own captions >= it}."""
    n_img, n_cap = sim.shape
    own, counts = caption_lists(caption_to_image, n_img)
    slot = torch.arange(own.shape[1], device=sim.device)
    out = []
    for a, b in blocks(n_img, n_cap):
        x = sim[a:b]
        ps = x.gather(1, own[a:b])                                 # padding repeats a real caption
        best = ps.amax(dim=1, keepdim=True)
        valid = slot.unsqueeze(0) < counts[a:b].unsqueeze(1)
        out.append(1 + count_at_least(x, best)[:, 0] - ((ps >= best) & valid).sum(dim=1))
    return torch.cat(out)


def t2i_ranks(sim: Tensor, caption_to_image: Tensor) -> Tensor:
    """(n_captions,) int64: 1-based rank of each caption's image in its column,
    #{images scoring >= it} (itself included). Counted over blocks of rows of sim, so the
    columns are never copied out."""
    n_img, n_cap = sim.shape
    s_pos = sim[caption_to_image, torch.arange(n_cap, device=sim.device)]
    out = torch.zeros(n_cap, dtype=torch.int64, device=sim.device)
    for a, b in blocks(n_img, n_cap):
        if use_numpy(sim):
            out += torch.from_numpy(np.count_nonzero(sim[a:b].numpy() >= s_pos.numpy(), axis=0))
        else:
            out += (sim[a:b] >= s_pos).sum(dim=0)
    return out


def _median_rank(r: Tensor) -> float:
    return float(torch.floor(torch.quantile(r.double(), 0.5)))


def summarize(r_i2t: Tensor, r_t2i: Tensor, ks: Sequence[int]) -> Dict[str, float]:
    """The recall_at_k dict from the two rank vectors."""
    out: Dict[str, float] = {}
    for d, r in (("i2t", r_i2t), ("t2i", r_t2i)):
        for k in ks:
            out[f"{d}_r{k}"] = 100.0 * float((r <= k).double().mean())
    out["rsum"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in ks)
    for d, r in (("i2t", r_i2t), ("t2i", r_t2i)):
        out[f"{d}_medr"] = _median_rank(r)
        out[f"{d}_meanr"] = float(r.double().mean())
    return out


def recall_at_k(sim: Tensor, caption_to_image: Tensor, ks=(1, 5, 10)) -> Dict[str, float]:
    """Recall@K in both directions, with rsum and median / mean ranks (VSE++ evaluation).

    Args:
        sim: (n_images, n_captions) scores.
        caption_to_image: (n_captions,) integer tensor, the image of each caption (every
            image needs at least one caption), on sim's device.
        ks: the K values (ints >= 1).
    Returns:
        dict with ``i2t_r{k}`` and ``t2i_r{k}`` for each k (percent), ``rsum``,
        ``i2t_medr``, ``i2t_meanr``, ``t2i_medr``, ``t2i_meanr`` (1-based ranks).
    """
    sim = check_scores(sim, values=False)
    c2i = check_caption_to_image(caption_to_image, sim, values=False)
    ks = check_ks(ks, "ks")
    check_values(sim)
    caption_to_image_values(c2i, sim, every_image=True)
    return summarize(i2t_ranks(sim, c2i), t2i_ranks(sim, c2i), ks)
