"""VSE: one image encoder + one text encoder in a joint, L2-normalised embedding space."""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _validation as V
from ._registry import build_image_encoder, build_text_encoder
from .image import SubEmbeddings


class VSEOutput(NamedTuple):
    """What :meth:`VSE.forward` returns for a batch of N images and M captions.

    sim: (N, M) similarity, sim[i, j] = <v_i, t_j> (for sub-embeddings: max_k <v_i^k, t_j>).
    img_emb: (N, E) L2-normalised image embeddings, or (N, K, E) sub-embeddings.
    txt_emb: (M, E) L2-normalised caption embeddings.
    sub_sim: (K, N, M) per-sub-embedding similarity (``sub_embed`` only, else None); the input
        of ``fastrank.variance_weighted_loss``.
    img_mask: (N, K) dynamic mask (Eq. 3 of DVSE; ``sub_embed`` only, else None).
    residual: (N, K, E) sub-embedding residuals v_hat (``sub_embed`` only, else None); with
        img_mask, the input of ``fastrank.orthogonal_loss(residual, img_mask)``.
    """
    sim: Tensor
    img_emb: Tensor
    txt_emb: Tensor
    sub_sim: Optional[Tensor] = None
    img_mask: Optional[Tensor] = None
    residual: Optional[Tensor] = None


def _batches(x, batch_size: int):
    n = x.shape[0] if hasattr(x, "shape") else len(x)
    for s in range(0, n, batch_size):
        yield s, min(s + batch_size, n)


class VSE(nn.Module):
    """Pairs an image encoder and a text encoder (see ``fastrank.models.IMAGE_ENCODERS`` and
    ``TEXT_ENCODERS``); both outputs are L2-normalised, similarity is the inner product, and for
    an image with K sub-embeddings the score is the max over k.

    ``images`` / ``image_lengths``: what the image encoder takes ((B, R, D) regions with
    optional (B,) lengths or (B, R) mask, or (B, D) vectors). ``captions`` / ``caption_lengths``:
    what the text encoder takes (word ids (B, L) + lengths, or a list of strings, or (B, D)).
    """

    def __init__(self, image_encoder: nn.Module, text_encoder: nn.Module):
        super().__init__()
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder

    @property
    def num_embeds(self) -> int:
        """K, the number of embeddings per image (1 unless the image encoder is ``sub_embed``)."""
        return getattr(self.image_encoder, "num_embeds", 1)

    @property
    def device(self) -> torch.device:
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        p = next(self.parameters(), None)
        return p.dtype if p is not None else torch.float32

    def embed_images(self, images: Tensor, lengths=None) -> Union[Tensor, SubEmbeddings]:
        """L2-normalised image embeddings (N, E), or SubEmbeddings with emb (N, K, E) normalised
        (the mask and the residuals are returned as the encoder gives them)."""
        out = self.image_encoder(images, lengths)
        if isinstance(out, SubEmbeddings):
            return out._replace(emb=F.normalize(out.emb, dim=-1))
        return F.normalize(out, dim=-1)

    def embed_texts(self, captions, lengths=None) -> Tensor:
        """L2-normalised caption embeddings (M, E)."""
        return F.normalize(self.text_encoder(captions, lengths), dim=-1)

    def forward(self, images, captions, image_lengths=None, caption_lengths=None) -> VSEOutput:
        """Embed N images and M captions and score every pair -> :class:`VSEOutput`."""
        img = self.embed_images(images, image_lengths)
        txt = self.embed_texts(captions, caption_lengths)
        if isinstance(img, SubEmbeddings):
            sim, sub = self.similarity(img.emb, txt, return_sub=True)
            return VSEOutput(sim, img.emb, txt, sub, img.mask, img.residual)
        return VSEOutput(self.similarity(img, txt), img, txt)

    @staticmethod
    def similarity(img_emb: Tensor, txt_emb: Tensor, return_sub: bool = False
                   ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """img_emb (N, E) or (N, K, E), txt_emb (M, E) -> sim (N, M) = img_emb @ txt_emb.T, or
        for sub-embeddings sim[i, j] = max_k <img_emb[i, k], txt_emb[j]>. With ``return_sub``
        (sub-embeddings only) also the (K, N, M) per-sub-embedding similarity."""
        V.check_tensor(img_emb, "img_emb", finite=False)
        V.check_tensor(txt_emb, "txt_emb", 2, finite=False)
        if img_emb.shape[-1] != txt_emb.shape[-1]:
            raise ValueError(f"img_emb and txt_emb must have the same embedding dimension, got "
                             f"{tuple(img_emb.shape)} and {tuple(txt_emb.shape)}")
        if img_emb.dim() == 2:
            if return_sub:
                raise ValueError("return_sub needs sub-embeddings img_emb (N, K, E)")
            return img_emb @ txt_emb.t()
        if img_emb.dim() != 3:
            raise ValueError(f"img_emb must be (N, E) or (N, K, E), got shape {tuple(img_emb.shape)}")
        if return_sub:
            sub = torch.einsum("nke,me->knm", img_emb, txt_emb)
            return sub.amax(0), sub
        sim = img_emb[:, 0] @ txt_emb.t()   # running max over k: never (K, N, M) in memory
        for k in range(1, img_emb.shape[1]):
            sim = torch.maximum(sim, img_emb[:, k] @ txt_emb.t())
        return sim

    def _in_batches(self, data, lengths, batch_size: int, embed) -> Tensor:
        """``embed(batch, its lengths or None)`` over data's batches of batch_size, in eval mode
        (the caller's mode restored after), concatenated."""
        batch_size = V.check_int(batch_size, "batch_size")
        was_training = self.training
        self.eval()
        try:
            return torch.cat([embed(data[s:e], None if lengths is None else lengths[s:e])
                              for s, e in _batches(data, batch_size)])
        finally:
            self.train(was_training)

    @torch.no_grad()
    def encode_images(self, images, lengths=None, batch_size: int = 256) -> Tensor:
        """Embed a gallery in batches, in eval mode, without gradient: images (N, R, D) or (N, D)
        (a Tensor or a numpy / memory-mapped array, moved to the model's device batch by batch)
        -> (N, E), or (N, K, E) for sub-embeddings."""
        def embed(x, lens):
            x = x if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))
            emb = self.embed_images(x.to(device=self.device, dtype=self.dtype), lens)
            return emb.emb if isinstance(emb, SubEmbeddings) else emb
        return self._in_batches(images, lengths, batch_size, embed)

    @torch.no_grad()
    def encode_texts(self, captions, lengths=None, batch_size: int = 256) -> Tensor:
        """Embed captions in batches, in eval mode, without gradient -> (M, E). captions: a list
        of strings (``sbert``, or ``gru`` with a vocab), word ids (M, L) with lengths (M,), or
        sentence vectors (M, D)."""
        def embed(c, lens):
            if isinstance(c, np.ndarray):
                c = torch.as_tensor(c)
            if isinstance(c, Tensor):  # sentence vectors take the model's dtype, word ids stay long
                c = c.to(self.device, self.dtype if c.is_floating_point() else c.dtype)
            return self.embed_texts(c, lens)
        return self._in_batches(captions, lengths, batch_size, embed)

def build_vse(image_encoder: str, text_encoder: str, img_dim: int, txt_dim: Optional[int] = None,
              embed_dim: int = 1024, image_kw: Optional[dict] = None, text_kw: Optional[dict] = None) -> VSE:
    """``VSE(build_image_encoder(image_encoder, img_dim, embed_dim, **image_kw),
    build_text_encoder(text_encoder, txt_dim, embed_dim, **text_kw))``.

    Example: ``build_vse("gpo", "gru", 2048, embed_dim=1024, text_kw={"vocab": vocab})``.
    """
    return VSE(build_image_encoder(image_encoder, img_dim, embed_dim, **(image_kw or {})),
               build_text_encoder(text_encoder, txt_dim, embed_dim, **(text_kw or {})))
