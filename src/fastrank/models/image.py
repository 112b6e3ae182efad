"""Image encoders on precomputed features.

Input ``images``: region features (B, R, D) with optional ``lengths`` (an integer (B,) count
of valid regions, valid first, or a bool (B, R) mask), or one global vector per image (B, D),
treated as a single region. Padded regions never change an output.

Output: (B, E) un-normalised embeddings (``VSE`` L2-normalises them), except ``sub_embed``,
which returns :class:`SubEmbeddings` (K embeddings per image, their dynamic mask and the
attention residuals).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .. import _validation as V
from ._registry import build_image_encoder, register_image_encoder, register_text_encoder
from .pooling import GPO, MLP, apply_rows, length_mask, masked_max, masked_mean


class SubEmbeddings(NamedTuple):
    """Output of the ``sub_embed`` encoder (DVSE, Sec. III-B), K sub-embeddings per image.

    emb: (B, K, E) candidate embeddings v^k = LN(h_V(z) + v_hat^k).
    mask: (B, K) dynamic mask F_mask of Eq. 3, float in {0, 1} (no gradient).
    residual: (B, K, E) local parts v_hat^k = sigmoid(w^1 att^k(z) z), the vectors that the
        dynamic orthogonal constraint (Eq. 4, ``fastrank.orthogonal_loss``) acts on.
    """
    emb: Tensor
    mask: Tensor
    residual: Tensor


def _check_dim(in_dim, name="in_dim") -> int:
    return V.check_int(in_dim, name)


def prepare_features(x, lengths, in_dim: int, name: str = "images") -> Tuple[Tensor, Tensor]:
    """Validate image features; returns (x (B, R, D), mask (B, R) bool). A (B, D) input becomes
    (B, 1, D) (one region per image); then ``lengths`` must be None."""
    V.check_tensor(x, name, finite=False)
    if x.dim() == 2:
        if lengths is not None:
            raise ValueError(f"{name} is (B, D) global features: lengths must be None")
        x = x.unsqueeze(1)
    elif x.dim() != 3:
        raise ValueError(f"{name} must be (B, R, D) region features or (B, D) global features, "
                         f"got shape {tuple(x.shape)}")
    if x.shape[-1] != in_dim:
        raise ValueError(f"{name} must have feature dimension {in_dim}, got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    return x, length_mask(x, lengths)


class ImageEncoder(nn.Module):
    """Base class: ``in_dim`` D, ``embed_dim`` E, ``num_embeds`` (1, or K for sub-embeddings)."""

    num_embeds: int = 1

    def __init__(self, in_dim: int, embed_dim: int):
        super().__init__()
        self.in_dim = _check_dim(in_dim)
        self.embed_dim = _check_dim(embed_dim, "embed_dim")


def _xavier(fc: nn.Linear) -> nn.Linear:
    """VSE++'s initialisation of its image fc: uniform Xavier weights, zero bias."""
    nn.init.xavier_uniform_(fc.weight)
    if fc.bias is not None:
        nn.init.zeros_(fc.bias)
    return fc


@register_image_encoder("fc_max")
class FCMaxEncoder(ImageEncoder):
    """VSE++ as re-implemented in Listwise ITR (Sec. IV, VSE++ dagger): every region feature is
    mapped to E dimensions by one fully connected layer, and the set is max-pooled.

    forward(images (B, R, D) | (B, D), lengths=None) -> (B, E).
    """

    def __init__(self, in_dim: int, embed_dim: int = 1024):
        super().__init__(in_dim, embed_dim)
        self.fc = _xavier(nn.Linear(self.in_dim, self.embed_dim))

    def forward(self, images: Tensor, lengths=None) -> Tensor:
        x, mask = prepare_features(images, lengths, self.in_dim)
        return masked_max(self.fc(x), mask)


@register_image_encoder("gpo")
class GPOEncoder(ImageEncoder):
    """VSE-infinity's image encoder on region features: fc(z) + MLP(z) (2 layers, hidden E/2,
    BatchNorm over valid regions only), then GPO pooling over the regions.

    forward(images (B, R, D) | (B, D), lengths=None) -> (B, E).
    """

    def __init__(self, in_dim: int, embed_dim: int = 1024, mlp: bool = True,
                 d_pe: int = 32, d_hidden: int = 32):
        super().__init__(in_dim, embed_dim)
        self.fc = _xavier(nn.Linear(self.in_dim, self.embed_dim))
        self.mlp = MLP([self.in_dim, max(self.embed_dim // 2, 1), self.embed_dim]) if mlp else None
        self.gpo = GPO(d_pe, d_hidden)

    def forward(self, images: Tensor, lengths=None) -> Tensor:
        x, mask = prepare_features(images, lengths, self.in_dim)
        feats = self.fc(x)
        if self.mlp is not None:
            feats = feats + apply_rows(self.mlp, x, mask)
        return self.gpo(feats, mask)[0]


@register_image_encoder("sub_embed")
class SubEmbedEncoder(ImageEncoder):
    """DVSE sub-embeddings (DVSE, Sec. III-B), K per image.

    - global part h_V(z): a pooling image encoder (``global_encoder``, default ``"gpo"``) (B, E);
    - K attention heads over the regions (structured multi-head self-attention, as in PVSE):
      a^k = softmax_r(w_b^k . tanh(W_a z_r)) over valid regions, att^k(z) z = sum_r a^k_r z_r;
    - v_hat^k = sigmoid(w^1 att^k(z) z) (dropout), v^k = LayerNorm(h_V(z) + v_hat^k);
    - dynamic mask (Eq. 3): F_mask = round(sigmoid(h(w^2 z))) with w^2 a fixed (never trained)
      random fc D -> K and h the mean over valid regions; i.e. mask_k = 1 iff
      mean_r (w^2 z_r)_k > 0.

    forward(images (B, R, D) | (B, D), lengths=None) -> SubEmbeddings(emb (B, K, E),
    mask (B, K), residual (B, K, E)).
    """

    def __init__(self, in_dim: int, embed_dim: int = 1024, num_embeds: int = 6,
                 global_encoder: str = "gpo", d_attn: Optional[int] = None, dropout: float = 0.0,
                 global_kw: Optional[dict] = None):
        super().__init__(in_dim, embed_dim)
        self.num_embeds = V.check_int(num_embeds, "num_embeds")
        if global_encoder == "sub_embed":
            raise ValueError("global_encoder must be a single-embedding image encoder, not 'sub_embed'")
        self.global_encoder = build_image_encoder(global_encoder, self.in_dim, self.embed_dim,
                                                  **(global_kw or {}))
        d_attn = self.in_dim // 2 if d_attn is None else d_attn
        d_attn = V.check_int(max(d_attn, 1), "d_attn")
        self.attn_hidden = nn.Linear(self.in_dim, d_attn, bias=False)        # W_a
        self.attn_heads = nn.Linear(d_attn, self.num_embeds, bias=False)     # w_b^1..K
        self.fc = _xavier(nn.Linear(self.in_dim, self.embed_dim))            # w^1
        self.dropout = nn.Dropout(V.check_nonnegative(dropout, "dropout"))
        self.norm = nn.LayerNorm(self.embed_dim)
        w2 = nn.Linear(self.in_dim, self.num_embeds)                         # w^2, fixed (Eq. 3)
        self.register_buffer("mask_weight", w2.weight.detach().clone())
        self.register_buffer("mask_bias", w2.bias.detach().clone())

    def dynamic_mask(self, x: Tensor, mask: Tensor) -> Tensor:
        """Eq. 3: round(sigmoid(mean_r(w^2 z_r))) -> (B, K) float in {0, 1}, no gradient."""
        with torch.no_grad():
            logits = masked_mean(x, mask) @ self.mask_weight.t().to(x.dtype) + self.mask_bias.to(x.dtype)
            return (logits > 0).to(x.dtype)  # round(sigmoid(t)) = 1 iff t > 0

    def forward(self, images: Tensor, lengths=None) -> SubEmbeddings:
        x, mask = prepare_features(images, lengths, self.in_dim)
        glob = self.global_encoder(x, mask)                                   # h_V(z) (B, E)
        logits = self.attn_heads(torch.tanh(self.attn_hidden(x)))            # (B, R, K)
        logits = logits.masked_fill(~mask.unsqueeze(-1), float("-inf"))
        att = torch.softmax(logits, dim=1)
        pooled = torch.einsum("brk,brd->bkd", att, x)                        # att^k(z) z (B, K, D)
        residual = self.dropout(torch.sigmoid(self.fc(pooled)))              # v_hat^k (B, K, E)
        emb = self.norm(glob.unsqueeze(1) + residual)                        # v^k (B, K, E)
        return SubEmbeddings(emb, self.dynamic_mask(x, mask), residual)


@register_image_encoder("mlp")
@register_text_encoder("mlp")
class MLPEncoder(ImageEncoder):
    """Deep Top-k's fully connected network for one fixed vector per item (image CNN feature or
    sentence vector): 3 layers D -> hidden_dims[0] -> hidden_dims[1] -> E, BatchNorm, ReLU and
    dropout after the hidden layers; the output layer is linear.

    forward(x (B, D) | (B, R, D), lengths=None) -> (B, E); a set (B, R, D) is mean-pooled over
    its valid elements first. Uses BatchNorm: train with batches of more than one item.
    """

    def __init__(self, in_dim: int, embed_dim: int = 1024, hidden_dims: Sequence[int] = (1024, 512),
                 dropout: float = 0.3):
        super().__init__(in_dim, embed_dim)
        self.mlp = MLP([self.in_dim, *hidden_dims, self.embed_dim], dropout)

    def forward(self, x: Tensor, lengths=None) -> Tensor:
        feats, mask = prepare_features(x, lengths, self.in_dim, name="x")
        return self.mlp(masked_mean(feats, mask))
