"""Image-caption pairs on disk: the Karpathy split JSON (COCO, Flickr30K, Flickr8K) with its image
folder, or a CSV of (path, caption) rows. ``fastrank extract`` runs a backbone over them and
writes the precomp layout (``fastrank.data.PrecompDataset``).

Karpathy JSON (``dataset_coco.json``, ``dataset_flickr30k.json``)::

    {"images": [{"filename": "...jpg", "filepath": "val2014" (COCO only),
                 "split": "train" | "val" | "test" | "restval",
                 "sentences": [{"raw": "A man ...", "tokens": [...]}, ...]}, ...]}

An image's file is ``<images>/<filepath>/<filename>`` (or ``<images>/<filename>`` where that is
the one that exists). CSV: one caption per row, ``path,caption`` (a header row naming the first
column path / image / filename / file is skipped); relative paths are taken from ``images``
(default: the CSV's folder); an image's captions are its rows, in file order.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Union

from .. import _validation as V

KARPATHY_SPLITS = ("train", "val", "test", "restval")
_CSV_HEADERS = ("path", "image", "filename", "file", "image_path")
_SPACE = re.compile(r"\s+")


class ImageCaptions(NamedTuple):
    """One image on disk and its captions (whitespace collapsed: one line each)."""
    path: Path
    captions: List[str]


def _clean(text: str) -> str:
    return _SPACE.sub(" ", str(text)).strip()


def _take(items: List[ImageCaptions], cpi: int, where: str) -> List[ImageCaptions]:
    """Keep the first cpi captions of every image (COCO has a few images with 6 or 7); fewer is an error."""
    short = [it for it in items if len(it.captions) < cpi]
    if short:
        it = short[0]
        raise ValueError(f"{where}: {len(short)} image(s) have fewer than captions_per_image = {cpi} non-empty "
                         f"captions, e.g. {it.path} ({len(it.captions)}); pass a smaller captions_per_image")
    return [ImageCaptions(it.path, it.captions[:cpi]) for it in items]


def _splits(split) -> tuple:
    names = [s.strip() for s in split.split(",")] if isinstance(split, str) else list(split or ())
    if not names or not all(isinstance(s, str) and s for s in names):
        raise ValueError(f"split must name Karpathy splits among {KARPATHY_SPLITS} (e.g. 'test' or "
                         f"'train,restval'), got {split!r}")
    bad = [s for s in names if s not in KARPATHY_SPLITS]
    if bad:
        raise ValueError(f"split: unknown Karpathy split(s) {bad}; known: {KARPATHY_SPLITS}")
    return tuple(names)


def read_karpathy(json_path, images, split: Union[str, Sequence[str]], captions_per_image: int = 5
                  ) -> List[ImageCaptions]:
    """The images of ``split`` (one Karpathy split, or several: ``"train,restval"``, the VSE
    training set of COCO) in file order, each with its first ``captions_per_image`` captions."""
    cpi = V.check_int(captions_per_image, "captions_per_image")
    wanted = _splits(split)
    json_path, images = Path(json_path), Path(images)
    if not json_path.is_file():
        raise FileNotFoundError(f"Karpathy split file {json_path} does not exist")
    if not images.is_dir():
        raise FileNotFoundError(f"image folder {images} does not exist")
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
        entries = data["images"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{json_path} is not a Karpathy split file ({type(e).__name__}: {e}); expected "
                         '{"images": [{"filename", "split", "sentences": [{"raw"}, ...]}, ...]}') from None
    out = []
    for k, im in enumerate(entries):
        try:
            if im["split"] not in wanted:
                continue
            name, sub = im["filename"], im.get("filepath", "")
            caps = [c for c in (_clean(s["raw"]) for s in im["sentences"]) if c]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{json_path}: image entry {k} lacks {e} "
                             f"(needs filename, split, sentences[].raw)") from None
        path = images / sub / name
        if sub and not path.exists() and (images / name).exists():
            path = images / name
        out.append(ImageCaptions(path, caps))
    if not out:
        raise ValueError(f"{json_path}: no image in split(s) {list(wanted)}")
    return _take(out, cpi, str(json_path))


def read_caption_csv(csv_path, images=None, captions_per_image: int = 5) -> List[ImageCaptions]:
    """The images of a ``path,caption`` CSV in order of first appearance, each with its first
    ``captions_per_image`` captions. Relative paths are taken from ``images`` (default: the CSV's folder)."""
    cpi = V.check_int(captions_per_image, "captions_per_image")
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise FileNotFoundError(f"caption CSV {csv_path} does not exist")
    base = csv_path.parent if images is None else Path(images)
    if not base.is_dir():
        raise FileNotFoundError(f"image folder {base} does not exist")
    groups = {}
    with csv_path.open(newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.reader(f), 1):
            if not row or all(not c.strip() for c in row):
                continue
            if line == 1 and row[0].strip().lower() in _CSV_HEADERS:
                continue
            if len(row) != 2:
                raise ValueError(f"{csv_path}:{line}: expected 2 columns (path, caption), got {len(row)}: {row!r}")
            path, cap = row[0].strip(), _clean(row[1])
            if not path or not cap:
                raise ValueError(f"{csv_path}:{line}: empty path or caption")
            groups.setdefault(path, []).append(cap)
    if not groups:
        raise ValueError(f"{csv_path}: no (path, caption) rows")
    return _take([ImageCaptions(base / p, caps) for p, caps in groups.items()], cpi, str(csv_path))


def read_image_captions(data, images=None, split: Optional[str] = None, captions_per_image: int = 5
                        ) -> List[ImageCaptions]:
    """``read_karpathy`` for a ``.json`` file (``split`` required), ``read_caption_csv`` for a
    ``.csv`` one (no split)."""
    suffix = Path(data).suffix.lower()
    if suffix == ".json":
        if split is None:
            raise ValueError(f"split is required for a Karpathy split file ({KARPATHY_SPLITS}, "
                             f"or e.g. 'train,restval')")
        if images is None:
            raise ValueError("images (the image folder) is required for a Karpathy split file")
        return read_karpathy(data, images, split, captions_per_image)
    if suffix == ".csv":
        if split is not None:
            raise ValueError("split applies to a Karpathy split file, not to a CSV (split the CSV instead)")
        return read_caption_csv(data, images, captions_per_image)
    raise ValueError(f"data must be a Karpathy split .json or a (path, caption) .csv, got {data!r}")
