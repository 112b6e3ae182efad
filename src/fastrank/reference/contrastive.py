"""Pure-PyTorch contrastive losses on the scaled similarity matrix (docs/spec.md §2.12): the
definitions the blockwise losses from the embeddings (src/fastrank/ops/contrastive.py) equal.

With the logits ``L = logit_scale * img @ txt.T (+ logit_bias)``, (n, m), and one positive
document ``p_i`` per query (positives by index; CLIP's is the diagonal, ``p_i = i``):

- InfoNCE, CLIP (Radford et al., "Learning Transferable Visual Models From Natural Language
  Supervision", ICML 2021, Sec. 2.3 and Fig. 3): the cross-entropy of each query's row of
  logits with target p_i (i2t), and of each positive document's column with target i (t2i);
  CLIP's loss is the mean of the two directions' mean cross-entropies;
- SigLIP (Zhai et al., "Sigmoid Loss for Language Image Pre-Training", ICCV 2023, the sigmoid loss):
  ``-(1 / n) sum_i sum_j log sigma(z_ij L_ij)`` with z_ij = 1 for j = p_i, -1 otherwise.

Both build the (n, m) logits: memory O(n * m). The per-query losses here are reduced by the
callers (docs/spec.md §2.12: "mean" is the mean of the per-query losses).
"""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F
from torch import Tensor


def scaled_logits(img: Tensor, txt: Tensor, logit_scale: Tensor) -> Tensor:
    """L = logit_scale * img @ txt.T (CLIP Fig. 3: ``logits = np.dot(I_e, T_e.T) * np.exp(t)``)."""
    return logit_scale * (img @ txt.t())


def info_nce_per_query(img: Tensor, txt: Tensor, logit_scale: Tensor, positives: Tensor,
                       direction: str) -> List[Tensor]:
    """The per-query cross-entropies of each requested direction (i2t first), each (n,).

    i2t: query i's row of logits, target p_i: ``logsumexp_j L_ij - L_{i p_i}``.
    t2i: for each pair (i, p_i), document p_i's column of logits over the n queries, target i:
    ``logsumexp_k L_{k p_i} - L_{i p_i}`` (CLIP Fig. 3, ``loss_t = cross_entropy_loss(logits,
    labels, axis=1)``)."""
    logits = scaled_logits(img, txt, logit_scale)
    rows = torch.arange(img.shape[0], device=img.device)
    positive = logits[rows, positives]
    out = []
    if direction in ("i2t", "both"):
        out.append(torch.logsumexp(logits, dim=1) - positive)
    if direction in ("t2i", "both"):
        out.append(torch.logsumexp(logits, dim=0)[positives] - positive)
    return out


def siglip_per_query(img: Tensor, txt: Tensor, logit_scale: Tensor, logit_bias: Tensor, positives: Tensor) -> Tensor:
    """Each query's ``-sum_j log sigma(z_ij (logit_scale * <img_i, txt_j> + logit_bias))``
    (SigLIP's sigmoid loss before its 1 / |B|), (n,)."""
    logits = scaled_logits(img, txt, logit_scale) + logit_bias
    labels = -torch.ones_like(logits)
    labels[torch.arange(img.shape[0], device=img.device), positives] = 1.0
    return -F.logsigmoid(labels * logits).sum(dim=1)
