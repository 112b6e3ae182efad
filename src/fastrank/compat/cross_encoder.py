"""Graded-relevance ranking losses for sentence-transformers' cross-encoders (rerankers).

Each class here has the contract of sentence-transformers' listwise cross-encoder losses
(``LambdaLoss``, ``ListNetLoss``, ``ListMLELoss``): it is built with the ``CrossEncoder``,
``loss = CrossEncoderSmoothNDCGLoss(model)``, and ``CrossEncoderTrainer`` calls
``loss(inputs, labels)`` with

- ``inputs = [queries, docs_list]``: B query strings, and for query b its list of
  documents ``docs_list[b]`` (lists may have different lengths);
- ``labels``: a list of B 1-d tensors, ``labels[b][j]`` = graded relevance of document j
  to query b (the dataset's list-valued ``labels`` column; the trainer's collator makes
  one tensor per row).

The model scores every (query, document) pair (``model.preprocess`` then
``model(tokens)["scores"]``, in chunks of ``mini_batch_size`` pairs, as
sentence-transformers does), ``activation_fn`` is applied to the scores, and the
scores are laid out as a (B, L) matrix, L = the longest list. Each query's list is then
ranked by one of fastrank's functional losses, with direction "i2t" (each row is a list):

- :class:`CrossEncoderSmoothNDCGLoss` -> :func:`fastrank.smooth_ndcg_loss` with
  ``mask`` = the valid entries (docs/spec.md §2.1a: a padded entry is in no list and
  gets gradient 0; the mean is over the lists with at least one valid document);
- :class:`CrossEncoderKendallSWLoss` -> :func:`fastrank.kendall_sw_loss` (docs/spec.md
  §2.3), which has no mask: a padded entry gets relevance ``lo`` (below every window's
  lower edge, so never a positive) and the score ``min(valid scores) - 1`` (a constant,
  below every real score, so never the hardest negative of a window that has a real one,
  and a window whose only negatives are padding has hinge [pad - s_j]+ = 0). The value
  and gradient are those of each list ranked alone (the mean over the B lists).

No score is cast: a float64 model gives float64 scores and a float64 loss (half
precision is computed in float32 by the functional losses, docs/spec.md §1).

Requirements: sentence-transformers with ``CrossEncoder.preprocess`` and the "scores"
output (tested with 6.2); the model must have one output label (``num_labels == 1``).
This module is imported only on request (it loads sentence-transformers), and re-exported
by :mod:`fastrank.compat.sentence_transformers`.
"""
from __future__ import annotations

from collections.abc import Sequence as _Sequence
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from .. import _validation as V
from ..ops.kendall_sw import _check_windows, kendall_sw_loss
from ..ops.smooth_ndcg import smooth_ndcg_loss

__all__ = ["CrossEncoderSmoothNDCGLoss", "CrossEncoderKendallSWLoss"]


def _fullname(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


class _CrossEncoderListLoss(nn.Module):
    """The shared part: checks, scoring of the pairs, the padded (B, L) layout."""

    #: the range the labels must lie in: (lo, hi), None = unbounded side
    label_bounds: Tuple[Optional[float], Optional[float]] = (0.0, None)

    def __init__(self, model, activation_fn: Optional[nn.Module] = None, mini_batch_size: Optional[int] = None):
        super().__init__()
        if not isinstance(model, nn.Module) or not callable(getattr(model, "preprocess", None)):
            raise TypeError(f"model must be a sentence_transformers CrossEncoder (with preprocess), got "
                            f"{type(model).__name__}")
        num_labels = getattr(model, "num_labels", 1)
        if num_labels != 1:
            raise ValueError(f"model must have 1 output label (one score per pair) for {type(self).__name__}, "
                             f"got a model with {num_labels} output labels")
        self.model = model
        if activation_fn is not None and not callable(activation_fn):
            raise TypeError(f"activation_fn must be a callable (e.g. torch.nn.Identity()), got "
                            f"{type(activation_fn).__name__}")
        self.activation_fn = activation_fn if activation_fn is not None else nn.Identity()
        if mini_batch_size is not None:
            if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int):
                raise TypeError(f"mini_batch_size must be an int or None, got {type(mini_batch_size).__name__}")
        self.mini_batch_size = mini_batch_size

    # ------------------------------------------------------------------ checks
    def _check(self, inputs, labels) -> Tuple[List[str], List[List[str]], List[Tensor]]:
        if isinstance(labels, Tensor) or isinstance(labels, (str, bytes)) or not isinstance(labels, _Sequence):
            raise TypeError(f"labels must be a list of 1-d tensors, one per query (a list-valued label column), "
                            f"got {type(labels).__name__}")
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, _Sequence) or len(inputs) != 2:
            raise ValueError(f"inputs must be [queries, docs_list] (two columns), got "
                             f"{len(inputs) if isinstance(inputs, _Sequence) else type(inputs).__name__} inputs")
        queries, docs_list = list(inputs[0]), list(inputs[1])
        if len(queries) != len(docs_list) or not queries:
            raise ValueError(f"inputs: {len(queries)} queries but {len(docs_list)} document lists; need one "
                             f"non-empty list per query")
        if len(labels) != len(queries):
            raise ValueError(f"labels must hold one tensor per query ({len(queries)}), got {len(labels)}")
        lo, hi = self.label_bounds
        out = []
        for b, (docs, lab) in enumerate(zip(docs_list, labels)):
            if isinstance(docs, (str, bytes)) or not isinstance(docs, _Sequence) or len(docs) == 0:
                raise ValueError(f"inputs[1][{b}] must be a non-empty list of documents, got {docs!r:.80}")
            lab = torch.as_tensor(lab) if not isinstance(lab, Tensor) else lab
            if lab.dtype == torch.bool or lab.dtype.is_complex:
                raise TypeError(f"labels[{b}] must hold real scores (float or integer), got {lab.dtype}")
            if lab.dim() != 1 or lab.shape[0] != len(docs):
                raise ValueError(f"labels[{b}] must have shape ({len(docs)},) (one score per document of query "
                                 f"{b}), got {tuple(lab.shape)}")
            lab = lab.detach().double()
            if not bool(torch.isfinite(lab).all()):
                raise ValueError(f"labels[{b}] contains NaN or infinite values")
            if (lo is not None and float(lab.min()) < lo) or (hi is not None and float(lab.max()) > hi):
                rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
                raise ValueError(f"labels must lie in {rng} for {type(self).__name__}, got labels[{b}] in "
                                 f"[{float(lab.min()):g}, {float(lab.max()):g}]")
            out.append(lab)
        return queries, docs_list, out

    # ------------------------------------------------------------------ scores
    def _score(self, queries, docs_list, prompt=None, task=None) -> Tensor:
        """(P,) activated scores of every (query, doc) pair, queries in order."""
        from sentence_transformers.util import batch_to_device
        pairs = [(q, d) for q, docs in zip(queries, docs_list) for d in docs]
        size = self.mini_batch_size or len(queries)
        if size <= 0:
            size = len(pairs)
        kwargs = {k: v for k, v in (("prompt", prompt), ("task", task)) if v is not None}
        chunks = []
        for i in range(0, len(pairs), size):
            tokens = batch_to_device(self.model.preprocess(pairs[i:i + size], **kwargs), self.model.device)
            chunks.append(self.model(tokens)["scores"].reshape(-1))
        return self.activation_fn(torch.cat(chunks))

    @staticmethod
    def _layout(scores: Tensor, labels: List[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """(B, L) scores (0 where padded), relevance (0 where padded) and mask (True = a document)."""
        lengths = torch.tensor([len(x) for x in labels], device=scores.device)
        B, L = len(labels), int(lengths.max())
        mask = torch.arange(L, device=scores.device)[None, :] < lengths[:, None]
        sim = scores.new_zeros((B, L)).masked_scatter(mask, scores)
        acc = torch.float64 if scores.dtype == torch.float64 else torch.float32
        rel = torch.zeros((B, L), dtype=acc, device=scores.device)
        rel[mask] = torch.cat(labels).to(device=scores.device, dtype=acc)
        return sim, rel, mask

    def _rank(self, sim: Tensor, relevance: Tensor, mask: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, inputs, labels, prompt: Optional[str] = None, task: Optional[str] = None) -> Tensor:
        """The mean over the B queries' lists of the ranking loss of their scores."""
        queries, docs_list, labels = self._check(inputs, labels)
        scores = self._score(queries, docs_list, prompt, task)
        return self._rank(*self._layout(scores, labels))

    def get_config_dict(self) -> Dict[str, Any]:
        return {"activation_fn": _fullname(self.activation_fn), "mini_batch_size": self.mini_batch_size}


class CrossEncoderSmoothNDCGLoss(_CrossEncoderListLoss):
    """Smooth-NDCG of each query's list of cross-encoder scores (docs/spec.md §2.1, 2.1a).

    ``CrossEncoderSmoothNDCGLoss(model, tau=1.0, activation_fn=nn.Identity(),
    mini_batch_size=None)``. Labels >= 0 (gains 2^r - 1). The value is
    ``fastrank.smooth_ndcg_loss(S, R, tau, direction="i2t", mask=M)``, S the (B, L) padded
    activated scores, R the labels, M the valid entries. ``tau`` is on the scale of the
    scores: the default 1.0 suits raw logits (it is allRank's approxNDCG with alpha = 1);
    with ``activation_fn=nn.Sigmoid()`` (scores in (0, 1)) use a small tau such as 0.05."""

    def __init__(self, model, tau: float = 1.0, activation_fn: Optional[nn.Module] = None,
                 mini_batch_size: Optional[int] = None):
        super().__init__(model, activation_fn, mini_batch_size)
        self.tau = V.check_positive(tau, "tau")

    def _rank(self, sim, relevance, mask):
        return smooth_ndcg_loss(sim, relevance, tau=self.tau, direction="i2t", mask=mask)

    def get_config_dict(self):
        return {"tau": self.tau, **super().get_config_dict()}


class CrossEncoderKendallSWLoss(_CrossEncoderListLoss):
    """Kendall SW-HS of each query's list of cross-encoder scores (docs/spec.md §2.3).

    ``CrossEncoderKendallSWLoss(model, alpha=0.1, beta=0.05, label_range=(0.0, 1.0),
    activation_fn=nn.Identity(), mini_batch_size=None)``. Labels in ``label_range``. Per
    query and window the lowest-scored positive and the highest-scored negative are
    pushed apart (a hinge, no margin: the loss is 0 once every window is ordered). The
    value is the mean over the queries of ``fastrank.kendall_sw_loss`` on each list alone
    (padding as in the module docstring)."""

    def __init__(self, model, alpha: float = 0.1, beta: float = 0.05, label_range=(0.0, 1.0),
                 activation_fn: Optional[nn.Module] = None, mini_batch_size: Optional[int] = None):
        super().__init__(model, activation_fn, mini_batch_size)
        self.alpha = V.check_nonnegative(alpha, "alpha")
        self.beta = V.check_positive(beta, "beta")
        self.label_range = V.check_interval(label_range, "label_range")
        _check_windows(self.alpha, self.beta, self.label_range)
        self.label_bounds = self.label_range

    def _rank(self, sim, relevance, mask):
        if not bool(mask.all()):
            lo = self.label_range[0]
            floor = sim[mask].min().detach() - 1.0
            sim = torch.where(mask, sim, floor)
            relevance = torch.where(mask, relevance, torch.full_like(relevance, lo))
        return kendall_sw_loss(sim, relevance, alpha=self.alpha, beta=self.beta, label_range=self.label_range,
                               direction="i2t")

    def get_config_dict(self):
        return {"alpha": self.alpha, "beta": self.beta, "label_range": self.label_range, **super().get_config_dict()}
