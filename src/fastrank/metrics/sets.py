"""mAP@R and R-Precision, the ECCV-Caption metrics (docs/spec.md §5).

For a query with R positives (its ground-truth matches) and the candidates ranked by
score, descending:

- R-Precision = (number of positives in the top R) / R;
- mAP@R = (1 / R) * sum_{i=1..R} P@i * 1[item at position i is a positive], where
  P@i = (positives in the top i) / i.

Positives come from ``caption_to_image`` (n_captions,) (image i's positives are its
captions, caption j's positive is its image) or from a bool (N, M) mask (t2i uses its
columns). A score tied between a positive and a negative is ranked with the negative
first (pessimistic); queries without any positive are left out and counted in
``result.skipped``.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from ._common import (MetricResult, blocks, caption_lists, caption_to_image_values, check_positives_any,
                      check_scores, check_values, count_at_least, orient)


def set_block(x: Tensor, pos_scores: Tensor, n_pos: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Per-query (mAP@R, R-Precision, has-positive) of a block of queries.

    x: (R, n) scores; pos_scores: (R, k) each query's positive scores sorted descending,
    -inf beyond its n_pos (R,) positives. The j-th positive (j = 1..R) sits at position
    rank_j = j + #{negatives scoring >= it} = j + #{all >= it} - #{positives >= it};
    it is in the top R when rank_j <= R and then adds P@rank_j = j / rank_j to mAP@R.
    """
    rows, n = x.shape
    k = pos_scores.shape[1]
    ge_all = count_at_least(x, pos_scores)
    neg_sorted = -pos_scores                                       # ascending, +inf padding last
    ge_pos = torch.searchsorted(neg_sorted.contiguous(), neg_sorted.contiguous(), right=True)
    j = torch.arange(1, k + 1, device=x.device)
    rank = j + ge_all - ge_pos
    r = n_pos.unsqueeze(1)
    hit = (j <= r) & (rank <= r)
    denom = n_pos.clamp_min(1).double()
    map_r = (hit * (j.double() / rank)).sum(dim=1) / denom
    rp = hit.sum(dim=1).double() / denom
    return map_r, rp, n_pos > 0


def positive_scores(x: Tensor, kind: str, pos: Tensor, direction: str, a: int, b: int,
                    lists) -> Tuple[Tensor, Tensor]:
    """(positive scores sorted descending with -inf padding, counts) of queries a..b-1."""
    neg_inf = torch.full((), float("-inf"), dtype=x.dtype, device=x.device)
    if kind == "mask":
        p = orient(pos, direction)[a:b]
        n_pos = p.sum(dim=1)
        k = max(1, int(n_pos.max()))
        return torch.where(p, x, neg_inf).topk(k, dim=1).values, n_pos
    if direction == "t2i":                                         # one image per caption
        return x.gather(1, pos[a:b].unsqueeze(1)), torch.ones(b - a, dtype=torch.int64, device=x.device)
    idx, counts = lists
    idx, n_pos = idx[a:b], counts[a:b]
    valid = torch.arange(idx.shape[1], device=x.device).unsqueeze(0) < n_pos.unsqueeze(1)
    ps = torch.where(valid, x.gather(1, idx), neg_inf)
    return ps.sort(dim=1, descending=True).values, n_pos


def set_direction(sim: Tensor, kind: str, pos: Tensor, direction: str, t2i_ranks=None):
    """((mAP@R mean, skipped), (R-P mean, skipped)) over one direction's queries.
    t2i_ranks: the recall ranks of the captions, reused when positives come from
    caption_to_image (one positive per caption: mAP@R = R-P = [rank == 1])."""
    xs = orient(sim, direction)
    q, n = xs.shape
    if kind == "c2i" and direction == "t2i":
        if t2i_ranks is None:
            from .recall import t2i_ranks as ranks
            t2i_ranks = ranks(sim, pos)
        v = float((t2i_ranks == 1).double().mean())
        return (v, 0), (v, 0)
    lists = caption_lists(pos, sim.shape[0]) if (kind == "c2i" and direction == "i2t") else None
    s_map = s_rp = 0.0
    n_valid = 0
    for a, b in blocks(q, n):
        x = xs[a:b]
        ps, n_pos = positive_scores(x, kind, pos, direction, a, b, lists)
        m, r, valid = set_block(x, ps, n_pos)
        s_map += float(m[valid].sum())
        s_rp += float(r[valid].sum())
        n_valid += int(valid.sum())
    skipped = q - n_valid
    if n_valid == 0:
        return (0.0, skipped), (0.0, skipped)
    return (s_map / n_valid, skipped), (s_rp / n_valid, skipped)


def _both(sim, positives, which: int) -> MetricResult:
    sim = check_scores(sim, values=False)
    kind, pos = check_positives_any(positives, sim, values=False)
    check_values(sim)
    if kind == "c2i":
        caption_to_image_values(pos, sim)
    out = MetricResult()
    for d in ("i2t", "t2i"):
        out[d], out.skipped[d] = set_direction(sim, kind, pos, d)[which]
    return out


def map_at_r(sim: Tensor, positives: Tensor) -> MetricResult:
    """mAP@R (ECCV-Caption), averaged over each direction's queries.

    Args:
        sim: (N, M) scores, rows = images, columns = captions.
        positives: caption_to_image, an integer (M,) tensor, or a bool (N, M) mask.
    Returns:
        MetricResult {"i2t": float, "t2i": float} in [0, 1], ``skipped`` = queries
        without a positive.
    """
    return _both(sim, positives, 0)


def r_precision(sim: Tensor, positives: Tensor) -> MetricResult:
    """R-Precision (ECCV-Caption): the fraction of a query's R positives found in its
    top R, averaged over each direction's queries. Arguments and result as map_at_r."""
    return _both(sim, positives, 1)
