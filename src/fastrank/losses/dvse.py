"""DVSE losses (docs/spec.md §2.7; DVSE, Eq. 3-11).

DVSE encodes each image as K sub-embeddings v^1..v^K (and each caption as one embedding).

``variance_weighted_loss`` (Eq. 5-11) weights the VSE++ hardest-negative hinge of each
sub-embedding k by 1 / sigma_k^2 and adds log(sigma_k) (Eq. 9-11), where
sigma_k = Std + 1 (Eq. 6, 8) is the sample standard deviation of the softmax
probabilities p_j = softmax_j(s_k) (Eq. 5, temperature 1) over the *mixed distribution*
of Eq. 7: every candidate except the target positive t, i.e. the negatives *and* the
non-target positives ("the positive sample set C with the i-th element removed").
sigma is differentiable (the log(sigma) term exists to regularise it, Eq. 9).

``orthogonal_loss`` (Eq. 3-4) penalises the correlation of the masked sub-embeddings of
each image: [sum_{a != b} |m_a m_b <e_a, e_b>| - beta]+.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _validation as V
from .._reduce import directions, reduce
from .triplet import masked_max, to_acc
from ..ops._module import ModuleForm
from ..ops._row import Loss


def _safe_sqrt(x: Tensor) -> Tensor:
    """sqrt with 0 (not NaN) gradient at x <= 0."""
    pos = x > 0
    return torch.where(pos, torch.sqrt(torch.where(pos, x, torch.ones_like(x))), torch.zeros_like(x))


def mixed_std(p: Tensor, pos: Tensor) -> Tensor:
    """std[k, q, t] = sample std of {p[k, q, j] : j != t}: the mixed distribution of Eq. 7
    for target t (the negatives plus the positives other than t). p: (K, Q, C), pos: (Q, C).
    0 where fewer than two values remain (C <= 2).

    Computed from sums shifted by the mean of the negatives (two-pass, so stable), minus
    the target's own term: exact when the query has a single positive, O(K Q C) memory.
    """
    c = p.shape[-1]
    neg = ~pos
    n_neg = neg.sum(dim=-1)
    has_neg = (n_neg > 0).unsqueeze(-1)
    shift = torch.where(has_neg, (p * neg).sum(-1, keepdim=True) / n_neg.clamp(min=1).unsqueeze(-1),
                        p.mean(dim=-1, keepdim=True))
    d = p - shift                                      # (K, Q, C)
    n = c - 1
    if n < 2:
        return torch.zeros_like(p)
    s1_neg = (d * neg).sum(dim=-1, keepdim=True)
    s2_neg = (d * d * neg).sum(dim=-1, keepdim=True)
    s1_pos = (d * pos).sum(dim=-1, keepdim=True)
    s2_pos = (d * d * pos).sum(dim=-1, keepdim=True)
    # sums over {j != t} = negatives + (positives - t); for a non-positive t the value is unused
    s1_t = s1_neg + (s1_pos - d)
    s2_t = s2_neg + (s2_pos - d * d)
    var = (s2_t - s1_t * s1_t / n) / (n - 1)
    return _safe_sqrt(var)


def variance_weighted_per_query(s: Tensor, pos: Tensor, margin: float) -> Tensor:
    """Per-query loss of sub-similarities s (K, Q, C), positives pos (Q, C): for each
    positive t, sum_k [ [margin + max_{Neg} s_k - s_{k,t}]+ / sigma_{k,t}^2 + log sigma_{k,t} ]
    (Eq. 11), averaged over the query's positives; 0 for a query with no positive or no
    negative."""
    neg = ~pos
    p = torch.softmax(s, dim=-1)                                  # Eq. 5 (temperature 1)
    sigma = mixed_std(p, pos) + 1.0                               # Eq. 6-8: sigma_k = Std + 1
    hardest, has_neg = masked_max(s, neg.expand_as(s))            # Eq. 10: max over negatives
    hinge = torch.relu(margin + hardest.unsqueeze(-1) - s)        # (K, Q, C), used at t in P
    term = hinge / (sigma * sigma) + torch.log(sigma)             # Eq. 9 / 11
    per_t = term.sum(dim=0)                                       # sum over the K sub-embeddings
    n_pos = pos.sum(dim=-1)
    loss = torch.where(pos, per_t, torch.zeros_like(per_t)).sum(dim=-1) / n_pos.clamp(min=1).to(s.dtype)
    return torch.where(has_neg[0], loss, torch.zeros_like(loss))


def _check_margin(margin, reduction):
    """variance_weighted_loss's hyper-parameters as it uses them, or the error naming the bad one."""
    return V.check_nonnegative(margin, "margin"), V.check_reduction(reduction)


def _check_beta(beta, reduction):
    """orthogonal_loss's hyper-parameters as it uses them, or the error naming the bad one."""
    return V.check_nonnegative(beta, "beta"), V.check_reduction(reduction)


def variance_weighted_loss(sub_sim: Tensor, margin: float = 0.2, positives: Optional[Tensor] = None,
                           reduction: str = "mean") -> Tensor:
    """DVSE variance-aware weighting loss (docs/spec.md §2.7; DVSE, Eq. 5-11), both directions.

    Args:
        sub_sim: (K, N, M): sub_sim[k, i, j] = similarity of sub-embedding k of image i to
            caption j. i2t ranks the captions of each (k, i); t2i ranks, for caption j and
            each k, the images by sub_sim[k, :, j] (Eq. 11, second sum).
        margin: the hinge margin alpha (>= 0).
        positives: bool (N, M) ground-truth matches; None = the diagonal (needs N == M).
            A query with several positives averages over them; for target positive t the
            variance is taken over every other candidate (negatives and the other
            positives, Eq. 7).
        reduction: ``"mean"`` (mean over queries per direction, the two directions summed),
            ``"sum"`` (Eq. 11 as written) or ``"none"`` ((N,) i2t then (M,) t2i).

    Per query and positive t: sum_k ( [margin + max_{j in Neg} s_kj - s_kt]+ / sigma_kt^2
    + log sigma_kt ), sigma_kt = 1 + sample std_{j != t} softmax_j(s_k)_j (0 std when
    fewer than two candidates remain). A query with no positive or no negative has loss 0.
    """
    return _variance_weighted_loss(_check_margin, sub_sim, margin, positives, reduction)


def _variance_weighted_loss(check_hyper, sub_sim, margin, positives, reduction):
    """variance_weighted_loss with its hyper-parameters checked by ``check_hyper``: the loss's own,
    or, for its module form, none (the module checked them when they were set)."""
    V.check_tensor(sub_sim, "sub_sim", 3, finite=False)
    if positives is not None and isinstance(positives, Tensor) and positives.shape != sub_sim.shape[1:]:
        raise ValueError(f"positives must have shape (N, M) = {tuple(sub_sim.shape[1:])} "
                         f"(sub_sim is (K, N, M)), got {tuple(positives.shape)}")
    positives = V.check_positives(positives, sub_sim[0])
    margin, reduction = check_hyper(margin, reduction)
    V.check_finite(sub_sim, "sub_sim")
    s = to_acc(sub_sim)
    parts = []
    for d in directions("both"):
        sd = s if d == "i2t" else s.transpose(1, 2)
        pd = positives if d == "i2t" else positives.t()
        parts.append(variance_weighted_per_query(sd, pd, margin))
    return reduce(parts, reduction)


def orthogonal_loss(sub_emb: Tensor, mask: Optional[Tensor] = None, beta: float = 0.4,
                    reduction: str = "mean") -> Tensor:
    """DVSE dynamic orthogonal constraint loss (docs/spec.md §2.7; DVSE, Eq. 3-4).

    Args:
        sub_emb: (N, K, D): the K sub-embeddings of each of N images (used as given; the
            paper applies it to the sub-embeddings before the residual LayerNorm).
        mask: (N, K) in {0, 1} (bool, integer or float): the dynamic mask F_mask of Eq. 3;
            None = all ones (the plain L_ort of the ablation). No gradient flows to it.
        beta: the correlation allowance (>= 0).
        reduction: ``"mean"`` over images, ``"sum"`` or ``"none"`` ((N,) per image).

    Per image: [ sum_{a != b} |m_a m_b <e_a, e_b>| - beta ]+ (each unordered pair counted
    twice, as in Eq. 4's double sum).
    """
    return _orthogonal_loss(_check_beta, sub_emb, mask, beta, reduction)


def _orthogonal_loss(check_hyper, sub_emb, mask, beta, reduction):
    """orthogonal_loss with its hyper-parameters checked by ``check_hyper``: the loss's own, or,
    for its module form, none (the module checked them when they were set)."""
    V.check_tensor(sub_emb, "sub_emb", 3, finite=False)
    n, k, _ = sub_emb.shape
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        if mask.dtype.is_complex:
            raise TypeError(f"mask must be a bool, integer or float tensor, got {mask.dtype}")
        if mask.shape != (n, k):
            raise ValueError(f"mask must have shape (N, K) = {(n, k)}, got {tuple(mask.shape)}")
        if mask.device != sub_emb.device:
            raise ValueError(f"mask is on {mask.device} but sub_emb is on {sub_emb.device}")
    beta, reduction = check_hyper(beta, reduction)
    # values last (docs/spec.md §1: where the value check is on, CPU by default)
    V.check_finite(sub_emb, "sub_emb")
    if mask is not None and V.check_finite_enabled(mask.device) and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must contain only 0 and 1")
    e = to_acc(sub_emb)
    if mask is None:
        m = torch.ones(n, k, dtype=e.dtype, device=e.device)
    else:
        m = mask.detach().to(e.dtype)
    gram = e @ e.transpose(1, 2)                                   # <e_a, e_b>, (N, K, K)
    masked = (m.unsqueeze(2) * m.unsqueeze(1) * gram).abs()       # |m_a m_b <e_a, e_b>|
    off = ~torch.eye(k, dtype=torch.bool, device=e.device)
    total = torch.where(off, masked, torch.zeros_like(masked)).sum(dim=(1, 2))
    per_image = torch.relu(total - beta)                           # Eq. 4
    if reduction == "none":
        return per_image
    return per_image.sum() if reduction == "sum" else per_image.mean()


class VarianceWeightedLoss(ModuleForm, functional=variance_weighted_loss, inputs=("sub_sim", "positives"),
                           check=_check_margin, checked=_variance_weighted_loss):
    """Module form of :func:`fastrank.variance_weighted_loss`: ``VarianceWeightedLoss()(sub_sim)``."""


class OrthogonalLoss(ModuleForm, functional=orthogonal_loss, inputs=("sub_emb", "mask"), check=_check_beta,
                     checked=_orthogonal_loss):
    """Module form of :func:`fastrank.orthogonal_loss`: ``OrthogonalLoss(beta=0.4)(sub_emb, mask)``."""


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("variance_weighted", variance_weighted_loss, VarianceWeightedLoss, combined=False),
        Loss("orthogonal", orthogonal_loss, OrthogonalLoss, combined=False))
