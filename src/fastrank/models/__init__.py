"""Encoder zoo for image-text retrieval on precomputed features.

Image encoders (``IMAGE_ENCODERS``), input (B, R, D) region features (+ optional lengths (B,)
or bool mask (B, R)) or (B, D) global features:

- ``fc_max``: fc + max-pool over regions (VSE++ as re-implemented in Listwise ITR) -> (B, E)
- ``gpo``: fc + 2-layer MLP residual, then GPO pooling (VSE-infinity) -> (B, E)
- ``sub_embed``: K sub-embeddings with the dynamic mask of DVSE (Eq. 3)
  -> SubEmbeddings(emb (B, K, E), mask (B, K), residual (B, K, E))
- ``mlp``: 3-layer MLP on one vector per image (Deep Top-k) -> (B, E)

Text encoders (``TEXT_ENCODERS``): ``gru`` (bi-GRU, mean or GPO pooling, word ids or strings
with a :class:`~fastrank.data.Vocab`), ``sbert`` (sentence-transformers + projection),
``mlp`` (fixed sentence vectors).

Pixel encoders: ``hf_vision`` (any ``transformers`` vision backbone: ResNet, ViT, CLIP's vision
tower; pooling + projection) and ``cnn`` (a small CNN from scratch); text: ``hf_text`` (any
``transformers`` text model, e.g. BERT as in VSE-infinity). The weights' name or path may be
part of the name: ``build_text_encoder("hf_text:bert-base-uncased", embed_dim=1024)``.

``VSE(image_encoder, text_encoder)`` L2-normalises both sides and scores pairs; ``build_vse``
builds one by encoder names. New encoders: ``@register_image_encoder("name")`` on a class built
as ``cls(in_dim, embed_dim, **kw)`` whose ``forward(images, lengths=None)`` returns (B, E).
"""
from ._registry import (IMAGE_ENCODERS, TEXT_ENCODERS, build_image_encoder, build_text_encoder,
                        register_image_encoder, register_text_encoder)
from .pooling import GPO, MLP, length_mask, masked_max, masked_mean, positional_encoding
from .image import FCMaxEncoder, GPOEncoder, ImageEncoder, MLPEncoder, SubEmbedEncoder, SubEmbeddings
from .text import GRUTextEncoder, SBERTTextEncoder, bundled_sbert_path
from .hf import HFTextEncoder, HFVisionBackbone, HFVisionEncoder, load_image_processor
from .cnn import SmallCNNEncoder
from .vse import VSE, VSEOutput, build_vse

__all__ = [
    "IMAGE_ENCODERS", "TEXT_ENCODERS", "build_image_encoder", "build_text_encoder",
    "register_image_encoder", "register_text_encoder",
    "GPO", "MLP", "length_mask", "masked_max", "masked_mean", "positional_encoding",
    "ImageEncoder", "FCMaxEncoder", "GPOEncoder", "SubEmbedEncoder", "MLPEncoder", "SubEmbeddings",
    "GRUTextEncoder", "SBERTTextEncoder", "bundled_sbert_path",
    "HFTextEncoder", "HFVisionBackbone", "HFVisionEncoder", "load_image_processor", "SmallCNNEncoder",
    "VSE", "VSEOutput", "build_vse",
]
