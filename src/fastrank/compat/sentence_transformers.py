"""Graded-relevance ranking losses for sentence-transformers training.

Each class here has the sentence-transformers loss contract: it is built with the model,
``loss = SmoothNDCGLoss(model)``, and the trainer calls ``loss(sentence_features, labels)``
with one tokenised feature dict per input column of the dataset and the dataset's label
column as ``labels``. So they go straight into ``SentenceTransformerTrainer(loss=...)``.
The ranking itself is computed by fastrank's functional losses on the batch's similarity
matrix:

- :class:`SmoothNDCGLoss` -> :func:`fastrank.smooth_ndcg_loss` (docs/spec.md §2.1;
  smooth-NDCG of Li et al., "Integrating Listwise Ranking into Pairwise-based Image-Text
  Retrieval", Eq. 16-21);
- :class:`SmoothAPLoss` -> :func:`fastrank.smooth_ap_loss` (docs/spec.md §2.8; Smooth-AP,
  Brown et al.);
- :class:`KendallSWLoss` -> :func:`fastrank.kendall_sw_loss` (docs/spec.md §2.3; the Kendall
  ranking loss with sliding windows and hard samples, SW-HS, of Li et al., "Image-Text
  Retrieval with Binary and Continuous Label Supervision", Eq. 18-20);
- :class:`InBatchListwiseLoss`: sentence-transformers' in-batch negatives loss
  (MultipleNegativesRankingLoss, InfoNCE) plus ``listwise_weight`` times one of the three;
- ``Cached*`` variants of all four, built on sentence-transformers' own ``CachedLossMixin``
  (its GradCache engine): the encoder runs in mini-batches of ``mini_batch_size``, so the
  batch the ranking sees is not bounded by the encoder's activation memory.

Inputs (the dataset's columns, in order):

- column 0: the queries, B of them (text, or images with a CLIP model);
- columns 1..D: the documents, D per query (``doc_1 .. doc_D``; text or images);
- ``labels`` (the dataset's ``label`` / ``score`` / ``scores`` column): graded relevance,
  a (B, D) tensor, ``labels[b, c]`` = relevance of doc ``c + 1`` of row b to query b, or
  (B,) when D == 1 (one score per (query, doc) pair); None when the dataset has no label
  column (then relevance comes from ``teacher=``, or, for Smooth-AP and the in-batch part,
  doc_1 is the positive as in MultipleNegativesRankingLoss).

Similarity matrix and relevance (the in-batch convention):

- the documents of all columns are concatenated column after column, as
  MultipleNegativesRankingLoss does: document index ``c * B + b'`` is doc ``c + 1`` of row b'.
  ``sim = similarity_fct(queries, docs)`` is (B, D * B) (cosine by default);
- ``in_batch=True`` (default): every query is ranked against all D * B documents of the
  batch. ``relevance[b, c * B + b] = labels[b, c]`` (its own documents); every other entry
  is 0 (another query's document is taken as irrelevant), or, with ``teacher=``, the
  teacher's relevance of that document to query b. For the losses whose op takes a
  :class:`fastrank.TopKRelevance` (smooth-NDCG) the relevance is one, never the (B, D * B)
  matrix: each query's D documents, and with a teacher the ``teacher_topk`` most relevant of
  the other documents by the teacher (every other document 0), so a query's list costs
  O(D * B * (D + teacher_topk)), not O((D * B)^2) (docs/spec.md §2.1b);
  ``teacher_topk=None`` keeps the teacher's whole matrix. Smooth-AP and Kendall SW-HS take
  the matrix (the teacher's whole);
- ``in_batch=False``: each query is ranked against its own D documents only: sim and
  relevance are (B, D) (``sim[b, c]`` = similarity of query b and its doc c + 1).

Relevance from a frozen teacher (``teacher=``; the relevance score calculation, RSC, of the
smooth-NDCG paper, Eq. 8; see
:func:`fastrank.relevance.teacher_relevance`): ``r = (1 + cos(g(a_b), g(d))) / 2`` with g the teacher's
sentence embedding, a_b the text of query b and d the text of the document. When the
query column holds images, the image is represented by its paired caption (row b's doc_1,
the RSC rule: the relevance of caption j to image i is the text similarity of caption j to
image i's own caption), and an image in doc_1 by its row's query text; other image
columns have no text and are rejected. Given labels override the teacher on each query's
own documents; without labels, doc_1 of each row gets relevance 1 (ground truth). Texts
are recovered by decoding the batch's token ids with the model's tokenizer (lower-cased
and truncated as the model saw them). ``teacher`` is a
:class:`fastrank.relevance.CaptionEncoder` (its model, without the disk cache), a
SentenceTransformer, or any object with ``encode(list_of_str) -> (n, dim)``; it is never
trained.

Requirements: sentence-transformers >= 3.0 for the losses (the SentenceTransformerTrainer
contract), >= 5.7 for the ``Cached*`` losses (the release that introduced
``CachedLossMixin``); tested with sentence-transformers 6.2 and transformers 5.24. This
module is imported only on request (``import fastrank.compat.sentence_transformers``),
never by ``import fastrank`` or ``import fastrank.compat``.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _validation as V
from ..ops.contrastive_smooth_ndcg import contrastive_smooth_ndcg_loss_from_embeddings
from ..ops.kendall_sw import kendall_sw_loss
from ..ops.registry import compat_losses
from ..ops.smooth_ap import smooth_ap_loss
from ..ops.smooth_ndcg import smooth_ndcg_loss
from ..topk import TopKRelevance, accepts_topk
from .cross_encoder import CrossEncoderKendallSWLoss, CrossEncoderSmoothNDCGLoss

MIN_VERSION = (3, 0)
MIN_CACHED_VERSION = (5, 7)


def _version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


try:
    import sentence_transformers as _st
except ImportError as e:  # pragma: no cover - sentence-transformers is a fastrank dependency
    raise ImportError(
        "fastrank.compat.sentence_transformers needs sentence-transformers >= 3.0 (>= 5.7 for the "
        "Cached* losses): pip install 'sentence-transformers[train]>=5.7'") from e
ST_VERSION = _version_tuple(getattr(_st, "__version__", "0"))
if ST_VERSION < MIN_VERSION:
    raise ImportError(
        f"fastrank.compat.sentence_transformers needs sentence-transformers >= 3.0 (the "
        f"SentenceTransformerTrainer loss contract; >= 5.7 for the Cached* losses), found "
        f"{_st.__version__}: pip install -U 'sentence-transformers[train]>=5.7'")

from sentence_transformers.util import cos_sim  # noqa: E402


def _find_cached_loss_mixin():
    """sentence-transformers' GradCache engine, where this version keeps it (None if absent)."""
    import importlib
    for module, attr in (("sentence_transformers.base.losses", "CachedLossMixin"),
                         ("sentence_transformers.base.losses.gradcache", "CachedLossMixin"),
                         ("sentence_transformers.losses.CachedMultipleNegativesRankingLoss", "CachedLossMixin")):
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    return None


CachedLossMixin = _find_cached_loss_mixin()

__all__ = ["SmoothNDCGLoss", "SmoothAPLoss", "KendallSWLoss", "InBatchListwiseLoss",
           "CachedSmoothNDCGLoss", "CachedSmoothAPLoss", "CachedKendallSWLoss", "CachedInBatchListwiseLoss",
           "LISTWISE_LOSSES", "CrossEncoderSmoothNDCGLoss", "CrossEncoderKendallSWLoss"]


# ---------------------------------------------------------------------------- the batch
def _modality(feature: Dict[str, Any]) -> str:
    """'text', 'image', ... of one column's features: sentence-transformers >= 6 marks it
    (``feature["modality"]``); older versions are text unless they carry pixel values."""
    m = feature.get("modality") if isinstance(feature, Mapping) else None
    if isinstance(m, str):
        return m
    if isinstance(m, (tuple, list)):
        return "+".join(str(x) for x in m)
    if "input_ids" in feature:
        return "text"
    if "pixel_values" in feature:
        return "image"
    return "unknown"


def _batch_size(feature: Dict[str, Any]) -> int:
    cu = feature.get("cu_seq_lens_q")                 # flattened inputs (DataCollatorWithFlattening)
    if isinstance(cu, Tensor) and cu.dim() == 1:
        return int(cu.shape[0]) - 1
    for key in ("input_ids", "attention_mask", "pixel_values"):
        v = feature.get(key)
        if isinstance(v, Tensor) and v.dim() > 0:
            return int(v.shape[0])
    for v in feature.values():
        if isinstance(v, Tensor) and v.dim() > 0:
            return int(v.shape[0])
    raise ValueError("sentence_features: a column's features hold no batched tensor")


@dataclass
class _Batch:
    """What a forward pass needs besides the embeddings: the validated labels (B, D) or
    None, the teacher's (B, D * B) relevance or None, and the batch's shape."""
    B: int
    D: int
    labels: Optional[Tensor]
    teacher: Optional[Tensor]


def _own_columns(B: int, D: int, device) -> Tensor:
    """(B, D): the column of each query's own documents in the in-batch (B, D * B) matrix
    (doc ``c + 1`` of row b is column ``c * B + b``)."""
    return torch.arange(B, device=device).unsqueeze(1) + B * torch.arange(D, device=device)


def _tokenizer_of(model):
    tok = getattr(model, "tokenizer", None)
    inner = getattr(tok, "tokenizer", None)  # a processor (CLIP): its text tokenizer
    return inner if inner is not None and callable(getattr(inner, "batch_decode", None)) else tok


def _teacher_topk(teacher: Tensor, own: Tensor, k: int) -> TopKRelevance:
    """Each query's own documents (relevance ``own``, (B, D), on its device) first, then the
    ``k`` other documents that the teacher's (B, D * B) relevance (on the CPU, as the teacher
    returns it) ranks highest, ties to the lower column (relevance 0: not listed): a
    TopKRelevance of D + min(k, D * B - D) entries a query, on ``own``'s device and dtype."""
    B, D = own.shape
    cols = _own_columns(B, D, teacher.device)
    k = min(k, teacher.shape[1] - D)
    if k == 0:
        return TopKRelevance(cols.to(own.device), own, teacher.shape[1])
    others = teacher.scatter(1, cols, -1.0)                     # the own documents out of the running
    values, columns = torch.topk(others, min(k + 1, others.shape[1]), dim=1)
    if values.shape[1] > k:
        # a tie across the k-th place: those rows again, the tied columns taken lowest first
        tied = (values[:, k - 1] == values[:, k]).nonzero().flatten()   # the teacher's relevance is on the CPU
        if tied.numel():
            from ..relevance import _largest
            values[tied, :k], columns[tied, :k] = _largest(others[tied], k)
        values, columns = values[:, :k], columns[:, :k]
    columns = torch.where(values > 0, columns, torch.full_like(columns, -1))
    return TopKRelevance(torch.cat([cols, columns], dim=1).to(own.device),
                         torch.cat([own, values.clamp(min=0).to(own)], dim=1), teacher.shape[1])


# ------------------------------------------------------------------------- base class
class _RankingLoss(nn.Module):
    """The shared part: checks, relevance, similarity. Subclasses define ``_rank``."""

    #: whether the loss can run without graded relevance (doc_1 = the positive)
    binary_ok = False
    #: whether ``_rank`` takes the in-batch relevance as a TopKRelevance (its op does)
    takes_topk = False
    #: the range the labels must lie in: (lo, hi), None = unbounded side
    label_bounds: Tuple[Optional[float], Optional[float]] = (0.0, None)
    #: with ``takes_topk`` and a teacher: how many of the other documents the teacher's
    #: relevance keeps a query (None: all of them, the (B, D * B) matrix)
    teacher_topk: Optional[int] = None

    def __init__(self, model, *, in_batch: bool = True, teacher=None,
                 similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim, direction: str = "i2t"):
        super().__init__()
        if not isinstance(model, nn.Module) or not callable(model):
            raise TypeError(f"model must be a SentenceTransformer, got {type(model).__name__}")
        self.model = model
        if not isinstance(in_batch, bool):
            raise TypeError(f"in_batch must be True or False, got {in_batch!r}")
        self.in_batch = in_batch
        if teacher is not None:
            from ..relevance import check_teacher
            check_teacher(teacher)
        # a plain attribute, not a submodule: the teacher is frozen and not part of the loss's state
        object.__setattr__(self, "teacher", teacher)
        if not callable(similarity_fct):
            raise TypeError(f"similarity_fct must be callable (e.g. sentence_transformers.util.cos_sim), "
                            f"got {type(similarity_fct).__name__}")
        self.similarity_fct = similarity_fct
        direction = V.check_direction(direction)
        if not in_batch and direction != "i2t":
            raise ValueError(f"direction must be 'i2t' with in_batch=False (each query ranks its own "
                             f"documents; there is no document-side list), got {direction!r}")
        self.direction = direction

    # ------------------------------------------------------------------ checks
    def _check_features(self, sentence_features) -> List[Dict[str, Any]]:
        if isinstance(sentence_features, Mapping) or not isinstance(sentence_features, Iterable):
            raise TypeError("sentence_features must be a list of feature dicts, one per input column")
        features = list(sentence_features)
        if len(features) < 2:
            raise ValueError(f"sentence_features must hold at least 2 columns (query, doc_1, ..., doc_D), "
                             f"got {len(features)}")
        sizes = []
        supported = getattr(self.model, "modalities", None)
        for k, f in enumerate(features):
            if not isinstance(f, Mapping):
                raise TypeError(f"sentence_features[{k}] must be a dict of tensors, got {type(f).__name__}")
            sizes.append(_batch_size(f))
            m = _modality(f)
            if isinstance(supported, (list, tuple)) and supported and "+" not in m and m != "unknown" \
                    and m not in [s for s in supported if isinstance(s, str)]:
                raise ValueError(f"sentence_features[{k}] holds {m!r} inputs but the model supports "
                                 f"{list(supported)} (a text-only model cannot embed images: use a CLIP "
                                 f"model for image columns)")
        if len(set(sizes)) != 1:
            raise ValueError(f"sentence_features: every column needs the same batch size, got {sizes}")
        return features

    def _check_labels(self, labels, B: int, D: int) -> Optional[Tensor]:
        if labels is None:
            return None
        if not isinstance(labels, Tensor):
            raise TypeError(f"labels must be a torch.Tensor of graded scores, got {type(labels).__name__}")
        if labels.dtype == torch.bool or labels.dtype.is_complex:
            raise TypeError(f"labels must hold real scores (float or integer), got {labels.dtype}")
        if labels.dim() == 1:
            if D != 1:
                raise ValueError(
                    f"labels has shape {tuple(labels.shape)}: one score per (query, doc) pair, which needs "
                    f"exactly one document column, but the batch has D = {D} document columns: pass "
                    f"labels of shape (B, D) = ({B}, {D})")
            labels = labels.unsqueeze(1)
        if labels.dim() != 2 or tuple(labels.shape) != (B, D):
            raise ValueError(f"labels must have shape (B, D) = ({B}, {D}) (one graded score per document "
                             f"column; (B,) when D == 1), got {tuple(labels.shape)}")
        labels = labels.detach()
        labels = labels.double() if labels.dtype == torch.float64 else labels.float()
        if V.check_finite_enabled(labels.device):
            lo, hi = V.value_range(labels)
            if not (abs(lo) < float("inf") and abs(hi) < float("inf")):
                raise ValueError("labels contains NaN or infinite values")
            low, high = self.label_bounds
            if (low is not None and lo < low) or (high is not None and hi > high):
                rng = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
                raise ValueError(f"labels must lie in {rng} for {type(self).__name__}, got values in "
                                 f"[{lo:g}, {hi:g}]")
        return labels

    def _prepare(self, sentence_features, labels) -> Tuple[List[Dict[str, Any]], _Batch]:
        """Every check that needs no embedding, and the teacher's relevance."""
        features = self._check_features(sentence_features)
        B, D = _batch_size(features[0]), len(features) - 1
        labels = self._check_labels(labels, B, D)
        if labels is None and self.teacher is None and not self.binary_ok:
            raise ValueError(
                f"{type(self).__name__} needs graded relevance: labels is None (the dataset has no "
                f"'label'/'score'/'scores' column) and no teacher= was given. Add a (B, D) score column, "
                f"or pass teacher=fastrank.relevance.CaptionEncoder()")
        teacher = None
        if self.teacher is not None and (self.in_batch or labels is None):
            teacher = self._teacher_relevance(features, B, D)
        return features, _Batch(B, D, labels, teacher)

    def _teacher_relevance(self, features, B: int, D: int) -> Tensor:
        modalities = [_modality(f) for f in features]
        tok = _tokenizer_of(self.model)
        if tok is None or not callable(getattr(tok, "batch_decode", None)):
            raise ValueError("teacher: the model has no tokenizer to recover the batch's texts")

        def text(k: int) -> List[str]:
            return tok.batch_decode(features[k]["input_ids"], skip_special_tokens=True)

        def represented(k: int) -> List[str]:
            """Texts standing for column k: its own, or its pair's (RSC) for an image column."""
            if modalities[k] == "text":
                return text(k)
            partner = 1 if k == 0 else 0 if k == 1 else None
            if partner is None or modalities[partner] != "text":
                raise ValueError(
                    f"teacher: column {k} holds {modalities[k]!r} inputs and has no paired text to stand "
                    f"for it (an image query is represented by its doc_1 caption, an image doc_1 by its "
                    f"query); the teacher needs text (modalities of the columns: {modalities})")
            return text(partner)

        from ..relevance import teacher_relevance
        cols = [represented(k) for k in range(D + 1)]
        return teacher_relevance(self.teacher, cols[0], [t for c in cols[1:] for t in c])   # (B, D * B)

    # ------------------------------------------------------------------ relevance
    def _relevance(self, batch: _Batch, dtype, device):
        """(B, D * B) with in_batch, else (B, D); see the module docstring. In-batch, for a loss
        that ``takes_topk``: a TopKRelevance (each query's D documents, and with a teacher its
        ``teacher_topk`` best others)."""
        B, D = batch.B, batch.D
        if batch.labels is not None:
            own = batch.labels
        elif batch.teacher is not None:
            own = batch.teacher.view(B, D, B).diagonal(dim1=0, dim2=2).T.clone()   # (B, D): [b, c] -> [b, c*B+b]
            own[:, 0] = 1.0
        else:
            own = torch.zeros(B, D)
            own[:, 0] = 1.0
        own = own.to(device=device, dtype=dtype)
        if not self.in_batch:
            return own
        cols = _own_columns(B, D, device)
        if batch.teacher is None and self.takes_topk:
            return TopKRelevance(cols, own, D * B)
        if self.takes_topk and self.teacher_topk is not None:
            return _teacher_topk(batch.teacher, own, self.teacher_topk)
        if batch.teacher is not None:
            rel = batch.teacher.to(device=device, dtype=dtype).clone()
        else:
            rel = torch.zeros(B, D * B, dtype=dtype, device=device)
        return rel.scatter_(1, cols, own)

    def _similarity(self, queries: Tensor, docs: List[Tensor]) -> Tensor:
        sim = self.similarity_fct(queries, torch.cat(docs, dim=0))      # (B, D * B)
        if self.in_batch:
            return sim
        return sim.gather(1, _own_columns(queries.shape[0], len(docs), sim.device))   # [b, c] = sim[b, c*B+b]

    # ------------------------------------------------------------------ the loss
    def _rank(self, sim: Tensor, relevance: Tensor) -> Tensor:
        raise NotImplementedError

    def _loss(self, queries: Tensor, docs: List[Tensor], batch: _Batch) -> Tensor:
        sim = self._similarity(queries, docs)
        return self._rank(sim, self._relevance(batch, sim.dtype, sim.device))

    def _embed(self, features) -> List[Tensor]:
        return [self.model(f)["sentence_embedding"] for f in features]

    def forward(self, sentence_features: Iterable[Dict[str, Tensor]], labels: Optional[Tensor] = None) -> Tensor:
        features, batch = self._prepare(sentence_features, labels)
        reps = self._embed(features)
        return self._loss(reps[0], reps[1:], batch)

    def compute_loss_from_embeddings(self, embeddings: Sequence[Tensor], labels: Optional[Tensor] = None) -> Tensor:
        """The loss of precomputed embeddings: ``embeddings[0]`` (B, dim) queries,
        ``embeddings[1:]`` D tensors (B, dim) of documents; labels as in ``forward``.
        The teacher needs the batch's texts, so it takes part only through ``forward``."""
        embeddings = list(embeddings)
        if len(embeddings) < 2:
            raise ValueError(f"embeddings must hold at least 2 tensors (queries, doc_1, ...), got {len(embeddings)}")
        for k, e in enumerate(embeddings):
            V.check_tensor(e, f"embeddings[{k}]", 2, finite=False)
        B = embeddings[0].shape[0]
        if any(e.shape[0] != B for e in embeddings):
            raise ValueError(f"embeddings: every tensor needs B = {B} rows, got {[e.shape[0] for e in embeddings]}")
        lab = self._check_labels(labels, B, len(embeddings) - 1)
        if lab is None and not self.binary_ok:
            raise ValueError(f"{type(self).__name__} needs graded relevance: labels is None")
        return self._loss(embeddings[0], embeddings[1:], _Batch(B, len(embeddings) - 1, lab, None))

    def get_config_dict(self) -> Dict[str, Any]:
        return {"in_batch": self.in_batch, "direction": self.direction,
                "teacher": None if self.teacher is None else type(self.teacher).__name__,
                "similarity_fct": getattr(self.similarity_fct, "__name__", type(self.similarity_fct).__name__)}


# ------------------------------------------------------------------------- the losses
class SmoothNDCGLoss(_RankingLoss):
    """Smooth-NDCG (1 - smoothed NDCG per query; docs/spec.md §2.1) on graded relevance.

    ``SmoothNDCGLoss(model, tau=1/300, teacher_topk=16, *, in_batch=True, teacher=None,
    similarity_fct=cos_sim, direction="i2t")``. Labels: (B, D) graded scores >= 0 (gains
    2^r - 1; e.g. in [0, 1]), or (B,) with one document column, or None with ``teacher=``.
    The value is ``fastrank.smooth_ndcg_loss(sim, relevance, tau, direction)`` with sim and
    relevance as in the module docstring (mean over the queries); in-batch the relevance is
    a TopKRelevance, so a query costs O(D * B * D) without a teacher, not O((D * B)^2).

    ``teacher_topk`` (with ``teacher=``, in-batch): besides its own D documents, each query
    keeps the teacher's relevance of the ``teacher_topk`` other documents it ranks highest,
    every other document 0, so a query costs O(D * B * (D + teacher_topk)): a teacher costs
    about what labels do. ``None`` keeps the teacher's whole (B, D * B) matrix (every pair of a
    query's list: O((D * B)^2) a query). The value is that of the whole matrix wherever the
    teacher's top ``teacher_topk`` holds every nonzero relevance of a query's other documents.

    ``tau`` defaults to 1/300 (about 0.0033), not the paper's 0.01 that the functional loss
    keeps: the ``quality`` benchmark case's search (fine-tuning MiniLM on the Lee documents'
    graded lists, chosen on each split's train half) picked it over 0.01 and 0.03 on 4 of 5
    splits (docs/sentence-transformers.md). Summed with CosineSimilarityLoss it picked 0.01."""

    takes_topk = accepts_topk(smooth_ndcg_loss)

    def __init__(self, model, tau: float = 1 / 300, teacher_topk: Optional[int] = 16, **kwargs):
        super().__init__(model, **kwargs)
        self.tau = V.check_positive(tau, "tau")
        self.teacher_topk = None if teacher_topk is None else V.check_int(teacher_topk, "teacher_topk")

    def _rank(self, sim, relevance):
        return smooth_ndcg_loss(sim, relevance, tau=self.tau, direction=self.direction)

    def get_config_dict(self):
        return {"tau": self.tau, "teacher_topk": self.teacher_topk, **super().get_config_dict()}


class SmoothAPLoss(_RankingLoss):
    """Smooth-AP (1 - smoothed average precision per query; docs/spec.md §2.8).

    ``SmoothAPLoss(model, tau=0.01, positive_threshold=0.0, *, in_batch=True, teacher=None,
    ...)``. Binary relevance: a document is a positive of the query when its relevance is
    above ``positive_threshold``. Without labels (an MNRL dataset: query, positive, hard
    negatives...) doc_1 is the positive and every other document a negative."""

    binary_ok = True
    label_bounds = (None, None)

    def __init__(self, model, tau: float = 0.01, positive_threshold: float = 0.0, **kwargs):
        super().__init__(model, **kwargs)
        self.tau = V.check_positive(tau, "tau")
        self.positive_threshold = V.check_real(positive_threshold, "positive_threshold")

    def _rank(self, sim, relevance):
        return smooth_ap_loss(sim, relevance > self.positive_threshold, tau=self.tau, direction=self.direction)

    def get_config_dict(self):
        return {"tau": self.tau, "positive_threshold": self.positive_threshold, **super().get_config_dict()}


class KendallSWLoss(_RankingLoss):
    """Kendall ranking loss with sliding windows and hard samples, SW-HS (docs/spec.md §2.3).

    ``KendallSWLoss(model, alpha=0.1, beta=0.05, label_range=(0.0, 1.0), *, in_batch=True,
    teacher=None, ...)``. Labels in ``label_range``; per query and window the hardest
    (positive, negative) pair is pushed apart."""

    def __init__(self, model, alpha: float = 0.1, beta: float = 0.05, label_range=(0.0, 1.0), **kwargs):
        super().__init__(model, **kwargs)
        self.alpha = V.check_nonnegative(alpha, "alpha")
        self.beta = V.check_positive(beta, "beta")
        self.label_range = V.check_interval(label_range, "label_range")
        self.label_bounds = self.label_range

    def _rank(self, sim, relevance):
        return kendall_sw_loss(sim, relevance, alpha=self.alpha, beta=self.beta, label_range=self.label_range,
                               direction=self.direction)

    def get_config_dict(self):
        return {"alpha": self.alpha, "beta": self.beta, "label_range": self.label_range, **super().get_config_dict()}


#: the listwise terms of :class:`InBatchListwiseLoss`, by name: the table's rows marked
#: "sentence_transformers", each with the class of this module named as its nn.Module form
LISTWISE_LOSSES = {name: globals()[row.module.__name__] for name, row in compat_losses("sentence_transformers").items()}


class InBatchListwiseLoss(_RankingLoss):
    """In-batch negatives (InfoNCE, as sentence-transformers' MultipleNegativesRankingLoss)
    plus a weighted listwise term on the same similarity matrix.

    ``InBatchListwiseLoss(model, listwise="smooth_ndcg", listwise_weight=1.0, scale=20.0,
    *, in_batch=True, teacher=None, similarity_fct=cos_sim, direction="i2t", **listwise_kwargs)``

    loss = CE(scale * sim(q_b, all D * B docs), target_b) + listwise_weight * listwise,

    target_b = the query's own document with the highest label (the first on ties; doc_1
    without labels), so with ``listwise_weight=0`` and no labels this is exactly
    MultipleNegativesRankingLoss (query, positive, negatives...). ``in_batch`` only shapes
    the listwise term; the InfoNCE term always uses the whole batch. ``listwise``:
    ``"smooth_ndcg"`` (``tau=``), ``"smooth_ap"`` (``tau=``, ``positive_threshold=``) or
    ``"kendall_sw"`` (``alpha=``, ``beta=``, ``label_range=``).

    ``from_embeddings=True`` computes both terms together from the embeddings, a block of
    queries at a time (:func:`fastrank.contrastive_smooth_ndcg_loss_from_embeddings` on the
    normalised embeddings): the (B, D * B) similarity is never made, nor its gradient. The same
    value and gradients; it needs ``listwise="smooth_ndcg"``, the default ``in_batch``,
    ``similarity_fct`` (cos_sim) and ``direction``, and with ``teacher=`` a ``teacher_topk``."""

    def __init__(self, model, listwise: str = "smooth_ndcg", listwise_weight: float = 1.0, scale: float = 20.0,
                 *, in_batch: bool = True, teacher=None, similarity_fct=cos_sim, direction: str = "i2t",
                 from_embeddings: bool = False, **listwise_kwargs):
        super().__init__(model, in_batch=in_batch, teacher=teacher, similarity_fct=similarity_fct,
                         direction=direction)
        self.listwise = V.check_choice(listwise, "listwise", tuple(LISTWISE_LOSSES))
        self.listwise_weight = V.check_nonnegative(listwise_weight, "listwise_weight")
        self.scale = V.check_positive(scale, "scale")
        term = LISTWISE_LOSSES[self.listwise]
        try:
            # the listwise term shares this loss's model and settings; it is not a submodule
            object.__setattr__(self, "term", term(model, in_batch=in_batch, teacher=teacher,
                                                  similarity_fct=similarity_fct, direction=direction,
                                                  **listwise_kwargs))
        except TypeError as e:
            raise TypeError(f"listwise_kwargs: {e}") from None
        self.binary_ok = self.term.binary_ok or self.listwise_weight == 0
        self.label_bounds = self.term.label_bounds
        if not isinstance(from_embeddings, bool):
            raise TypeError(f"from_embeddings must be True or False, got {from_embeddings!r}")
        if from_embeddings:
            why = ("listwise='smooth_ndcg'" if self.listwise != "smooth_ndcg" else
                   "in_batch=True" if not in_batch else
                   "similarity_fct=cos_sim" if similarity_fct is not cos_sim else
                   "direction='i2t'" if self.direction != "i2t" else
                   "teacher_topk (an int) with teacher=" if teacher is not None and self.term.teacher_topk is None
                   else None)
            if why is not None:
                raise ValueError(f"from_embeddings=True computes InfoNCE and smooth-NDCG together on the cosine "
                                 f"similarities of the whole batch, block by block: it needs {why}")
        self.from_embeddings = from_embeddings

    def _loss(self, queries, docs, batch: _Batch):
        B = batch.B
        best = (torch.zeros(B, dtype=torch.long, device=queries.device) if batch.labels is None
                else batch.labels.to(queries.device).argmax(dim=1))
        target = best * B + torch.arange(B, device=queries.device)
        if self.from_embeddings and self.listwise_weight != 0:
            q, d = F.normalize(queries, p=2, dim=1), F.normalize(torch.cat(docs, dim=0), p=2, dim=1)
            return contrastive_smooth_ndcg_loss_from_embeddings(
                q, d, self.term._relevance(batch, q.dtype, q.device), self.scale, positives=target,
                weight=self.listwise_weight, tau=self.term.tau, direction="i2t")
        full = self.similarity_fct(queries, torch.cat(docs, dim=0))            # (B, D * B)
        loss = F.cross_entropy(full * self.scale, target)
        if self.listwise_weight == 0:
            return loss
        sim = full if self.in_batch else full.gather(1, _own_columns(B, len(docs), full.device))
        relevance = self.term._relevance(batch, sim.dtype, sim.device)
        return loss + self.listwise_weight * self.term._rank(sim, relevance)

    def get_config_dict(self):
        return {"listwise": self.listwise, "listwise_weight": self.listwise_weight, "scale": self.scale,
                "from_embeddings": self.from_embeddings, **self.term.get_config_dict()}


# ------------------------------------------------------------------ GradCache variants
def _cached(base):
    """``Cached<base>``: the same loss, with the encoder run by sentence-transformers'
    ``CachedLossMixin`` (GradCache: embed without graph, loss and its gradient wrt. the
    embeddings, re-embed mini-batch by mini-batch with the cached gradients)."""
    name = "Cached" + base.__name__

    if CachedLossMixin is None:
        def __init__(self, *args, **kwargs):
            raise ImportError(f"{name} needs sentence-transformers >= 5.7 (CachedLossMixin, its GradCache "
                              f"engine), found {_st.__version__}: pip install -U 'sentence-transformers>=5.7'")
        return type(name, (base,), {"__init__": __init__, "__doc__": "Needs sentence-transformers >= 5.7."})

    class Cached(CachedLossMixin, base):
        def __init__(self, model, *args, mini_batch_size: int = 32, mini_batch_num_tokens: Optional[int] = None,
                     show_progress_bar: bool = False, **kwargs):
            base.__init__(self, model, *args, **kwargs)
            try:
                from sentence_transformers.base.losses import has_static_embedding_input
                static = has_static_embedding_input(model)
            except Exception:  # noqa: BLE001 - older layouts / non-standard models: let the trainer tell
                static = False
            if static:
                raise ValueError(f"model: {name} cannot split a StaticEmbedding model's inputs into "
                                 f"mini-batches; use {base.__name__}")
            self.mini_batch_size = V.check_int(mini_batch_size, "mini_batch_size")
            if mini_batch_num_tokens is not None:
                mini_batch_num_tokens = V.check_int(mini_batch_num_tokens, "mini_batch_num_tokens")
            self.mini_batch_num_tokens = mini_batch_num_tokens
            self.show_progress_bar = bool(show_progress_bar)

        def calculate_loss(self, reps, labels=None, *, with_backward: bool = False):
            # ``labels`` is the _Batch that forward prepared (checked labels, teacher relevance)
            loss = self._loss(torch.cat(reps[0]), [torch.cat(r) for r in reps[1:]], labels)
            if with_backward:
                loss.backward()
                loss = loss.detach()
            return loss

        def forward(self, sentence_features, labels=None):
            features, batch = self._prepare(sentence_features, labels)
            return self.forward_cached(features, batch)

        def get_config_dict(self):
            return {**base.get_config_dict(self), "mini_batch_size": self.mini_batch_size,
                    "mini_batch_num_tokens": self.mini_batch_num_tokens}

    Cached.__name__ = Cached.__qualname__ = name
    Cached.__doc__ = (f"{base.__name__} with gradient caching (GradCache, Gao et al., through "
                      f"sentence-transformers' CachedLossMixin). Same arguments, plus keyword-only "
                      f"``mini_batch_size=32`` (sequences per encoder pass), ``mini_batch_num_tokens=None`` "
                      f"and ``show_progress_bar=False``. Value and gradient equal {base.__name__}'s "
                      f"(dropout included: each mini-batch's random state is replayed).")
    return Cached


CachedSmoothNDCGLoss = _cached(SmoothNDCGLoss)
CachedSmoothAPLoss = _cached(SmoothAPLoss)
CachedKendallSWLoss = _cached(KendallSWLoss)
CachedInBatchListwiseLoss = _cached(InBatchListwiseLoss)
