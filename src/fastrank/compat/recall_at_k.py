"""The Recall@k surrogate authors' ``RecallatK`` on fastrank's :func:`~fastrank.recall_at_k_loss`.

The authors' code (Patel, Tolias, Matas, CVPR 2022; https://github.com/yash0307/RecallatK_surrogate,
``src/losses.py``, MIT licence) computes the loss of one query at a time: their training
loop calls ``criterion(embeddings, q)`` for q = 0 .. B-1 and sums. The batch holds
``num_id`` classes of B / num_id consecutive items, and the scores are plain dot products
(their network L2-normalises its output). For query q, with s the dot products of
embedding q with every embedding of the batch and P the other items of q's class:

- the rank of a positive j counts every other item of the batch, **the query itself
  included** (s_q = |e_q|^2 = 1, usually the top score):
  r_j = 1 + sum_{k in batch, k != j} sigma((s_k - s_j) / anneal);
- **the query is not one of its positives**: R@k = min(k, sum_{j in P} sigma((k - r_j) / tau_k))
  / min(k, |P|), with k capped at the batch size;
- the query's loss is (1 - mean over k of R@k) / B, so the sum over the batch is the mean.

That is docs/spec.md §2.9 with each query's list = the whole batch (the query included) and
positives = its class minus itself: ``recall_at_k_loss`` on sim = emb @ emb.T, the i2t
direction, summed and divided by B.

Their sigmoid is ``1 / (1 + exp(clamp(-x / t, -50, 50)))``, a guard of the hand-written
formula against overflow; fastrank's sigmoid cannot overflow. Where the clamp is active
(|x / t| > 50) the two differ by less than 2e-22 in value (sigma(-50) = 1.9e-22), and the
clamped one has gradient 0 there where fastrank's has less than 2e-22 / t: below float64
rounding next to a rank >= 1 (tests/test_compat_rank.py checks the two at rtol 1e-12 with
most arguments past the clamp).
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from .. import _validation as V
from ..ops.recall_at_k import check_ks, check_tau_k, recall_at_k_loss
from .pml import check_labels, same_label

__all__ = ["RecallatK"]


class RecallatK(torch.nn.Module):
    """Drop-in for the authors' ``RecallatK(anneal, batch_size, num_id, feat_dims, k_vals,
    k_temperatures, mixup)`` (same arguments, same values).

    ``forward(preds)`` is their whole per-batch loop in one call: the sum over q of their
    ``criterion(preds, q)``. ``forward(preds, q)`` is their one-query call. ``labels=``
    (keyword, (B,) integer class ids in any order, classes of any size) replaces their
    fixed layout of ``num_id`` contiguous classes.

    Args:
        anneal: the rank sigmoid's temperature (> 0), fastrank's tau.
        batch_size: their batch size; each k is capped at it (default: the batch's size).
        num_id: the number of classes of their layout (needed when ``labels`` is None).
        feat_dims: unused (their code stores it only).
        k_vals: the ks (positive ints).
        k_temperatures: tau_k, one per k (or one number).
        mixup: their similarity mixup is not supported (must be False).
        impl: fastrank's ``"auto"`` / ``"native"`` / ``"reference"`` (keyword only).

    A query whose class has no other item in the batch adds 0 (their code: 0 / 0 = NaN).
    The result is float32 (float64 for float64 embeddings).
    """

    def __init__(self, anneal: float = 0.01, batch_size: Optional[int] = None, num_id: Optional[int] = None,
                 feat_dims: Optional[int] = None, k_vals: Union[int, Sequence[int]] = (1, 2, 4, 8, 16),
                 k_temperatures: Union[float, Sequence[float]] = (1, 2, 4, 8, 16), mixup=False, *,
                 impl: str = "auto"):
        super().__init__()
        self.anneal = V.check_positive(anneal, "anneal")
        self.batch_size = None if batch_size is None else V.check_int(batch_size, "batch_size")
        self.num_id = None if num_id is None else V.check_int(num_id, "num_id")
        if self.batch_size is not None and self.num_id is not None and self.batch_size % self.num_id:
            raise ValueError(f"batch_size ({batch_size}) must be a multiple of num_id ({num_id})")
        self.feat_dims = feat_dims
        self.k_vals = check_ks(k_vals)
        self.k_temperatures = check_tau_k(k_temperatures, len(self.k_vals))
        if mixup:
            raise ValueError("mixup=True (the authors' similarity mixup) is not supported")
        self.mixup = False
        self.impl = impl if impl == "auto" else V.check_impl(impl)

    def _labels(self, b: int, device) -> Tensor:
        """Their layout: num_id classes of b / num_id consecutive items."""
        if self.num_id is None:
            raise ValueError("pass labels= (one class id per embedding), or num_id for the authors' layout "
                             "of num_id contiguous classes")
        if b % self.num_id:
            raise ValueError(f"the batch has {b} embeddings, not a multiple of num_id = {self.num_id}")
        return torch.arange(b, device=device) // (b // self.num_id)

    def forward(self, preds: Tensor, q_id: Optional[int] = None, *, labels: Optional[Tensor] = None) -> Tensor:
        V.check_tensor(preds, "preds", 2)
        b = preds.shape[0]
        labels = self._labels(b, preds.device) if labels is None else check_labels(labels, b, preds.device)
        if q_id is None:
            rows = torch.arange(b, device=preds.device)
        else:
            if isinstance(q_id, bool) or not isinstance(q_id, int) or not 0 <= q_id < b:
                raise ValueError(f"q_id must be an int in [0, {b}) (the query's index), got {q_id!r}")
            rows = torch.tensor([q_id], device=preds.device)
        sim = preds[rows] @ preds.t()                       # the query against the batch, itself included
        positives = same_label(labels[rows], labels)
        positives[torch.arange(len(rows), device=preds.device), rows] = False   # but not its own positive
        cap = self.batch_size if self.batch_size is not None else b
        ks = tuple(min(cap, k) for k in self.k_vals)
        loss = recall_at_k_loss(sim, positives, ks, self.anneal, self.k_temperatures, direction="i2t",
                                reduction="sum", impl=self.impl)
        return loss / b

    def extra_repr(self) -> str:
        return (f"anneal={self.anneal}, k_vals={self.k_vals}, k_temperatures={self.k_temperatures}, "
                f"num_id={self.num_id}")
