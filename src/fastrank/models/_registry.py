"""Encoder registries: look encoders up by name (``build_image_encoder("gpo", 2048, 1024)``).

Every registered class is built as ``cls(in_dim, embed_dim, **kw)``. A name ``"base:model"``
(e.g. ``"hf_text:bert-base-uncased"``) builds ``base`` with ``model="model"``: the weights'
name or path travels in the encoder name (configs, checkpoints, the command line).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple, Type

from torch import nn

IMAGE_ENCODERS: Dict[str, Type[nn.Module]] = {}
TEXT_ENCODERS: Dict[str, Type[nn.Module]] = {}


def _register(table: Dict[str, Type[nn.Module]], kind: str, name: str) -> Callable:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} encoder name must be a non-empty string, got {name!r}")

    def deco(cls):
        if name in table and table[name] is not cls:
            raise ValueError(f"{kind} encoder {name!r} is already registered ({table[name].__name__})")
        table[name] = cls
        return cls
    return deco


def register_image_encoder(name: str) -> Callable:
    """Class decorator: ``@register_image_encoder("mine")`` makes ``build_image_encoder("mine", ...)``
    build the class as ``cls(in_dim, embed_dim, **kw)``. Re-using a taken name raises ValueError."""
    return _register(IMAGE_ENCODERS, "image", name)


def register_text_encoder(name: str) -> Callable:
    """Class decorator, as :func:`register_image_encoder`, for text encoders."""
    return _register(TEXT_ENCODERS, "text", name)


def _lookup(table, kind, name) -> Tuple[Type[nn.Module], Optional[str]]:
    """(class, model name or None) of a registered name or ``"base:model"``; ValueError otherwise."""
    if isinstance(name, str) and name not in table and ":" in name:
        base, model = name.split(":", 1)
        if base in table and model:
            return table[base], model
    if name not in table:
        raise ValueError(f"unknown {kind} encoder {name!r}; registered: {sorted(table)} (the hf_* ones "
                         f"also as 'hf_text:<model name or path>')")
    return table[name], None


def check_encoder_name(kind: str, name: str) -> str:
    """``name`` when it builds an encoder of ``kind`` ("image" or "text"), else the ValueError of
    :func:`build_image_encoder` / :func:`build_text_encoder` (nothing is built)."""
    _lookup(IMAGE_ENCODERS if kind == "image" else TEXT_ENCODERS, kind, name)
    return name


def _build(table, kind, name, in_dim, embed_dim, kw) -> nn.Module:
    cls, model = _lookup(table, kind, name)
    if model is not None:
        if "model" in kw:
            raise ValueError(f"{kind} encoder {name!r} names its model; do not pass model= as well")
        return cls(in_dim, embed_dim, model=model, **kw)
    return cls(in_dim, embed_dim, **kw)


def build_image_encoder(name: str, in_dim: int, embed_dim: int = 1024, **kw) -> nn.Module:
    """Build the image encoder registered as ``name`` (see ``IMAGE_ENCODERS``).

    in_dim: feature dimension D of the precomputed image features (B, R, D) or (B, D).
    embed_dim: output dimension of the joint embedding space.
    Unknown names raise ValueError listing the registered ones.
    """
    return _build(IMAGE_ENCODERS, "image", name, in_dim, embed_dim, kw)


def build_text_encoder(name: str, in_dim: Optional[int] = None, embed_dim: int = 1024, **kw) -> nn.Module:
    """Build the text encoder registered as ``name`` (see ``TEXT_ENCODERS``).

    in_dim: vocabulary size for ``"gru"`` (or pass ``vocab=``), sentence-vector dimension
    for ``"mlp"``, ignored (None) for ``"sbert"``.
    Unknown names raise ValueError listing the registered ones.
    """
    return _build(TEXT_ENCODERS, "text", name, in_dim, embed_dim, kw)
