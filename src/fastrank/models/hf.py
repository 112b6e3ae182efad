"""Transformer encoders through Hugging Face ``transformers``: any text ``AutoModel`` (BERT as in
VSE-infinity and DVSE, RoBERTa, MiniLM, CLIP's text tower, ...) and any vision backbone
(ResNet, ViT, CLIP's vision tower, ...), with pooling and a linear projection to the joint space.

- ``hf_text``: tokenizer + AutoModel -> token features (B, L, H) -> linear H -> E per token ->
  pooling over the valid tokens: ``"gpo"`` (VSE-infinity's GPO, the default), ``"mean"`` or
  ``"cls"`` (the first token).
- ``hf_vision``: AutoModel on pixels -> token features (B, T, H) (a ViT's patch tokens, a CNN's
  h x w grid) -> linear per token -> ``"gpo"`` / ``"mean"`` / ``"max"`` / ``"cls"``, or
  ``"pooled"``: the backbone's own pooled vector (a ResNet's average pool, CLIP's
  post-layernorm class token) projected.

Weights come by name or path (``model="bert-base-uncased"``, ``"microsoft/resnet-152"``,
``"openai/clip-vit-base-patch32"``, a local directory written by ``save_pretrained``), loaded
with ``from_pretrained``; nothing is downloaded unless a name is given and not cached. The
registry also takes the model in the encoder name: ``build_text_encoder("hf_text:bert-base-uncased")``.
Images are preprocessed by the model's ``AutoImageProcessor`` with the PIL backend (no torchvision).

``finetune`` (default True, as VSE-infinity and DVSE train their backbones) trains the
transformer; False freezes it (eval mode, no gradient: only the projection and pooling train).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .. import _validation as V
from ._frozen import FinetuneSwitch
from ._registry import register_image_encoder, register_text_encoder
from .pooling import GPO, length_mask, masked_max, masked_mean

TEXT_POOLING = ("gpo", "mean", "cls")
VISION_POOLING = ("gpo", "mean", "max", "cls", "pooled")


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - transformers is a dependency
        raise ImportError("the hf_text / hf_vision encoders need the package transformers") from e
    return transformers


def _load(model, kind: str):
    """A model name / path -> ``AutoModel.from_pretrained``; a loaded model is used as it is."""
    tf = _transformers()
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        model = tf.AutoModel.from_pretrained(str(model))
    if not isinstance(model, tf.PreTrainedModel):
        raise TypeError(f"model must be a model name, a path or a transformers PreTrainedModel, "
                        f"got {type(model).__name__}")
    # a two-tower checkpoint (CLIP, SigLIP, ...): keep the tower this encoder needs
    if hasattr(model, "text_model") and hasattr(model, "vision_model"):
        model = getattr(model, f"{kind}_model")
    return model


def _feature_dim(config) -> int:
    dim = getattr(config, "hidden_size", None)
    if dim is None and getattr(config, "hidden_sizes", None):
        dim = config.hidden_sizes[-1]
    if dim is None:
        raise ValueError(f"cannot tell the feature dimension of a {type(config).__name__} "
                         f"(no hidden_size / hidden_sizes)")
    return int(dim)


class _Backbone(FinetuneSwitch):
    """Shared by the two encoders: the ``finetune`` switch (models/_frozen.py) and the pooling."""

    def _pool(self, tokens: Tensor, mask: Tensor) -> Tensor:
        if self.pooling == "gpo":
            return self.gpo(tokens, mask)[0]
        if self.pooling == "mean":
            return masked_mean(tokens, mask)
        if self.pooling == "max":
            return masked_max(tokens, mask)
        return tokens[:, 0]   # cls


@register_text_encoder("hf_text")
class HFTextEncoder(_Backbone):
    """A ``transformers`` text model + per-token linear projection + pooling (VSE-infinity's BERT
    text encoder with ``pooling="gpo"``).

    in_dim: None or the model's hidden size (checked). model: a name or path (tokenizer and
    model loaded from it) or a loaded PreTrainedModel (then pass ``tokenizer``). max_length:
    longer captions are truncated (default: the tokenizer's limit, 512 for BERT).
    forward(captions: list of B strings, lengths=None) -> (B, E); or word-piece ids (B, L) with
    lengths: (B,) counts or a bool (B, L) attention mask.
    """

    def __init__(self, in_dim: Optional[int] = None, embed_dim: int = 1024, model=None, tokenizer=None,
                 pooling: str = "gpo", finetune: bool = True, max_length: Optional[int] = None,
                 d_pe: int = 32, d_hidden: int = 32):
        super().__init__()
        if model is None:
            raise ValueError("hf_text needs model= (a transformers model name or path, e.g. "
                             "'bert-base-uncased'), or the name in the encoder: 'hf_text:bert-base-uncased'")
        tf = _transformers()
        if tokenizer is None:
            if not isinstance(model, (str, bytes)) and not hasattr(model, "__fspath__"):
                raise ValueError("a loaded model needs tokenizer= (a transformers tokenizer, or its name / path)")
            tokenizer = str(model)
        if isinstance(tokenizer, (str, bytes)) or hasattr(tokenizer, "__fspath__"):
            tokenizer = tf.AutoTokenizer.from_pretrained(str(tokenizer))
        self.tokenizer = tokenizer
        self.model = _load(model, "text")
        dim = _feature_dim(self.model.config)
        if in_dim is not None and in_dim != dim:
            raise ValueError(f"in_dim ({in_dim}) does not match the text model's hidden size ({dim})")
        self.in_dim, self.embed_dim = dim, V.check_int(embed_dim, "embed_dim")
        self.pooling = V.check_choice(pooling, "pooling", TEXT_POOLING)
        self.max_length = None if max_length is None else V.check_int(max_length, "max_length")
        self.proj = nn.Linear(dim, self.embed_dim)
        self.gpo = GPO(d_pe, d_hidden) if self.pooling == "gpo" else None
        self._set_finetune(finetune)

    def tokenize(self, captions: Sequence[str]) -> Tuple[Tensor, Tensor]:
        """Caption strings -> (input_ids (B, L), attention_mask (B, L) bool) on the encoder's device."""
        enc = self.tokenizer(list(captions), padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="pt")
        device = self.proj.weight.device
        return enc["input_ids"].to(device), enc["attention_mask"].to(device).bool()

    def forward(self, captions, lengths=None) -> Tensor:
        if isinstance(captions, (list, tuple)):
            if not captions or not all(isinstance(c, str) for c in captions):
                raise TypeError("hf_text captions must be a non-empty list of strings (or ids (B, L))")
            if lengths is not None:
                raise ValueError("lengths must be None when captions are strings")
            ids, mask = self.tokenize(captions)
        elif isinstance(captions, Tensor) and captions.dtype == torch.long and captions.dim() == 2:
            if captions.numel() == 0:
                raise ValueError(f"captions must not be empty, got shape {tuple(captions.shape)}")
            ids = captions
            if lengths is None:
                mask = torch.ones_like(ids, dtype=torch.bool)
            else:
                mask = length_mask(ids, lengths, "lengths")
        else:
            raise TypeError("hf_text captions must be a list of strings or a LongTensor (B, L) of token ids, got "
                            + (f"{captions.dtype} of shape {tuple(captions.shape)}"
                               if isinstance(captions, Tensor) else type(captions).__name__))
        with torch.set_grad_enabled(self.finetune and torch.is_grad_enabled()):
            tokens = self.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        return self._pool(self.proj(tokens.to(self.proj.weight.dtype)), mask)


def load_image_processor(name_or_path):
    """``AutoImageProcessor.from_pretrained(name_or_path)`` with the PIL backend (torchvision is
    not needed)."""
    tf = _transformers()
    try:
        return tf.AutoImageProcessor.from_pretrained(str(name_or_path), backend="pil")
    except TypeError:  # pragma: no cover - transformers releases without the backend switch
        return tf.AutoImageProcessor.from_pretrained(str(name_or_path), use_fast=False)


def as_pixels(images, in_dim: Optional[int], channels: int, name: str = "images") -> Tensor:
    """Pixel input of a vision encoder as (B, C, H, W): a (B, C, H, W) float tensor, or
    (B, C * S * S) flattened square images (the pixel precomp layout, where ``in_dim`` = C S S)."""
    V.check_tensor(images, name, finite=False)
    if images.dim() == 2:
        if in_dim is None:
            raise ValueError(f"{name} (B, D) flattened pixels need the encoder's in_dim (C * H * W); "
                             f"pass (B, C, H, W) or build the encoder with in_dim")
        if images.shape[1] != in_dim:
            raise ValueError(f"{name} must have {in_dim} values per image (C * H * W), got shape "
                             f"{tuple(images.shape)}")
        side = int(round((in_dim // channels) ** 0.5))
        images = images.reshape(images.shape[0], channels, side, side)
    elif images.dim() != 4:
        raise ValueError(f"{name} must be pixels (B, C, H, W) or flattened (B, C*H*W), got shape "
                         f"{tuple(images.shape)}")
    if images.shape[1] != channels:
        raise ValueError(f"{name} must have {channels} channels, got shape {tuple(images.shape)}")
    if images.shape[0] == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(images.shape)}")
    return images


def check_flat_pixels(in_dim: Optional[int], channels: int) -> Optional[int]:
    """in_dim of a pixel encoder: None, or C * S * S for flattened square images."""
    if in_dim is None:
        return None
    in_dim = V.check_int(in_dim, "in_dim")
    side = int(round((in_dim // channels) ** 0.5)) if in_dim % channels == 0 else 0
    if side < 1 or channels * side * side != in_dim:
        raise ValueError(f"in_dim ({in_dim}) must be channels * S * S for flattened square {channels}-channel "
                         f"images, or None")
    return in_dim


class HFVisionBackbone(nn.Module):
    """A ``transformers`` vision model and its image processor, no head: what
    ``fastrank extract`` runs and :class:`HFVisionEncoder` trains.

    model: a name / path (model and processor loaded from it) or a loaded PreTrainedModel.
    processor: None (the model's own, when it comes by name), an image processor, its name /
    path, or False (none: pixel tensors only).
    ``features(pixel_values (B, C, H, W))`` -> (tokens (B, T, H), pooled (B, H) or None): a
    ViT's tokens (the class token first), a CNN's h x w grid flattened row-major.
    ``preprocess(list of PIL images)`` -> pixel_values (B, C, H, W).
    """

    def __init__(self, model, processor=None):
        super().__init__()
        if model is None:
            raise ValueError("a vision backbone needs model= (a transformers model name or path, e.g. "
                             "'microsoft/resnet-152'), or the name in the encoder: 'hf_vision:<name>'")
        by_name = isinstance(model, (str, bytes)) or hasattr(model, "__fspath__")
        if processor is None and by_name:
            processor = str(model)
        elif processor is False:
            processor = None
        if isinstance(processor, (str, bytes)) or hasattr(processor, "__fspath__"):
            processor = load_image_processor(processor)
        self.processor = processor
        self.model = _load(model, "vision")
        self.dim = _feature_dim(self.model.config)
        self.channels = int(getattr(self.model.config, "num_channels", 3))
        self.is_grid = getattr(self.model.config, "hidden_size", None) is None   # CNN: no class token

    def preprocess(self, images) -> Tensor:
        if self.processor is None:
            raise ValueError("this backbone has no image processor: pass pixel tensors (B, C, H, W), or "
                             "build it with processor=")
        return self.processor(images=list(images), return_tensors="pt")["pixel_values"]

    def features(self, pixel_values: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
        out = self.model(pixel_values=pixel_values)
        tokens = out.last_hidden_state
        if tokens.dim() == 4:                                   # (B, C, h, w) grid
            tokens = tokens.flatten(2).transpose(1, 2)
        pooled = getattr(out, "pooler_output", None)
        if pooled is not None:
            pooled = pooled.flatten(1)
        return tokens, pooled


def _is_pil_list(x) -> bool:
    if not isinstance(x, (list, tuple)) or not x:
        return False
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover
        return False
    return all(isinstance(i, Image.Image) for i in x)


@register_image_encoder("hf_vision")
class HFVisionEncoder(_Backbone):
    """A ``transformers`` vision backbone + per-token linear projection + pooling (VSE-infinity /
    DVSE on pixels: ResNet-152 / ResNeXt grid features with ``pooling="gpo"``), or
    ``pooling="pooled"``: the backbone's pooled vector, projected.

    in_dim: None, or C * S * S when images come flattened (B, C S S) (square images, the pixel
    precomp layout the trainer reads). model / processor: see :class:`HFVisionBackbone`.
    forward(images, lengths=None (must be None)) -> (B, E); images: a list of PIL images
    (preprocessed by the model's image processor), pixel_values (B, C, H, W), or (B, C S S).
    """

    def __init__(self, in_dim: Optional[int] = None, embed_dim: int = 1024, model=None, processor=None,
                 pooling: str = "gpo", finetune: bool = True, d_pe: int = 32, d_hidden: int = 32):
        super().__init__()
        self.pooling = V.check_choice(pooling, "pooling", VISION_POOLING)
        self.backbone = HFVisionBackbone(model, processor)
        if self.pooling == "cls" and self.backbone.is_grid:
            raise ValueError("pooling='cls' needs a backbone with a class token (ViT, CLIP); this one "
                             f"({type(self.model).__name__}) gives a feature grid: use 'gpo', 'mean', "
                             "'max' or 'pooled'")
        self.in_dim = check_flat_pixels(in_dim, self.backbone.channels)
        self.feature_dim = self.backbone.dim
        self.embed_dim = V.check_int(embed_dim, "embed_dim")
        self.proj = nn.Linear(self.feature_dim, self.embed_dim)
        self.gpo = GPO(d_pe, d_hidden) if self.pooling == "gpo" else None
        self._set_finetune(finetune)

    @property
    def model(self) -> nn.Module:
        """The transformers vision model (held once, by ``backbone``)."""
        return self.backbone.model

    def forward(self, images, lengths=None) -> Tensor:
        if lengths is not None:
            raise ValueError("hf_vision takes whole images: lengths must be None")
        if _is_pil_list(images):
            pixels = self.backbone.preprocess(images)
        elif isinstance(images, Tensor):
            pixels = as_pixels(images, self.in_dim, self.backbone.channels)
        else:
            raise TypeError(f"hf_vision images must be a list of PIL images or a pixel tensor (B, C, H, W), "
                            f"got {type(images).__name__}")
        pixels = pixels.to(self.proj.weight.device, self.proj.weight.dtype)
        with torch.set_grad_enabled(self.finetune and torch.is_grad_enabled()):
            tokens, pooled = self.backbone.features(pixels)
        if self.pooling == "pooled":
            if pooled is None:
                raise ValueError(f"{type(self.model).__name__} has no pooled output: use pooling 'gpo' or 'mean'")
            return self.proj(pooled.to(self.proj.weight.dtype))
        tokens = self.proj(tokens.to(self.proj.weight.dtype))
        mask = torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)
        return self._pool(tokens, mask)
