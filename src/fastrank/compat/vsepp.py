"""The VSE++ / VSE-infinity ``ContrastiveLoss`` on fastrank's triplet loss.

VSE++ (Faghri et al., https://github.com/fartashf/vsepp, ``model.py``) and the trainers
built on it (VSE-infinity's ``lib/loss.py``, SCAN, ...) call
``ContrastiveLoss(margin, max_violation)(im, s)`` on a batch of N image and N caption
embeddings (pair i = image i, caption i). With scores S = im @ s.T it returns

    sum_i sum_{j != i} [margin + S[i, j] - S[i, i]]+   (caption retrieval, rows)
  + sum_j sum_{i != j} [margin + S[i, j] - S[j, j]]+   (image retrieval, columns)

and with ``max_violation=True`` (the VSE++ objective) only the largest hinge of each row
and column. That is ``fastrank.triplet_loss(S, margin, mining="all" | "hardest",
reduction="sum")`` (docs/spec.md §2.4, the diagonal as positives, both directions summed).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _validation as V
from ..losses.triplet import triplet_loss

__all__ = ["ContrastiveLoss", "order_sim"]


def order_sim(im: Tensor, s: Tensor) -> Tensor:
    """VSE++'s order-embedding score (``measure="order"``): -|| max(0, s_j - im_i) ||_2.
    Builds an (N, M, D) tensor, as the original does."""
    diff = (s.unsqueeze(0) - im.unsqueeze(1)).clamp(min=0)        # [i, j, :] = s_j - im_i
    return -diff.pow(2).sum(dim=2).sqrt()


class ContrastiveLoss(torch.nn.Module):
    """Drop-in for VSE++'s ``ContrastiveLoss(margin=0, measure=False, max_violation=False)``.

    ``forward(im, s)``: im and s are (N, D) embeddings of N image-caption pairs; returns
    the hinge loss summed over the batch and both directions (see the module docstring),
    equal to the original up to float rounding.

    Args:
        margin: the hinge margin (>= 0; the original accepts negative margins, fastrank
            does not).
        measure: ``False`` / ``"cosine"`` (scores ``im @ s.T``; VSE++ calls it cosine
            because its embeddings are L2-normalised) or ``"order"`` (order embeddings).
        max_violation: True = hardest negative of each query (VSE++), False = every
            negative (VSE0). ``max_violation_on()`` / ``max_violation_off()`` switch it,
            as VSE-infinity's warm-up does.

    VSE-infinity's ``ContrastiveLoss(opt, margin, max_violation)`` takes a leading
    ``opt``: drop it. Half-precision inputs are computed in float32 (docs/spec.md §1).
    """

    def __init__(self, margin: float = 0, measure=False, max_violation: bool = False):
        super().__init__()
        self.margin = V.check_nonnegative(margin, "margin")
        if measure not in (False, None, "cosine", "order"):
            raise ValueError(f"measure must be False, 'cosine' or 'order', got {measure!r}")
        self.measure = measure
        if not isinstance(max_violation, bool):
            raise TypeError(f"max_violation must be a bool, got {type(max_violation).__name__}")
        self.max_violation = max_violation

    def max_violation_on(self) -> None:
        self.max_violation = True

    def max_violation_off(self) -> None:
        self.max_violation = False

    def scores(self, im: Tensor, s: Tensor) -> Tensor:
        """The (N, N) image-caption score matrix the loss ranks."""
        V.check_tensor(im, "im", 2, finite=False)
        V.check_tensor(s, "s", 2, finite=False)
        if im.device != s.device:
            raise ValueError(f"s is on {s.device} but im is on {im.device}")
        if im.shape != s.shape:
            raise ValueError(f"im and s must be (N, D) embeddings of N image-caption pairs with the same "
                             f"shape, got im {tuple(im.shape)} and s {tuple(s.shape)}")
        V.check_finite(im, "im")   # values last, named as the caller's (docs/spec.md §1: CPU by default)
        V.check_finite(s, "s")
        if self.measure == "order":
            return order_sim(im, s)
        return im @ s.t()

    def forward(self, im: Tensor, s: Tensor) -> Tensor:
        mining = "hardest" if self.max_violation else "all"
        return triplet_loss(self.scores(im, s), margin=self.margin, mining=mining, reduction="sum")

    def extra_repr(self) -> str:
        return f"margin={self.margin}, measure={self.measure!r}, max_violation={self.max_violation}"
