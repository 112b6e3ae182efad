"""``fastrank extract``: run a vision backbone over images on disk and write the precomp layout
that the trainer reads (``<out>/<name>_ims.npy`` + ``<out>/<name>_caps.txt``).

    fastrank extract --data dataset_coco.json --images coco/images --split train,restval --name train \\
        --backbone microsoft/resnet-152 --features grid --out data/coco_resnet152

Features per image: ``pooled`` (the backbone's pooled vector, (n, D)) or ``grid`` (its token /
grid features, (n, T, D): a ResNet's 7 x 7 cells at 224 px, a ViT's patch tokens with the
class token first) -- the region input of the ``gpo`` / ``fc_max`` encoders.

Resumable: the images are processed in chunks (``chunk_size`` images, a multiple of the
batch size, so batches are the same whether a run is interrupted or not); each finished chunk
is written to ``<out>/.extract-<name>/`` atomically and skipped on the next run with the same
settings. When every chunk is there they are joined into ``<name>_ims.npy`` (memory-mapped, never
all in memory) and ``<name>_extract.json`` records the settings; a rerun then does nothing.
An interrupted run resumed gives the same bytes as one uninterrupted run.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import numpy as np
import torch

from . import _validation as V
from .data.image_captions import ImageCaptions

__all__ = ["extract_features", "plan_extraction", "run_extraction", "Extraction", "FEATURES"]

FEATURES = ("pooled", "grid")
DTYPES = {"float32": np.float32, "float16": np.float16}


class _Images(torch.utils.data.Dataset):
    """Preprocessed pixel tensors (C, H, W) of image files (the processor runs in the workers)."""

    def __init__(self, paths, processor):
        self.paths, self.processor = list(paths), processor

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image
        with Image.open(self.paths[i]) as im:
            return self.processor(images=[im.convert("RGB")], return_tensors="pt")["pixel_values"][0]


def _fingerprint(items: Sequence[ImageCaptions]) -> str:
    h = hashlib.sha256()
    for it in items:
        h.update(str(it.path).encode())
        h.update(b"\0")
        h.update("\n".join(it.captions).encode())
        h.update(b"\1")
    return h.hexdigest()


def _save_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


@dataclass
class Extraction:
    """A checked extraction (:func:`plan_extraction`): its arguments, checked, and its settings
    as ``<name>_extract.json`` records them. Nothing is written until :func:`run_extraction`."""
    items: List[ImageCaptions]
    out: Path
    name: str
    backbone: Any
    features: str
    batch_size: int
    chunk_size: int
    dtype: str
    workers: int
    max_chunks: Optional[int]
    settings: dict
    done: bool   # <out>/<name>_extract.json records this very extraction: nothing to do


def plan_extraction(items: Sequence[ImageCaptions], out, name: str, backbone, features: str = "pooled",
                    batch_size: int = 32, chunk_size: int = 1024, dtype: str = "float32", workers: int = 0,
                    max_chunks: Optional[int] = None) -> Extraction:
    """The checks of :func:`extract_features` (same arguments), reading but writing nothing: a bad
    argument, a missing image file, or an extraction in ``out`` under ``name`` with other settings
    (finished or not) raise ValueError / FileNotFoundError."""
    items = list(items)
    if not items:
        raise ValueError("items must not be empty")
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ValueError(f"name must be a split name such as 'train' or 'test', got {name!r}")
    cpi = len(items[0].captions)
    if cpi == 0 or any(len(it.captions) != cpi for it in items):
        raise ValueError("every image must have the same, non-zero number of captions")
    features = V.check_choice(features, "features", FEATURES)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    batch_size = V.check_int(batch_size, "batch_size")
    chunk_size = -(-V.check_int(chunk_size, "chunk_size") // batch_size) * batch_size
    workers = V.check_int(workers, "workers", minimum=0)
    if max_chunks is not None:
        max_chunks = V.check_int(max_chunks, "max_chunks", minimum=0)
    missing = [str(it.path) for it in items if not Path(it.path).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of {len(items)} image files are missing, e.g. {missing[:3]}")

    out = Path(out)
    ims_path, caps_path, done_path = out / f"{name}_ims.npy", out / f"{name}_caps.txt", out / f"{name}_extract.json"
    backbone_name = backbone if isinstance(backbone, str) else type(getattr(backbone, "model", backbone)).__name__
    settings = {"backbone": str(backbone_name), "features": features, "dtype": dtype, "batch_size": batch_size,
                "chunk_size": chunk_size, "n_images": len(items), "captions_per_image": cpi,
                "items_sha256": _fingerprint(items)}
    done = False
    if done_path.is_file() and ims_path.is_file() and caps_path.is_file():
        recorded = json.loads(done_path.read_text())
        if {k: recorded.get(k) for k in settings} != settings:
            raise ValueError(f"{done_path} records a different extraction ({recorded.get('backbone')}, "
                             f"{recorded.get('features')}, {recorded.get('n_images')} images); use another --out "
                             f"or --name")
        done = True
    work = out / f".extract-{name}"
    manifest = work / "manifest.json"
    if not done and manifest.is_file():
        old = json.loads(manifest.read_text())
        if old != settings:
            changed = sorted(k for k in settings if old.get(k) != settings[k])
            raise ValueError(f"{work} holds an unfinished extraction with other settings (differs in {changed}); "
                             f"rerun with the same settings to resume, or delete {work}")
    return Extraction(items, out, name, backbone, features, batch_size, chunk_size, dtype, workers, max_chunks,
                      settings, done)


def extract_features(items: Sequence[ImageCaptions], out, name: str, backbone, features: str = "pooled",
                     batch_size: int = 32, chunk_size: int = 1024, device="cpu", dtype: str = "float32",
                     workers: int = 0, max_chunks: Optional[int] = None, progress: bool = True,
                     log=print) -> Optional[Path]:
    """Write ``<out>/<name>_ims.npy`` and ``<out>/<name>_caps.txt`` for ``items`` (from
    :func:`fastrank.data.read_image_captions`; every image has the same number of captions).

    backbone: a transformers vision model name / path, or a
    :class:`fastrank.models.HFVisionBackbone` (with an image processor). features: ``pooled``
    or ``grid``. chunk_size: images per resumable chunk (rounded up to a multiple of
    batch_size). max_chunks: stop after computing that many new chunks (None: all); returns None
    then, and a rerun continues. Returns the ``<name>_ims.npy`` path when complete.
    :func:`plan_extraction` then :func:`run_extraction`.
    """
    plan = plan_extraction(items, out, name, backbone, features, batch_size, chunk_size, dtype, workers, max_chunks)
    return run_extraction(plan, device, progress, log)


def run_extraction(plan: Extraction, device="cpu", progress: bool = True, log=print) -> Optional[Path]:
    """Do the extraction :func:`plan_extraction` checked (see :func:`extract_features`)."""
    from .models.hf import HFVisionBackbone

    items, out, name, backbone, features = plan.items, plan.out, plan.name, plan.backbone, plan.features
    batch_size, chunk_size, dtype, workers, max_chunks = (plan.batch_size, plan.chunk_size, plan.dtype, plan.workers,
                                                          plan.max_chunks)
    settings, cpi = plan.settings, plan.settings["captions_per_image"]
    ims_path, caps_path, done_path = out / f"{name}_ims.npy", out / f"{name}_caps.txt", out / f"{name}_extract.json"
    if plan.done:
        log(f"extract {name}: already done ({ims_path})")
        return ims_path
    out.mkdir(parents=True, exist_ok=True)
    work = out / f".extract-{name}"
    work.mkdir(exist_ok=True)
    manifest = work / "manifest.json"
    if not manifest.is_file():
        manifest.write_text(json.dumps(settings, indent=2))

    n_chunks = -(-len(items) // chunk_size)
    chunk_file = lambda c: work / f"chunk_{c:06d}.npy"   # noqa: E731
    todo = [c for c in range(n_chunks) if not chunk_file(c).is_file()]
    if todo:
        if not isinstance(backbone, HFVisionBackbone):
            backbone = HFVisionBackbone(backbone)
        if backbone.processor is None:
            raise ValueError("the backbone has no image processor (preprocessor_config.json); give it one")
        device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
        backbone = backbone.to(device).eval()
        done_images = sum(min(chunk_size, len(items) - c * chunk_size) for c in range(n_chunks) if c not in todo)
        from tqdm.auto import tqdm
        bar = tqdm(total=len(items), initial=done_images, desc=f"extract {name}", unit="img", disable=not progress)
        try:
            for k, c in enumerate(todo):
                if max_chunks is not None and k >= max_chunks:
                    log(f"extract {name}: stopped after {k} new chunk(s) (max_chunks); rerun to continue")
                    return None
                paths = [it.path for it in items[c * chunk_size:(c + 1) * chunk_size]]
                loader = torch.utils.data.DataLoader(_Images(paths, backbone.processor), batch_size=batch_size,
                                                     num_workers=workers, shuffle=False)
                parts = []
                with torch.inference_mode():
                    for pixels in loader:
                        tokens, pooled = backbone.features(pixels.to(device))
                        if features == "pooled":
                            if pooled is None:
                                raise ValueError(f"{type(backbone.model).__name__} has no pooled output: "
                                                 "use features='grid'")
                            feats = pooled
                        else:
                            feats = tokens
                        parts.append(feats.float().cpu().numpy().astype(DTYPES[dtype]))
                        bar.update(len(pixels))
                _save_atomic(chunk_file(c), np.concatenate(parts))
        finally:
            bar.close()

    # join the chunks: one memory-mapped file, written under a temporary name
    first = np.load(chunk_file(0), mmap_mode="r")
    shape, stored = (len(items),) + first.shape[1:], first.dtype
    tmp = out / f".{name}_ims.tmp.npy"
    joined = np.lib.format.open_memmap(tmp, mode="w+", dtype=first.dtype, shape=shape)
    for c in range(n_chunks):
        part = np.load(chunk_file(c), mmap_mode="r")
        if part.shape[1:] != shape[1:]:
            raise ValueError(f"chunk {c} has features of shape {part.shape[1:]}, chunk 0 {shape[1:]}: the "
                             "processor must give every image the same size for grid features")
        joined[c * chunk_size:c * chunk_size + len(part)] = part
    joined.flush()
    del joined, first, part
    os.replace(tmp, ims_path)
    caps_tmp = out / f".{name}_caps.tmp.txt"
    caps_tmp.write_text("".join(c + "\n" for it in items for c in it.captions), encoding="utf-8")
    os.replace(caps_tmp, caps_path)
    done_path.write_text(json.dumps({**settings, "shape": list(shape)}, indent=2) + "\n")
    shutil.rmtree(work)
    log(f"extract {name}: wrote {ims_path} {shape} {stored} and {caps_path} ({cpi} captions per image)")
    return ims_path
