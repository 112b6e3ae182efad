"""fast_rerank_topk: fast re-ranking of a gallery too large for one (N, M) matrix
(docs/spec.md §3; DVSE, Eq. 13-15), from embeddings, in blocks.

The scores are those of :func:`fastrank.fast_rerank` on sim = img_emb @ txt_emb.T:
    i2t[i, j] = gamma2 * sim[i, j] - col_lse[j],  col_lse[j] = logsumexp_l(gamma1 * sim[l, j])
    t2i[i, j] = lam2 * sim[i, j] - row_lse[i],    row_lse[i] = logsumexp_l(lam1 * sim[i, l])
Both statistics need a whole column or row of sim, so the gallery is swept in tiles of
sim that are recomputed by matrix products (cheap at embedding sizes) rather than stored:

1. image tiles sim[rows, :] (block x M): col_lse merged across tiles with logaddexp (in
   tile order: deterministic), row_lse complete per tile (fastrank::fast_rerank_lse,
   one read of the tile, on the native path; torch.logsumexp on the reference path);
2. i2t (image tiles again): scores of the tile's rows over all M texts, torch.topk along
   the row;
3. t2i (text tiles txt_rows @ img_emb.T, block x N): scores of the tile's texts over all N
   images, torch.topk along the row.
Every top-k runs along a contiguous row of a complete query, so nothing is merged across
tiles (a top-k down the columns of an image tile is ~15x slower than along rows on CPU).
Peak memory: two tiles (the products and the scores), O(N + M) statistics, the results.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .. import _validation as V
from .._native import has_native
from ._launch import acc_dtype
from .fast_rerank import check_statistics, fast_rerank_lse
from . import _contract as C
from ._row import Loss

# default tile: about 2**26 scores (256 MB in float32) per tile
_TILE_ELEMENTS = 1 << 26


class RerankTopK(NamedTuple):
    """Result of :func:`fastrank.fast_rerank_topk`; fields of a direction not asked for are None.

    i2t_indices: (N, k_i2t) int64, per image the indices of its top texts by i2t score, best first.
    i2t_scores: (N, k_i2t) the matching i2t scores (descending).
    t2i_indices: (M, k_t2i) int64, per text the indices of its top images by t2i score, best first.
    t2i_scores: (M, k_t2i) the matching t2i scores (descending).
    k_i2t = min(k, M) and k_t2i = min(k, N).
    """
    i2t_indices: Optional[Tensor]
    i2t_scores: Optional[Tensor]
    t2i_indices: Optional[Tensor]
    t2i_scores: Optional[Tensor]


def _check_embeddings(img_emb, txt_emb) -> None:
    """Structure only (types, shapes, device, dtype); the values are checked by
    :func:`_check_embedding_values` once every argument's structure has passed."""
    V.check_embedding_pair(img_emb, "img_emb", txt_emb, "txt_emb", same_dtype=True)


def _check_embedding_values(img_emb, txt_emb) -> None:
    """NaN/inf in the embeddings (docs/spec.md §1: CPU by default), named as the caller's."""
    V.check_finite(img_emb, "img_emb")
    V.check_finite(txt_emb, "txt_emb")


def _rows_per_tile(block: Optional[int], length: int, total: int) -> int:
    if block is not None:
        return min(block, total)
    return max(1, min(total, _TILE_ELEMENTS // length))


def fast_rerank_topk(img_emb: Tensor, txt_emb: Tensor, k: int, gamma: Tuple[float, float] = (25.0, 25.0),
                     lam: Tuple[float, float] = (20.0, 20.0), block: Optional[int] = None,
                     direction: str = "both", impl: str = "auto") -> RerankTopK:
    """Top-k of the fast re-ranking scores of a gallery, never holding the (N, M) matrix.

    Args:
        img_emb: (N, D) image embeddings; sim = img_emb @ txt_emb.T (normalise them first
            for cosine similarity).
        txt_emb: (M, D) caption embeddings, same dtype and device.
        k: results per query (>= 1); capped at the gallery size of each direction
            (k_i2t = min(k, M) texts per image, k_t2i = min(k, N) images per text).
        gamma, lam: as in :func:`fastrank.fast_rerank`.
        block: rows per tile (images for the i2t tiles, texts for the t2i tiles); at most
            block x M and block x N scores exist at once. None: about 2**26 scores per tile.
        direction: "i2t", "t2i" or "both".
        impl: "auto", "native" or "reference" (the statistics kernel; products and top-k
            are torch).

    Returns:
        :class:`RerankTopK` (i2t_indices, i2t_scores, t2i_indices, t2i_scores); the scores
        are in the embeddings' dtype and equal fast_rerank(img_emb @ txt_emb.T) at the
        returned indices (up to rounding of the blocked products). No gradient.
    """
    _check_embeddings(img_emb, txt_emb)
    k = V.check_int(k, "k", 1)
    if block is not None:
        block = V.check_int(block, "block", 1)
    g1, g2 = V.check_pair(gamma, "gamma")
    l1, l2 = V.check_pair(lam, "lam")
    V.check_direction(direction)
    impl = V.check_impl(impl)
    _check_embedding_values(img_emb, txt_emb)
    native = has_native(img_emb.device, impl, "fast_rerank_topk")
    out_dtype = img_emb.dtype
    acc = acc_dtype(out_dtype)
    with torch.no_grad():
        img = img_emb.to(acc).contiguous()
        txt = txt_emb.to(acc).contiguous()
        n, m = img.shape[0], txt.shape[0]
        want_i2t = direction in ("i2t", "both")
        want_t2i = direction in ("t2i", "both")

        # sweep 1: statistics over image tiles
        bi = _rows_per_tile(block, m, n)
        tile = img.new_empty((bi, m))
        col_lse = None
        row_lse = img.new_empty((n,))
        for r0 in range(0, n, bi):
            s = torch.matmul(img[r0:r0 + bi], txt.t(), out=tile[:min(bi, n - r0)])
            if native:
                cl, rl = fast_rerank_lse(s, g1, l1)
            else:
                cl, rl = torch.logsumexp(g1 * s, dim=0), torch.logsumexp(l1 * s, dim=1)
            col_lse = cl if col_lse is None else torch.logaddexp(col_lse, cl)
            row_lse[r0:r0 + s.shape[0]] = rl
        check_statistics(col_lse, row_lse, sim_name="img_emb @ txt_emb.T")

        i2t_idx = i2t_val = t2i_idx = t2i_val = None
        if want_i2t:  # sweep 2: per image, top texts by g2 * s - col_lse[j]
            ki = min(k, m)
            i2t_idx = torch.empty((n, ki), dtype=torch.int64, device=img.device)
            i2t_val = img.new_empty((n, ki))
            scores = torch.empty_like(tile)
            for r0 in range(0, n, bi):
                rows = min(bi, n - r0)
                s = torch.matmul(img[r0:r0 + rows], txt.t(), out=tile[:rows])
                sc = torch.mul(s, g2, out=scores[:rows]).sub_(col_lse)
                torch.topk(sc, ki, dim=1, out=(i2t_val[r0:r0 + rows], i2t_idx[r0:r0 + rows]))
            del scores
        del tile
        if want_t2i:  # sweep 3: per text, top images by l2 * s - row_lse[i], on text tiles
            kt = min(k, n)
            bt = _rows_per_tile(block, n, m)
            t2i_idx = torch.empty((m, kt), dtype=torch.int64, device=img.device)
            t2i_val = img.new_empty((m, kt))
            tile_t = img.new_empty((bt, n))
            scores = torch.empty_like(tile_t)
            for c0 in range(0, m, bt):
                cols = min(bt, m - c0)
                st = torch.matmul(txt[c0:c0 + cols], img.t(), out=tile_t[:cols])  # sim[:, cols].T
                sc = torch.mul(st, l2, out=scores[:cols]).sub_(row_lse)
                torch.topk(sc, kt, dim=1, out=(t2i_val[c0:c0 + cols], t2i_idx[c0:c0 + cols]))
            del tile_t, scores
    if out_dtype != acc:
        i2t_val = i2t_val.to(out_dtype) if i2t_val is not None else None
        t2i_val = t2i_val.to(out_dtype) if t2i_val is not None else None
    return RerankTopK(i2t_idx, i2t_val, t2i_idx, t2i_val)


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
def _examples(dtype, seed=0, size=(5, 7)):
    g = C.gen(seed)
    img, txt = C.scores(size[0], 4, dtype, g), C.scores(size[1], 4, dtype, g)
    return [C.Example("both, tiles of 4", {"img_emb": img, "txt_emb": txt},
                      {"k": 3, "gamma": (2.0, 3.0), "lam": (1.5, 2.5), "block": 4, "direction": "both",
                       "impl": "native"}, grad=()),
            C.Example("i2t, one tile", {"img_emb": img, "txt_emb": txt},
                      {"k": 20, "gamma": (1.0, 1.0), "lam": (1.0, 1.0), "direction": "i2t", "impl": "native"},
                      grad=())]


def _op_samples(ex):
    sim = ex.inputs["img_emb"] @ ex.inputs["txt_emb"].t()
    return [("fastrank::fast_rerank_lse", (sim, ex.hyper["gamma"][0], ex.hyper["lam"][0]))]


CONTRACT = C.Contract(
    ("fastrank::fast_rerank_lse",), _examples, _op_samples,
    (C.BadInput("img_emb is a list", TypeError, "img_emb", inputs=lambda x: {"img_emb": x["img_emb"].tolist()}),
     C.BadInput("img_emb of integers", TypeError, "img_emb", inputs=lambda x: {"img_emb": x["img_emb"].long()}),
     C.BadInput("txt_emb of another width", ValueError, "txt_emb", inputs=lambda x: {"txt_emb": x["txt_emb"][:, 1:]}),
     C.BadInput("txt_emb holds NaN", ValueError, "txt_emb",
                inputs=lambda x: {"txt_emb": torch.full_like(x["txt_emb"], float("nan"))}),
     C.BadInput("k = 0", ValueError, "k", hyper={"k": 0}),
     C.BadInput("block = 0", ValueError, "block", hyper={"block": 0}),
     C.BadInput("direction is not a direction", ValueError, "direction", hyper={"direction": "up"}),
     C.BadInput("gamma with a zero", ValueError, "gamma", hyper={"gamma": (0.0, 1.0)})))


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("fast_rerank_topk", fast_rerank_topk, None, CONTRACT, combined=False,
             no_module="a retrieval step over embeddings, not a loss: it has no state and no gradient"),)
