"""``cnn``: a small convolutional image encoder trained from scratch on pixels (plain torch).

For small images (the rendered demo scenes, 32 x 32): ``len(widths)`` stages of 3 x 3
convolution (stride 2) + BatchNorm + ReLU, each followed by a second 3 x 3 convolution at
stride 1, then the grid is pooled (``"mean"``, ``"max"`` or VSE-infinity's ``"gpo"`` over the
h x w cells, each projected to E first) -> (B, E).

Input: pixels (B, C, H, W), or flattened square images (B, C * S * S) -- the pixel precomp
layout (``{split}_ims.npy`` of shape (n, C S S)) that the trainer reads, with ``in_dim`` = C S S.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from .. import _validation as V
from ._registry import register_image_encoder
from .hf import as_pixels, check_flat_pixels
from .pooling import GPO, masked_max, masked_mean


@register_image_encoder("cnn")
class SmallCNNEncoder(nn.Module):
    """A small CNN from scratch: stages of (conv 3x3 stride 2, BN, ReLU, conv 3x3, BN, ReLU) with
    ``widths`` channels, a per-cell linear projection to E, pooling over the grid.

    in_dim: None, or C * S * S for flattened square images. channels: C.
    forward(images (B, C, H, W) | (B, C S S), lengths=None (must be None)) -> (B, E).
    """

    def __init__(self, in_dim: Optional[int] = None, embed_dim: int = 1024, channels: int = 3,
                 widths: Sequence[int] = (32, 64, 128), pooling: str = "mean",
                 d_pe: int = 32, d_hidden: int = 32):
        super().__init__()
        self.channels = V.check_int(channels, "channels")
        self.in_dim = check_flat_pixels(in_dim, self.channels)
        self.embed_dim = V.check_int(embed_dim, "embed_dim")
        widths = V.check_sequence(widths, "widths", lambda v, n: V.check_int(v, n))
        self.pooling = V.check_choice(pooling, "pooling", ("mean", "max", "gpo"))
        layers, c = [], self.channels
        for w in widths:
            layers += [nn.Conv2d(c, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
                       nn.Conv2d(w, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)]
            c = w
        self.body = nn.Sequential(*layers)
        self.proj = nn.Linear(c, self.embed_dim)
        self.gpo = GPO(d_pe, d_hidden) if self.pooling == "gpo" else None

    def forward(self, images: Tensor, lengths=None) -> Tensor:
        if lengths is not None:
            raise ValueError("cnn takes whole images: lengths must be None")
        x = as_pixels(images, self.in_dim, self.channels)
        grid = self.body(x.to(self.proj.weight.dtype))                 # (B, C', h, w)
        cells = self.proj(grid.flatten(2).transpose(1, 2))           # (B, h w, E)
        if self.gpo is not None:
            return self.gpo(cells, None)[0]
        mask = torch.ones(cells.shape[:2], dtype=torch.bool, device=cells.device)
        return masked_mean(cells, mask) if self.pooling == "mean" else masked_max(cells, mask)
