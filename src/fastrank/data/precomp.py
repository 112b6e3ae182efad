"""Precomputed-feature datasets in the SCAN / VSE-infinity layout."""
from __future__ import annotations

from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from .. import _validation as V
from .vocab import Vocab

LAYOUT = ("expected layout: <root>/<split>_ims.npy, a float array of image features, (n_images, "
          "n_regions, dim) or (n_images, dim); and <root>/<split>_caps.txt, {cpi} captions per image, "
          "one per line, the captions of image i on lines {cpi}*i .. {cpi}*i+{last} (SCAN / VSE-infinity "
          "precomp format)")


def _layout(cpi: int) -> str:
    return LAYOUT.format(cpi=cpi, last=cpi - 1)


class PrecompDataset(torch.utils.data.Dataset):
    """Image-caption pairs on precomputed image features, one item per caption.

    Files: ``{root}/{split}_ims.npy`` (memory-mapped; (n_images, n_regions, dim) or
    (n_images, dim)) and ``{split}_caps.txt`` (``captions_per_image`` lines per image, in image
    order). A missing or malformed file raises one FileNotFoundError / ValueError that names
    the expected layout.

    Item i (a caption index): ``(image_feature, caption, image_index, caption_index)`` with
    image_feature a float32 tensor (n_regions, dim) or (dim,), caption a str,
    image_index = i // captions_per_image and caption_index = i.

    Attributes: ``images`` (the (memory-mapped) array), ``captions`` (list of str), ``n_images``,
    ``n_captions``, ``captions_per_image``, ``n_regions`` (None for global features),
    ``feature_dim``, ``caption_to_image`` (LongTensor (n_captions,)), ``image_captions``
    (LongTensor (n_images, captions_per_image)).
    """

    def __init__(self, root, split: str, captions_per_image: int = 5):
        cpi = V.check_int(captions_per_image, "captions_per_image")
        root = Path(root)
        ims, caps = root / f"{split}_ims.npy", root / f"{split}_caps.txt"
        missing = [str(p) for p in (ims, caps) if not p.is_file()]
        if missing:
            where = "" if root.is_dir() else f" (directory {root} does not exist)"
            raise FileNotFoundError(f"precomp dataset split {split!r}: missing {', '.join(missing)}{where}; "
                                    + _layout(cpi))
        try:
            images = np.load(ims, mmap_mode="r", allow_pickle=False)
        except Exception as e:  # not a .npy file
            raise ValueError(f"{ims} could not be read as a .npy array ({e}); " + _layout(cpi)) from None
        try:
            text = caps.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{caps} is not UTF-8 text ({e}); " + _layout(cpi)) from None
        self.root, self.split = root, split
        self._setup(images, text.splitlines(), cpi, f"{ims} / {caps}")

    @classmethod
    def from_arrays(cls, images, captions: Sequence[str], captions_per_image: int = 5,
                    split: str = "memory") -> "PrecompDataset":
        """The same dataset from in-memory data: images (n_images, n_regions, dim) or
        (n_images, dim), captions a list of captions_per_image * n_images strings."""
        self = cls.__new__(cls)
        self.root, self.split = None, split
        self._setup(np.asarray(images), list(captions), V.check_int(captions_per_image, "captions_per_image"),
                    f"split {split!r}")
        return self

    def _setup(self, images: np.ndarray, lines: List[str], cpi: int, where: str) -> None:
        lines = [ln.strip() for ln in lines]
        while lines and not lines[-1]:
            lines.pop()
        problem = None
        if images.ndim not in (2, 3) or 0 in images.shape:
            problem = f"image features have shape {images.shape}"
        elif not (np.issubdtype(images.dtype, np.floating) or np.issubdtype(images.dtype, np.integer)):
            problem = f"image features have dtype {images.dtype}"
        elif len(lines) != cpi * images.shape[0]:
            problem = (f"{len(lines)} captions for {images.shape[0]} images "
                       f"(expected {cpi} x {images.shape[0]} = {cpi * images.shape[0]})")
        elif not all(lines):
            problem = f"caption line {lines.index('') + 1} is empty"
        if problem is not None:
            raise ValueError(f"{where}: {problem}; " + _layout(cpi))
        self.images = images
        self.captions = lines
        self.captions_per_image = cpi
        self.n_images = int(images.shape[0])
        self.n_captions = len(lines)
        self.n_regions = int(images.shape[1]) if images.ndim == 3 else None
        self.feature_dim = int(images.shape[-1])
        self.caption_to_image = torch.arange(self.n_captions) // cpi
        self.image_captions = torch.arange(self.n_captions).view(self.n_images, cpi)

    def __len__(self) -> int:
        return self.n_captions

    def __getitem__(self, index: int) -> Tuple[Tensor, str, int, int]:
        index = int(index)
        if not -self.n_captions <= index < self.n_captions:
            raise IndexError(f"caption index {index} out of range for {self.n_captions} captions")
        index %= self.n_captions
        img = index // self.captions_per_image
        feat = torch.from_numpy(np.array(self.images[img], dtype=np.float32))
        return feat, self.captions[index], img, index

    def __repr__(self) -> str:
        shape = (self.n_images, self.n_regions, self.feature_dim) if self.n_regions else (self.n_images, self.feature_dim)
        return f"PrecompDataset(split={self.split!r}, images={shape}, captions={self.n_captions})"


class Batch(NamedTuple):
    """A collated batch of B items.

    images: (B, R, D) float32 region features, zero-padded when R differs, or (B, D).
    image_lengths: (B,) long valid-region counts, or None for global features.
    captions: (B, L) long word ids padded with 0 (with a vocab), else the B caption strings.
    caption_lengths: (B,) long (with a vocab), else None.
    image_index: (B,) long dataset image index (two captions of one image share it: the
        ground-truth positives of the batch are ``image_index[:, None] == image_index[None, :]``).
    caption_index: (B,) long dataset caption index.
    """
    images: Tensor
    image_lengths: Optional[Tensor]
    captions: Union[Tensor, List[str]]
    caption_lengths: Optional[Tensor]
    image_index: Tensor
    caption_index: Tensor


def collate(items: Sequence[Tuple[Tensor, str, int, int]], vocab: Optional[Vocab] = None) -> Batch:
    """Collate :class:`PrecompDataset` items into a :class:`Batch`: stack (pad) the features,
    tokenise the captions with ``vocab`` (padded ids + lengths) or keep the strings (sbert)."""
    if not items:
        raise ValueError("cannot collate an empty list of items")
    feats, caps, img_idx, cap_idx = zip(*items)
    if feats[0].dim() == 2:
        images = pad_sequence(list(feats), batch_first=True)
        image_lengths = torch.tensor([f.shape[0] for f in feats], dtype=torch.long)
    else:
        images, image_lengths = torch.stack(feats), None
    if vocab is not None:
        captions, caption_lengths = vocab.encode(list(caps))
    else:
        captions, caption_lengths = list(caps), None
    return Batch(images, image_lengths, captions, caption_lengths,
                 torch.tensor(img_idx, dtype=torch.long), torch.tensor(cap_idx, dtype=torch.long))


class PrecompCollate:
    """Picklable ``collate_fn`` for a DataLoader: ``PrecompCollate(vocab)(items) == collate(items, vocab)``."""

    def __init__(self, vocab: Optional[Vocab] = None):
        self.vocab = vocab

    def __call__(self, items) -> Batch:
        return collate(items, self.vocab)
