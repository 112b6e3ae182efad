"""Pooling blocks shared by the encoders: region/word masks, masked mean/max, the masked MLP
of VSE-infinity, and GPO (Generalized Pooling Operator, Chen et al., CVPR 2021).

Shapes: B batch, L (or R) set/sequence length, D feature dimension. A ``mask`` is a bool
(B, L) tensor, True on valid elements; padded elements never change any output.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .. import _validation as V


def length_mask(x: Tensor, lengths=None, name: str = "lengths") -> Tensor:
    """The bool (B, L) validity mask of a padded batch x (B, L, ...).

    lengths: None (everything valid), an integer (B,) tensor of counts in [1, L] (valid
    elements first), or a bool (B, L) mask (any pattern, at least one True per row).
    """
    b, n = x.shape[0], x.shape[1]
    if lengths is None:
        return torch.ones(b, n, dtype=torch.bool, device=x.device)
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths)
    # the value checks read lengths where they are: free for CPU lengths (the usual case),
    # a host sync for CUDA ones, so there they follow docs/spec.md §1 (off by default)
    check = V.check_finite_enabled(lengths.device)
    if lengths.dtype == torch.bool:
        if lengths.shape != (b, n):
            raise ValueError(f"{name} as a bool mask must have shape {(b, n)}, got {tuple(lengths.shape)}")
        if check and not bool(lengths.any(1).all()):
            raise ValueError(f"{name}: every row of the mask needs at least one valid element")
        return lengths.to(x.device)
    if lengths.dtype.is_floating_point or lengths.dim() != 1 or lengths.shape[0] != b:
        raise ValueError(
            f"{name} must be an integer tensor of shape ({b},) or a bool mask of shape {(b, n)}, "
            f"got {lengths.dtype} of shape {tuple(lengths.shape)}")
    if check and not bool(((lengths >= 1) & (lengths <= n)).all()):
        raise ValueError(f"{name} must lie in [1, {n}], got {lengths.tolist()}")
    lengths = lengths.to(x.device)
    return torch.arange(n, device=x.device).unsqueeze(0) < lengths.unsqueeze(1)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """x (B, L, D), mask (B, L) -> mean over the valid elements (B, D)."""
    m = mask.unsqueeze(-1).to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp_min(1)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """x (B, L, D), mask (B, L) -> max over the valid elements (B, D)."""
    return x.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(1)


def apply_rows(fn, x: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Apply a row-wise fn (N, Din) -> (N, Dout) to the valid rows of x (B, L, Din) only, so
    that batch statistics (BatchNorm) never see padding. Padded rows of the result are 0."""
    if mask is None or bool(mask.all()):
        b, n, d = x.shape
        return fn(x.reshape(b * n, d)).reshape(b, n, -1)
    rows = fn(x[mask])
    out = rows.new_zeros(x.shape[0], x.shape[1], rows.shape[-1])
    out[mask] = rows
    return out


class MLP(nn.Module):
    """Linear -> BatchNorm1d -> ReLU (-> Dropout) for every layer but the last, which is linear.

    dims: (in_dim, hidden_1, ..., out_dim). Input (N, in_dim) -> (N, out_dim); for (B, L, in_dim)
    with a mask, apply with :func:`apply_rows`. This is VSE-infinity's ``MLP`` (2 layers,
    hidden = embed_dim // 2) and Deep Top-k's 3-layer fully connected network (dropout 0.3).
    """

    def __init__(self, dims: Sequence[int], dropout: float = 0.0):
        super().__init__()
        dims = [V.check_int(d, "dims") for d in dims]
        if len(dims) < 2:
            raise ValueError(f"dims must list at least (in_dim, out_dim), got {dims}")
        V.check_nonnegative(dropout, "dropout")
        layers = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(dims) - 2:
                layers += [nn.BatchNorm1d(b), nn.ReLU(inplace=True)]
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def positional_encoding(length: int, dim: int, device=None, dtype=torch.float32) -> Tensor:
    """Sinusoidal positional encoding (Vaswani et al.), (length, dim), dim even:
    pe[p, 2i] = sin(p / 10000^(2i/dim)), pe[p, 2i+1] = cos(p / 10000^(2i/dim))."""
    if dim % 2:
        raise ValueError(f"positional encoding dimension must be even, got {dim}")
    pos = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim, device=device)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe.to(dtype)


class GPO(nn.Module):
    """Generalized Pooling Operator (VSE-infinity, Chen et al. 2021).

    For a set of n valid features, each dimension's n values are sorted in descending order
    and pooled with weights theta_1..theta_n (shared by all dimensions) that depend only on n:
    theta = softmax(w^T BiGRU(PE(1..n)) / 0.1), the bi-GRU run over the sinusoidal positional
    encodings of the sorted index, its two directions averaged. Max-pooling (theta = e_1) and
    mean-pooling (theta = 1/n) are special cases.

    forward(features (B, L, D), mask (B, L) bool or None) -> (pooled (B, D), weights (B, L));
    weights are 0 at positions >= n.
    """

    temperature = 0.1

    def __init__(self, d_pe: int = 32, d_hidden: int = 32):
        super().__init__()
        self.d_pe = V.check_int(d_pe, "d_pe")
        self.d_hidden = V.check_int(d_hidden, "d_hidden")
        self.gru = nn.GRU(d_pe, d_hidden, 1, batch_first=True, bidirectional=True)
        self.linear = nn.Linear(d_hidden, 1, bias=False)

    def pool_weights(self, counts: Tensor, max_len: int) -> Tensor:
        """counts (B,) integers in [1, max_len] -> pooling weights (B, max_len).
        The GRU runs once per distinct count, on the unpadded sequence (packed)."""
        uniq, inverse = torch.unique(counts, return_inverse=True)
        pe = positional_encoding(max_len, self.d_pe, counts.device, self.linear.weight.dtype)
        pes = pe.unsqueeze(0).expand(uniq.shape[0], -1, -1)
        packed = pack_padded_sequence(pes, uniq.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=max_len)
        out = (out[..., :self.d_hidden] + out[..., self.d_hidden:]) / 2  # average the two directions
        scores = self.linear(out).squeeze(-1)  # (U, max_len)
        valid = torch.arange(max_len, device=counts.device).unsqueeze(0) < uniq.unsqueeze(1)
        scores = scores.masked_fill(~valid, float("-inf"))
        return torch.softmax(scores / self.temperature, dim=1)[inverse]

    def forward(self, features: Tensor, mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        b, n, _ = features.shape
        if mask is None:
            mask = torch.ones(b, n, dtype=torch.bool, device=features.device)
        counts = mask.sum(1)
        weights = self.pool_weights(counts, n).to(features.dtype)
        # padded values sort last (-inf), then contribute 0 with weight 0
        srt = features.masked_fill(~mask.unsqueeze(-1), float("-inf")).sort(dim=1, descending=True)[0]
        valid = torch.arange(n, device=features.device).unsqueeze(0) < counts.unsqueeze(1)
        srt = srt.masked_fill(~valid.unsqueeze(-1), 0.0)
        return (srt * weights.unsqueeze(-1)).sum(1), weights
