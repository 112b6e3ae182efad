"""pytorch-metric-learning's ``SmoothAPLoss`` on fastrank's :func:`~fastrank.smooth_ap_loss`.

pytorch-metric-learning (PML, https://github.com/KevinMusgrave/pytorch-metric-learning)
calls ``SmoothAPLoss(temperature=0.01)(embeddings, labels)``: each of the B embeddings
is a query against the whole batch, scored by cosine similarity (the embeddings are
L2-normalised), its positives being the items with its label. As in the Smooth-AP
authors' code, the query is one of its own candidates and one of its own positives
(docs/spec.md §2.10): with s = cosine similarities of the query's row (s_q = 1, the top),

    R_all(j) = 1 + sum_{k in batch, k != j} sigma((s_k - s_j) / T)
    R_pos(j) = 1 + sum_{k of the label, k != j} sigma((s_k - s_j) / T)
    AP       = mean over the j of the label (the query included) of R_pos(j) / R_all(j)

and the loss is the mean of 1 - AP over the batch. That is ``smooth_ap_loss`` on
sim = normalize(emb) @ normalize(emb).T with positives = (labels_i == labels_j) (the
diagonal included), tau = T, the i2t direction, "mean" (every query has a positive:
itself). Memory O(B^2) instead of PML's O(B^3), any label order and any class sizes.

Where PML's own code computes that loss, this adapter equals it in value and gradient
(tests/test_compat_rank.py, float64). PML 2.9 does so only for batches that hold as many
items of each class as there are classes, classes contiguous (2 x 2, 4 x 4, 8 x 8, ...):
it refuses classes of different sizes, and for other batches of equal-sized classes it
takes as positive sets the blocks of U consecutive items (U = the number of distinct
labels) whatever their labels: 32 classes x 4 items, for example, gives blocks of 32
items, eight classes each. This adapter ranks by the labels in every case.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _validation as V
from ..ops.smooth_ap import smooth_ap_loss

__all__ = ["SmoothAPLoss", "same_label"]


def same_label(labels: Tensor, ref_labels: Optional[Tensor] = None) -> Tensor:
    """bool (B, R): labels[i] == ref_labels[j] (ref_labels defaults to labels)."""
    ref = labels if ref_labels is None else ref_labels
    return labels.unsqueeze(1) == ref.unsqueeze(0)


def check_labels(labels, n: int, device: torch.device, name: str = "labels") -> Tensor:
    """A 1-D integer tensor of n class labels on ``device``."""
    return V.check_id_vector(labels, n, device, name, "class labels", "label")


class SmoothAPLoss(torch.nn.Module):
    """Drop-in for pytorch-metric-learning's ``SmoothAPLoss(temperature=0.01)``.

    ``forward(embeddings, labels)``: embeddings (B, D), labels (B,) integer class ids, in
    any order and with any class sizes; returns the mean over the batch of 1 - Smooth-AP
    (see the module docstring), in float32 (float64 for float64 embeddings).

    Args:
        temperature: the sigmoid's temperature (> 0), fastrank's tau.
        impl: fastrank's ``"auto"`` / ``"native"`` / ``"reference"`` (keyword only).

    Not supported (PML options of its base class): miners (``indices_tuple``), which PML's
    SmoothAPLoss turns into per-query weights; ``ref_emb`` / ``ref_labels``, which PML's
    SmoothAPLoss refuses too; reducers, distances and regularizers other than the
    defaults.
    """

    def __init__(self, temperature: float = 0.01, *, impl: str = "auto"):
        super().__init__()
        self.temperature = V.check_positive(temperature, "temperature")
        self.impl = impl if impl == "auto" else V.check_impl(impl)

    def forward(self, embeddings: Tensor, labels: Tensor, indices_tuple=None, ref_emb=None,
                ref_labels=None) -> Tensor:
        V.check_tensor(embeddings, "embeddings", 2)
        labels = check_labels(labels, embeddings.shape[0], embeddings.device)
        if indices_tuple is not None:
            raise ValueError("indices_tuple (a miner's output) is not supported: the loss ranks the whole batch")
        if ref_emb is not None or ref_labels is not None:
            raise ValueError("ref_emb / ref_labels are not supported (PML's SmoothAPLoss refuses them too)")
        e = F.normalize(embeddings, p=2, dim=1)
        sim = e @ e.t()                                        # cosine similarity, the query included
        positives = same_label(labels)                         # the query is its own positive
        return smooth_ap_loss(sim, positives, self.temperature, direction="i2t", reduction="mean",
                              impl=self.impl)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"
