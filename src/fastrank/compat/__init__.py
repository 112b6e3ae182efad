"""Drop-in adapters: the loss signatures that existing training code already calls,
computed by fastrank (docs/spec.md §2.1a, 2.10: each follows its peer's conventions).

- :func:`approxNDCGLoss` (allRank, slates with padding) on the smooth-NDCG kernel;
- :class:`ContrastiveLoss` (VSE++ / VSE-infinity) on :func:`fastrank.triplet_loss`;
- :class:`ClipLoss` (open_clip) with an optional fastrank listwise term;
- :class:`SmoothAPLoss` (pytorch-metric-learning, embeddings and labels) on
  :func:`fastrank.smooth_ap_loss`;
- :class:`RecallatK` (the Recall@k surrogate authors' code) on
  :func:`fastrank.recall_at_k_loss`.

See docs/porting.md for the before/after lines of each trainer.

``fastrank.compat.sentence_transformers`` (imported only on request: it loads
sentence-transformers) holds losses for ``SentenceTransformerTrainer``: smooth-NDCG,
Smooth-AP, Kendall SW-HS and in-batch negatives + listwise, with GradCache variants
(docs/sentence-transformers.md).
"""
from .allrank import approxNDCGLoss
from .open_clip import ClipLoss
from .pml import SmoothAPLoss
from .recall_at_k import RecallatK
from .vsepp import ContrastiveLoss

__all__ = ["approxNDCGLoss", "ContrastiveLoss", "ClipLoss", "SmoothAPLoss", "RecallatK"]
