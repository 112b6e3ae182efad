"""Where the trainer's graded relevance comes from (docs/spec.md §4, Listwise ITR Sec. III-C).

Every caption of a dataset is embedded once (L2-normalised); then (``fastrank.relevance``)

    relevance(image i, caption j) = max over the captions c of image i of (1 + <e_c, e_j>) / 2,

with the ground-truth pairs (caption j is one of image i's captions) set to 1. For a
training batch this is a (B * cpi, d) x (d, B) product (``BatchRelevance``); for an
evaluation gallery the same in blocks of images (``relevance_matrix``). With
``relevance.topk = K`` a training batch's relevance is truncated to each image's K best
captions, the rest 0 (``BatchRelevance.topk``), a ``fastrank.TopKRelevance``: the terms whose
loss takes one (:func:`takes_topk`) get it as it is, the others its matrix.

Sources:

- ``"sbert"``: ``fastrank.relevance.CaptionEncoder`` (the bundled all-MiniLM-L6-v2 offline
  by default, embeddings cached on disk: a dataset is encoded once, ever);
- ``"tfidf"``: L2-normalised TF-IDF vectors of the captions (scikit-learn), a cheap
  stand-in with the same structure, for tests and the ``--quick`` demo;
- ``"none"``: no relevance.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import _validation as V
from ..topk import TopKRelevance, accepts_topk

__all__ = ["CaptionRelevance", "embed_captions", "make_relevance", "takes_topk"]


@functools.lru_cache(maxsize=None)
def takes_topk(term: str) -> bool:
    """Whether the CombinedLoss term ``term`` takes its relevance as a
    :class:`fastrank.TopKRelevance` (docs/spec.md §2.1b: smooth_ndcg, kendall); the other
    terms get the matrix."""
    from ..ops.registry import LOSSES
    row = LOSSES.get(term)
    return row is not None and accepts_topk(row.functional)


def _encode_sbert(captions: Sequence[str], model: str = "", cache_dir: str = "", device=None) -> Tensor:
    """(n, d) float32 L2-normalised sentence-transformers embeddings of the captions
    (``fastrank.relevance.CaptionEncoder``: bundled model offline, disk cache)."""
    from ..relevance import CaptionEncoder
    enc = CaptionEncoder(model=model or None, device=device, cache_dir=cache_dir or None)
    return enc.encode(list(captions))


def _encode_tfidf(captions: Sequence[str]) -> Tensor:
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("relevance source 'tfidf' needs scikit-learn (pip install scikit-learn)") from e
    x = TfidfVectorizer(lowercase=True).fit_transform(list(captions))  # rows L2-normalised
    return torch.from_numpy(x.toarray()).float()


def embed_captions(captions: Sequence[str], source: str, model: str = "", cache_dir: str = "",
                   device=None) -> Optional[Tensor]:
    """(n_captions, d) float32 L2-normalised caption embeddings for ``source`` ("sbert",
    "tfidf"), or None for "none"."""
    source = V.check_choice(source, "relevance source", ("sbert", "tfidf", "none"))
    if source == "none":
        return None
    if source == "tfidf":
        return _encode_tfidf(captions)
    return _encode_sbert(captions, model, cache_dir, device)


class CaptionRelevance:
    """Relevance between the images and captions of one dataset, from caption embeddings.

    emb: (n_captions, d) L2-normalised caption embeddings; image_captions: (n_images, cpi)
    LongTensor, the captions of each image; caption_to_image: (n_captions,) LongTensor.
    The embeddings stay on ``device`` (matrices are built there).
    """

    def __init__(self, emb: Tensor, image_captions: Tensor, caption_to_image: Tensor, device=None):
        V.check_tensor(emb, "emb", 2)
        if emb.shape[0] != caption_to_image.shape[0]:
            raise ValueError(f"emb has {emb.shape[0]} rows for {caption_to_image.shape[0]} captions")
        device = torch.device(device) if device is not None else emb.device
        self.emb = emb.float().to(device)
        self.image_captions = image_captions.long().to(device)
        self.caption_to_image = caption_to_image.long().to(device)
        from ..relevance import BatchRelevance
        self._batch = BatchRelevance(self.emb, self.image_captions, device)

    @classmethod
    def from_dataset(cls, dataset, source: str, model: str = "", cache_dir: str = "",
                     device=None) -> Optional["CaptionRelevance"]:
        """Embed the captions of a :class:`~fastrank.data.PrecompDataset`; None for "none"."""
        emb = embed_captions(dataset.captions, source, model, cache_dir, device)
        if emb is None:
            return None
        return cls(emb, dataset.image_captions, dataset.caption_to_image, device)

    @classmethod
    def from_config(cls, dataset, relevance_cfg, source: Optional[str] = None) -> Optional["CaptionRelevance"]:
        """:meth:`from_dataset` with a :class:`~fastrank.train.config.RelevanceConfig`'s source
        (or ``source`` instead), model and cache directory; None for "none"."""
        rc = relevance_cfg
        return cls.from_dataset(dataset, source or rc.source, rc.model, rc.cache_dir)

    @property
    def device(self) -> torch.device:
        return self.emb.device

    def matrix(self, image_index: Tensor, caption_index: Tensor) -> Tensor:
        """(len(image_index), len(caption_index)) float32 relevance on ``self.device``:
        r[a, b] = max_c (1 + <e_c, e_{caption_index[b]}>) / 2 over the captions c of image
        image_index[a], and 1 where caption_index[b] belongs to that image
        (``fastrank.relevance.BatchRelevance``)."""
        return self._batch(image_index, caption_index)

    def topk(self, image_index: Tensor, caption_index: Tensor, k: int) -> TopKRelevance:
        """:meth:`matrix` truncated to each image's k best captions, the rest 0, the image's own
        captions always kept (``fastrank.relevance.BatchRelevance.topk``)."""
        return self._batch.topk(image_index, caption_index, k)

    def full(self) -> Tensor:
        """(n_images, n_captions) relevance of the whole dataset (evaluation;
        ``fastrank.relevance.relevance_matrix``, in blocks)."""
        from ..relevance import relevance_matrix
        return relevance_matrix(self.emb, self.emb, self.image_captions).float()


def make_relevance(dataset, source: str, model: str = "", cache_dir: str = "",
                   device=None) -> Optional[CaptionRelevance]:
    """``CaptionRelevance.from_dataset`` (None for source "none")."""
    return CaptionRelevance.from_dataset(dataset, source, model, cache_dir, device)
