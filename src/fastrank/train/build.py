"""What a run is built from its config: the datasets of its splits, the model, the seeds and
the mixed-precision context (what the trainer, ``fastrank eval`` and the demo share)."""
from __future__ import annotations

import random
from contextlib import nullcontext
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..data import PrecompDataset, Vocab, make_demo
from ..models import VSE, build_vse

__all__ = ["DEMO_PIXELS", "seed_everything", "load_splits", "load_datasets", "build_model", "autocast"]

DEMO_PIXELS = 32   # side of the rendered demo scenes of ``data.path = "demo_pixels"``
_DEMO_PATHS = ("demo", "demo_pixels")


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def load_splits(data_cfg, names: Sequence[str], keys: Optional[Sequence[str]] = None) -> List[PrecompDataset]:
    """The datasets of the splits ``names`` of a :class:`~fastrank.train.config.DataConfig`'s
    data: precomputed features under ``data.path``, or with ``path = "demo"`` the demo data
    generated in memory (its splits are "train" and "test"), ``"demo_pixels"`` the same scenes
    rendered as 32 x 32 images (flattened, (n, 3072): for the ``cnn`` encoder). ``keys``: the
    config keys the names come from, which a missing split's error names (default: "split")."""
    cpi = data_cfg.captions_per_image
    keys = list(keys) if keys is not None else ["split"] * len(names)
    if data_cfg.path not in _DEMO_PATHS:
        out = []
        for name, key in zip(names, keys):
            try:
                out.append(PrecompDataset(data_cfg.path, name, cpi))
            except FileNotFoundError as err:
                raise FileNotFoundError(f"{key} = {name!r}: {err}") from err
        return out
    splits = make_demo(seed=data_cfg.demo_seed, n_train=data_cfg.demo_n_train,
                       n_test=data_cfg.demo_n_test, captions_per_image=cpi,
                       pixels=DEMO_PIXELS if data_cfg.path == "demo_pixels" else None)
    out = []
    for name, key in zip(names, keys):
        if name not in splits:
            raise ValueError(f"{key} = {name!r}: the demo data has splits {sorted(splits)}")
        out.append(PrecompDataset.from_arrays(splits[name].images, splits[name].captions, cpi, split=name))
    return out


def load_datasets(data_cfg) -> Tuple[PrecompDataset, PrecompDataset]:
    """(train, eval) datasets of a :class:`~fastrank.train.config.DataConfig`
    (``data.train_split``, ``data.eval_split``; see :func:`load_splits`)."""
    train, evaluation = load_splits(data_cfg, (data_cfg.train_split, data_cfg.eval_split),
                                    ("data.train_split", "data.eval_split"))
    return train, evaluation


def build_model(model_cfg, img_dim: int, vocab: Optional[Vocab]) -> VSE:
    """``build_vse`` from a :class:`~fastrank.train.config.ModelConfig`; a gru text encoder
    gets ``vocab`` (so it takes caption strings)."""
    text_kw = dict(model_cfg.text_kw)
    if model_cfg.text_encoder == "gru":
        text_kw["vocab"] = vocab
    if model_cfg.image_encoder == "sub_embed":
        raise ValueError("model.image_encoder = 'sub_embed' is not supported by the trainer (its "
                         "losses take the (K, N, M) sub-similarities); use a single-embedding encoder")
    return build_vse(model_cfg.image_encoder, model_cfg.text_encoder, img_dim,
                     embed_dim=model_cfg.embed_dim, image_kw=dict(model_cfg.image_kw), text_kw=text_kw)


def autocast(amp: bool):
    """float16 autocast on CUDA when ``amp`` (``train.amp`` on a CUDA device), else a no-op."""
    return torch.autocast("cuda", dtype=torch.float16) if amp else nullcontext()
