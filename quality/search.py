"""The hyper-parameter search of the quality case, on the train half only, stated in advance.

For each split, data set and loss, the search sees only the split's train items: it splits them
again (``inner_split``: a seeded permutation, ``INNER_VAL`` of them held out), trains on the
inner train items at the longest list they allow, scores on the inner held-out items' pairs and
keeps the best trial. Every loss gets the same two-stage budget:

1. the learning rate: each of ``LRS``, the loss at its grid's centre (quality/study.py
   ``GRID_CENTRE``: its library's defaults on the day the search was fixed);
2. the loss's own parameters at that learning rate: the centre times each of ``FACTORS`` (a
   temperature, scale, or Kendall SW-HS's window width and stride together); a loss without
   one (CosineSimilarityLoss) has no second stage.

A trial's score is the mean of the inner held-out Spearman's rho and NDCG@10 (the case's two
headline metrics; a missing one counts as -inf); on a tie the earlier trial wins (the centre
comes first). The chosen values are reported per split; the test half is never an argument here.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

#: the learning rates tried (AdamW), and the factors applied to a loss's default parameters
LRS = (2e-5, 5e-5, 1e-4)
FACTORS = (1 / 3, 3.0)
#: the held-out share of the inner split (Lee: 10 of the 25 train documents)
INNER_VAL = 0.4


def inner_split(train: Sequence[int], seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """(inner train, inner held-out) items: a seeded split of the train items alone."""
    perm = np.random.default_rng([seed, 7]).permutation(np.asarray(train, dtype=np.int64))
    n_val = int(round(INNER_VAL * len(perm)))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def param_grid(defaults: Dict[str, float], factors: Sequence[float] = FACTORS) -> List[Dict[str, float]]:
    """The default parameters first, then each factor applied to all of them together."""
    if not defaults:
        return [{}]
    return [dict(defaults)] + [{k: v * f for k, v in defaults.items()} for f in factors]


def score(metrics: dict) -> float:
    """The search's criterion: mean of Spearman and NDCG@10 (a missing metric: -inf)."""
    vals = [metrics.get("spearman"), metrics.get("ndcg@10")]
    if any(v is None or not math.isfinite(v) for v in vals):
        return -math.inf
    return float(np.mean(vals))


def best(trials: List[dict]) -> Optional[dict]:
    """The trial with the highest score, the earliest on a tie (None for no trial)."""
    out, top = None, -math.inf
    for t in trials:
        s = score(t["metrics"])
        if out is None or s > top:
            out, top = t, s
    return out


def choose(trials: List[dict]) -> dict:
    """The search's result: the best of the learning-rate stage's winner and the parameter
    stage's trials (each trial: ``stage`` "search-lr" or "search-params", ``metrics``)."""
    first = best([t for t in trials if t["stage"] == "search-lr"])
    return best([first] + [t for t in trials if t["stage"] == "search-params"])
