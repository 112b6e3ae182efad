"""Graded-relevance metrics: NDCG, Kendall tau-b and the Coherent Score CS@K (docs/spec.md §5).

All three take ``sim`` (N, M) (row i = image i, column j = caption j) and ``relevance`` of
the same shape, and return ``{"i2t": float, "t2i": float}``: i2t ranks the M captions of
each image (rows), t2i the N images of each caption (columns of ``sim`` and of
``relevance``). Each value is the mean over that direction's queries.

- ``ndcg``: ``sklearn.metrics.ndcg_score`` with gains 2^r - 1 (so it equals
  ``ndcg_score(2 ** r - 1, sim)``), ties in the scores averaged the way sklearn does
  (``ignore_ties=False``: tied items share the mean of their positions' discounts); a
  query whose gains are all 0 scores 0, as in sklearn.
- ``kendall_tau``: ``scipy.stats.kendalltau`` (tau-b) between a query's scores and its
  relevance over all candidates.
- ``coherent_score``: CS@K (Ladder Loss): tau-b between the scores and the relevance of the
  model's own top-K list of each query.

Kendall tau-b is undefined for a query whose scores or relevance are all equal (scipy
returns NaN); such a query is left out of the mean and counted in ``result.skipped``
(``{"i2t": n, "t2i": m}``); if every query is left out the mean is 0.0.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import _validation as V
from ..reference.ndcg_terms import gains
from ._common import (MetricResult, TieRuns, argsort_rows, arange_labels, blocks, both_directions,
                      check_graded, check_scores, check_values, count_at_least, no_ties, orient, sort_rows)
from ._kendall import discordant_pairs


def _discounts(n: int, k: Optional[int], device) -> Tensor:
    """1 / log2(p + 2) for 0-based positions p < n, zero from position k on (sklearn)."""
    p = torch.arange(n, dtype=torch.float64, device=device)
    d = 1.0 / torch.log2(p + 2.0)
    if k is not None:
        d = torch.where(p < k, d, torch.zeros_like(d))
    return d


def graded_block(x: Tensor, y: Tensor, *, want_ndcg: bool = False, ndcg_k: Optional[int] = None,
                 want_tau: bool = False, tau_impl: str = "auto") -> Dict[str, Tensor]:
    """Per-query NDCG and/or tau-b of a block of queries.

    x: (R, n) scores, y: (R, n) relevance (rows = queries). Returns a dict with
    "ndcg" (R,) float64 and/or "tau" (R,) float64 and "tau_valid" (R,) bool, and "order"
    (R, n), the ascending argsort of the scores. One argsort
    of the scores serves both metrics; ties are handled on their (sparse) runs only.
    """
    R, n = x.shape
    dev = x.device
    order = argsort_rows(x).to(dev)                # ascending scores
    xruns = TieRuns.of(x.gather(1, order))
    out: Dict[str, Tensor] = {"order": order}
    y_by_x = y.gather(1, order)                    # relevance in ascending-score order
    ys = None
    if want_tau:
        oy = argsort_rows(y_by_x).to(dev)          # positions (in score order) by relevance
        ys = y_by_x.gather(1, oy)
    if want_ndcg:
        # DCG (sklearn, gains 2^r - 1): the item at ascending position a has 0-based
        # descending rank n - 1 - a, discount 1 / log2(rank + 2), 0 from rank k on
        disc = _discounts(n, ndcg_k, dev)
        disc_asc = disc.flip(0)
        g = gains(y_by_x).double()
        dcg = g @ disc_asc
        if xruns is not None:
            # tied scores share the mean discount of the positions they span
            # (sklearn ignore_ties=False): add sum_run (mean_d * sum g - sum g d)
            flat, run = xruns.members()
            gm = g.view(-1)[flat]
            nruns = xruns.row.numel()
            sum_g = torch.zeros(nruns, dtype=torch.float64, device=dev).scatter_add_(0, run, gm)
            sum_gd = torch.zeros(nruns, dtype=torch.float64, device=dev).scatter_add_(
                0, run, gm * disc_asc[flat % n])
            csum = torch.cat((disc_asc.new_zeros(1), disc_asc.cumsum(0)))
            mean_d = (csum[xruns.start + xruns.length] - csum[xruns.start]) / xruns.length
            dcg = dcg.scatter_add(0, xruns.row, mean_d * sum_g - sum_gd)
        # IDCG: the gains sorted descending (ties do not matter there)
        if ys is None:
            ys = sort_rows(y).to(dev)
        idcg = gains(ys).double().flip(1) @ disc
        safe = torch.where(idcg > 0, idcg, torch.ones_like(idcg))
        out["ndcg"] = torch.where(idcg > 0, dcg / safe, torch.zeros_like(idcg))
    if want_tau:
        tot = n * (n - 1) // 2
        yruns = TieRuns.of(ys)
        # labels: x nondecreasing along the score order, y aligned with it; equal
        # values share a label (what the discordant-pair counter needs)
        ylab = yruns.labels() if yruns is not None else arange_labels(R, n, dev)
        yd = torch.empty(R, n, dtype=torch.int64, device=dev).scatter_(1, oy, ylab)
        xd = xruns.labels() if xruns is not None else arange_labels(R, n, dev)
        n1 = xruns.tied_pairs() if xruns is not None else no_ties(R, dev)   # tied in x
        n2 = yruns.tied_pairs() if yruns is not None else no_ties(R, dev)   # tied in y
        n3 = no_ties(R, dev)                                                 # tied in both
        if xruns is not None and yruns is not None:
            flat, run = xruns.members()
            key, perm = torch.sort(run * (n + 1) + yd.view(-1)[flat])
            joint = TieRuns.of(key.view(1, -1))
            if joint is not None:
                rows = xruns.row[run[perm[joint.start]]]
                n3 = n3.scatter_add_(0, rows, joint.length * (joint.length - 1) // 2)
        dis = discordant_pairs(xd, yd, tau_impl).to(dev)                    # strictly discordant
        # scipy.stats.kendalltau: (tot - n1 - n2 + n3 - 2 dis) / sqrt(tot - n1) / sqrt(tot - n2)
        valid = (n1 < tot) & (n2 < tot)
        con_minus_dis = (tot - n1 - n2 + n3 - 2 * dis).double()
        den = torch.sqrt((tot - n1).double().clamp_min(1.0)) * torch.sqrt((tot - n2).double().clamp_min(1.0))
        tau = torch.where(valid, con_minus_dis / den, torch.zeros_like(den))
        out["tau"], out["tau_valid"] = tau.clamp(-1.0, 1.0), valid
    return out


def top_k_index(x: Tensor, k: int, order: Optional[Tensor] = None) -> Tensor:
    """(R, k) column indices of each row's top-k list (k capped at n): the k highest
    scores, ties at the k-th place broken by the lower candidate index. ``order`` (an
    ascending argsort of the rows, if already computed) saves the top-k search."""
    R, n = x.shape
    k = min(k, n)
    if order is not None:
        idx = order[:, n - k:]
        if k == n:
            return idx
        cut = x.gather(1, order[:, n - k - 1:n - k + 1])
        tied = cut[:, 0] == cut[:, 1]                  # the k-th place is shared
    else:
        vals, idx = x.topk(k, dim=1)
        tied = count_at_least(x, vals[:, -1:])[:, 0] > k
    if bool(tied.any()):
        rows = tied.nonzero()[:, 0]
        xr = x[rows]
        thr = xr.topk(k, dim=1).values[:, -1:]
        above = xr > thr
        eq = xr == thr
        need = k - above.sum(dim=1, keepdim=True)
        sel = above | (eq & (eq.cumsum(dim=1) <= need))
        idx = idx.clone()
        idx[rows] = sel.nonzero()[:, 1].view(-1, k)
    return idx


def graded_direction(sim: Tensor, relevance: Tensor, direction: str, *, want_ndcg: bool = False,
                     ndcg_k: Optional[int] = None, want_tau: bool = False,
                     cs_ks: Sequence[int] = (), tau_impl: str = "auto") -> Dict[str, Tuple[float, int]]:
    """Means over one direction's queries: {"ndcg": (mean, 0), "tau": (mean, skipped),
    "cs{k}": (mean, skipped)} for what is asked. sim, relevance: checked (N, M) tensors."""
    xs, ys = orient(sim, direction), orient(relevance, direction)
    q, n = xs.shape
    sums: Dict[str, Tensor] = {}
    counts: Dict[str, int] = {}
    skipped: Dict[str, int] = {}

    def add(name, values, valid=None):
        if valid is not None:
            values = torch.where(valid, values, torch.zeros_like(values))
            skipped[name] = skipped.get(name, 0) + int((~valid).sum())
            counts[name] = counts.get(name, 0) + int(valid.sum())
        else:
            counts[name] = counts.get(name, 0) + values.numel()
        sums[name] = sums.get(name, 0.0) + values.sum()

    for a, b in blocks(q, n):
        x = xs[a:b].contiguous()
        y = ys[a:b].contiguous()
        order = None
        if want_ndcg or want_tau:
            res = graded_block(x, y, want_ndcg=want_ndcg, ndcg_k=ndcg_k, want_tau=want_tau,
                               tau_impl=tau_impl)
            order = res["order"]
            if want_ndcg:
                add("ndcg", res["ndcg"])
            if want_tau:
                add("tau", res["tau"], res["tau_valid"])
        for k in cs_ks:
            idx = top_k_index(x, k, order)
            res = graded_block(x.gather(1, idx), y.gather(1, idx), want_tau=True, tau_impl=tau_impl)
            add(f"cs{k}", res["tau"], res["tau_valid"])
    out = {}
    for name, total in sums.items():
        c = counts[name]
        out[name] = (float(total) / c if c else 0.0, skipped.get(name, 0))
    return out


def ndcg(sim: Tensor, relevance: Tensor, k: Optional[int] = None) -> MetricResult:
    """NDCG@k of each query, averaged per direction (docs/spec.md §5).

    Equals ``sklearn.metrics.ndcg_score(2 ** relevance - 1, sim, k=k)`` on the rows (i2t)
    and on the columns (t2i): DCG = sum_j g_j * d(rank_j) with g = 2^r - 1 and
    d(p) = 1 / log2(p + 1) for 1-based positions p <= k (0 beyond), tied scores sharing the
    mean discount of the positions they span; IDCG = the DCG of the gains sorted
    descending; a query with IDCG = 0 scores 0.

    Args:
        sim: (N, M) scores, rows = images, columns = captions.
        relevance: (N, M) graded relevance, >= 0.
        k: cutoff (int >= 1) or None for the full list.
    Returns:
        MetricResult {"i2t": float, "t2i": float} (``skipped`` all 0).
    """
    sim = check_scores(sim, values=False)
    relevance = check_graded(relevance, sim, values=False)
    if k is not None:
        k = V.check_int(k, "k")
    # gains 2^r - 1, as sklearn.metrics.ndcg_score: relevance must be >= 0
    check_values(sim, relevance, relevance_min=0.0, metric="ndcg")
    return both_directions(
        lambda d: graded_direction(sim, relevance, d, want_ndcg=True, ndcg_k=k)["ndcg"])


def kendall_tau(sim: Tensor, relevance: Tensor) -> MetricResult:
    """Kendall tau-b between each query's scores and its relevance, averaged per direction.

    Per query equals ``scipy.stats.kendalltau(scores, relevance).statistic`` (tau-b:
    (n_c - n_d) / sqrt((n0 - n1)(n0 - n2)), n1 / n2 the pairs tied in scores / relevance).
    Queries with constant scores or constant relevance (tau undefined) are left out of the
    mean and counted in ``result.skipped[direction]``. O(n log n) per query.

    Args:
        sim: (N, M) scores; relevance: (N, M).
    Returns:
        MetricResult {"i2t": float, "t2i": float} with ``skipped`` {"i2t": int, "t2i": int}.
    """
    sim = check_scores(sim, values=False)
    relevance = check_graded(relevance, sim, values=False)
    check_values(sim, relevance)
    return both_directions(lambda d: graded_direction(sim, relevance, d, want_tau=True)["tau"])


def coherent_score(sim: Tensor, relevance: Tensor, k: int) -> MetricResult:
    """Coherent Score CS@K (Ladder Loss): Kendall tau-b between the scores and the relevance
    of each query's top-K list, averaged per direction.

    The top-K list holds the K highest scores of the query (K capped at the number of
    candidates; ties at the K-th place go to the lower candidate index). tau-b is taken
    between those K scores and their K relevance values (scipy.stats.kendalltau); a query
    whose list is constant on either side is skipped and counted in ``result.skipped``.

    Args:
        sim: (N, M) scores; relevance: (N, M); k: list length (int >= 1).
    Returns:
        MetricResult {"i2t": float, "t2i": float} with ``skipped``.
    """
    sim = check_scores(sim, values=False)
    relevance = check_graded(relevance, sim, values=False)
    k = V.check_int(k, "k")
    check_values(sim, relevance)
    return both_directions(lambda d: graded_direction(sim, relevance, d, cs_ks=(k,))[f"cs{k}"])
