"""Evaluation of a trained VSE model on a split: the trainer's (every ``eval.every`` epochs)
and ``fastrank eval``'s (:func:`evaluate_checkpoint`), through the same steps: encode the
split (:func:`encode_split`), its graded relevance
(:meth:`~fastrank.train.relevance_source.CaptionRelevance.from_config`), the metrics
(:func:`split_metrics`, ``fastrank.metrics.evaluate``)."""
from __future__ import annotations

import copy
from typing import Dict, Optional, Sequence, Tuple

import torch

from ..data import PrecompDataset
from ..models import VSE
from .build import autocast, load_splits
from .checkpoint import load_checkpoint
from .config import Config
from .relevance_source import CaptionRelevance
from .state import CHECKPOINT_FORMAT, model_from_checkpoint

__all__ = ["encode_split", "split_metrics", "format_metrics", "Evaluation", "evaluate_checkpoint", "checkpoint_split",
           "evaluate_split"]


@torch.no_grad()
def encode_split(model: VSE, dataset: PrecompDataset, batch_size: int, amp: bool = False) -> torch.Tensor:
    """(n_images, n_captions) float32 similarity of a dataset's images and captions: both
    galleries embedded in batches of ``batch_size`` (in eval mode, without gradient; float16
    autocast on CUDA with ``amp``), scored in float32 (no fp16 ties)."""
    with autocast(amp):
        img = model.encode_images(dataset.images, batch_size=batch_size)
        txt = model.encode_texts(dataset.captions, batch_size=batch_size)
    return VSE.similarity(img.float(), txt.float())


def split_metrics(sim: torch.Tensor, dataset: PrecompDataset, relevance: Optional[torch.Tensor],
                  ks: Sequence[int], cs_k: Sequence[int], rerank=False) -> Dict[str, float]:
    """``fastrank.metrics.evaluate`` of a split's similarity (docs/spec.md §5 keys) as a flat
    dict of floats; relevance None: no graded metrics. rerank: False, True or a dict of
    ``fast_rerank`` arguments."""
    from ..metrics.evaluate import evaluate
    res = evaluate(sim, dataset.caption_to_image.to(sim.device),
                   relevance.to(sim.device) if relevance is not None else None,
                   ks=tuple(ks), cs_k=tuple(cs_k), rerank=rerank or None)
    return {k: float(v) for k, v in res.items()}


def format_metrics(m: Dict[str, float]) -> str:
    """The headline metrics of a record, for a log line."""
    keys = [("rsum", "rsum"), ("i2t_r1", "i2t R@1"), ("t2i_r1", "t2i R@1"), ("i2t_ndcg", "i2t NDCG"),
            ("t2i_ndcg", "t2i NDCG"), ("rerank_rsum", "rerank rsum")]
    return " ".join(f"{label} {m[k]:.4g}" for k, label in keys if k in m)


class Evaluation:
    """The trainer's evaluation of its eval split. The trainer provides ``cfg``, ``model``,
    ``amp``, ``log``, ``eval_ds``, ``eval_rel`` (a CaptionRelevance or None: built on first use) and
    ``_eval_rel_matrix`` (None until then)."""

    def similarity(self, dataset: Optional[PrecompDataset] = None) -> torch.Tensor:
        """(n_images, n_captions) float32 similarity of a dataset (default: the eval split)."""
        ds = dataset if dataset is not None else self.eval_ds
        return encode_split(self.model, ds, self.cfg.eval.batch_size, self.amp)

    def eval_relevance(self) -> Optional[torch.Tensor]:
        """(n_images, n_captions) relevance of the eval split (cached), or None without a source."""
        if self._eval_rel_matrix is None:
            if self.eval_rel is None:
                self.eval_rel = CaptionRelevance.from_config(self.eval_ds, self.cfg.relevance)
            if self.eval_rel is not None:
                self._eval_rel_matrix = self.eval_rel.full()
        return self._eval_rel_matrix

    def evaluate(self, graded: Optional[bool] = None, rerank=False, sim: Optional[torch.Tensor] = None) -> Dict[str, float]:
        """``fastrank.metrics.evaluate`` on the eval split: a flat dict of floats (docs/spec.md §5 keys).
        graded: include NDCG / tau / CS@K (default ``eval.graded``; needs a relevance source).
        rerank: False, True or a dict of ``fast_rerank`` arguments. sim: reuse a similarity."""
        ec = self.cfg.eval
        graded = ec.graded if graded is None else graded
        if sim is None:
            sim = self.similarity()
        rel = self.eval_relevance() if graded else None
        return split_metrics(sim, self.eval_ds, rel, ec.ks, ec.cs_k, rerank)

    def _epoch_metrics(self) -> Dict[str, float]:
        """The metrics of an epoch's end: :meth:`evaluate`, and with ``eval.rerank`` the
        re-ranked ones, keys prefixed ``rerank_`` (skipped with a log line where fast
        re-ranking is not available)."""
        sim = self.similarity()
        out = self.evaluate(sim=sim)
        if self.cfg.eval.rerank:
            try:
                out.update({f"rerank_{k}": v for k, v in self.evaluate(rerank=True, sim=sim).items()})
            except NotImplementedError as err:
                self.log(f"  (re-ranked evaluation skipped: {err})")
        return out


def checkpoint_split(checkpoint, data: Optional[str] = None, split: Optional[str] = None,
                     device: str = "auto") -> Tuple[VSE, Config, PrecompDataset, torch.device]:
    """What :func:`evaluate_checkpoint` evaluates: (model, config, dataset, device) of a trainer
    checkpoint and a split (defaults as there). A missing or foreign checkpoint raises
    CheckpointError, a missing split FileNotFoundError / ValueError naming it."""
    ckpt = load_checkpoint(checkpoint, format=CHECKPOINT_FORMAT)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else torch.device(device)
    model, cfg, _ = model_from_checkpoint(ckpt, dev)
    dc = copy.deepcopy(cfg.data)
    if data is not None:
        dc.path = data
    if split is not None:
        dc.eval_split = split
    ds = load_splits(dc, (dc.eval_split,), ("data.eval_split",))[0]
    return model, cfg, ds, dev


def evaluate_split(model: VSE, cfg: Config, ds: PrecompDataset, dev: torch.device, relevance: Optional[str] = None,
                   rerank=False, graded: bool = True, cs_k: Optional[Sequence[int]] = None) -> Dict[str, float]:
    """The metrics of :func:`evaluate_checkpoint` on what :func:`checkpoint_split` returned."""
    rel_source = CaptionRelevance.from_config(ds, cfg.relevance, relevance) if graded else None
    rel = rel_source.full() if rel_source is not None else None
    sim = encode_split(model, ds, cfg.eval.batch_size, amp=dev.type == "cuda" and cfg.train.amp)
    ks, cs = cfg.eval.ks, (cs_k if cs_k is not None else cfg.eval.cs_k)
    out = split_metrics(sim, ds, rel, ks, cs)
    if rerank:
        out.update({f"rerank_{k}": v for k, v in split_metrics(sim, ds, rel, ks, cs, rerank).items()})
    return out


def evaluate_checkpoint(checkpoint, data: Optional[str] = None, split: Optional[str] = None,
                        relevance: Optional[str] = None, rerank=False, device: str = "auto",
                        graded: bool = True, cs_k: Optional[Sequence[int]] = None) -> Dict[str, float]:
    """``fastrank eval``: the metrics of a trainer checkpoint on a split.

    data / split: the precomp root and split (default: the checkpoint's data.path and
    data.eval_split; "demo" regenerates the demo data). relevance: "sbert" / "tfidf" / "none"
    (default: the checkpoint's relevance.source; "none" = no graded metrics). rerank: also
    the fast re-ranked metrics, keys prefixed ``rerank_``. Returns the flat metric dict of
    ``fastrank.metrics.evaluate``.
    """
    return evaluate_split(*checkpoint_split(checkpoint, data, split, device), relevance=relevance, rerank=rerank,
                          graded=graded, cs_k=cs_k)
