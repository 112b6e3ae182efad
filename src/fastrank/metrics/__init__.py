"""Retrieval metrics (docs/spec.md §5), computed in blocks of queries on the tensor's device.

``sim`` is (n_images, n_captions): rows are image queries (i2t), columns caption queries
(t2i). Binary ground truth comes from ``caption_to_image`` (n_captions,), the image of
each caption; graded metrics take ``relevance`` of sim's shape.

- :func:`recall_at_k`: R@K, rsum, median / mean rank (VSE++ protocol);
  :func:`coco_5fold_1k`: the COCO 1K protocol (five folds of 1000 images, averaged);
- :func:`ndcg` (sklearn ``ndcg_score`` with gains 2^r - 1), :func:`kendall_tau` (tau-b),
  :func:`coherent_score` (CS@K, Ladder Loss);
- :func:`map_at_r`, :func:`r_precision` (ECCV-Caption);
- :func:`evaluate`: all of them in one flat dict, optionally after Fast Re-ranking.

The per-direction metrics return :class:`MetricResult` ``{"i2t": float, "t2i": float}``,
a dict whose ``skipped`` attribute counts the queries a metric is undefined for.
"""
from ._common import MetricResult
from .evaluate import coco_5fold_1k, evaluate
from .graded import coherent_score, kendall_tau, ndcg
from .recall import recall_at_k
from .sets import map_at_r, r_precision

__all__ = [
    "MetricResult", "recall_at_k", "coco_5fold_1k", "ndcg", "kendall_tau", "coherent_score",
    "map_at_r", "r_precision", "evaluate",
]
