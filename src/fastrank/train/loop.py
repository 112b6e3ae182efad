"""The reference trainer: a VSE model, a ``CombinedLoss`` over each global batch, AdamW with
step decay, gradient clipping, AMP on CUDA, evaluation every epoch, atomic checkpoints with
exact resume, and data parallelism over ``torchrun`` ranks.

Data order. Epoch e visits the training captions in the permutation drawn from a generator
seeded with (seed, e), cut into global batches of ``train.batch_size`` (the last incomplete
batch is dropped). Rank r of W takes the slice ``[r * B/W, (r + 1) * B/W)`` of every global
batch. The order depends on nothing else, so a resumed run and a W-rank run see exactly the
batches of an uninterrupted single-process run.

Loss. Each term of the ``CombinedLoss`` runs through :class:`fastrank.distributed.LocalLoss`:
rank r scores its own queries against the gathered global batch, the ranks' values sum to the
single-process loss of the global batch, and ``(loss * W).backward()`` under DDP's gradient
averaging gives the single-process gradient (the convention of ``fastrank.distributed``). With
one process this is the plain loss of the batch. Positives are the pairs that share an image
(``image_index[:, None] == image_index[None, :]``: a batch may hold two captions of one image);
relevance (when a term needs it) is built for the global batch from the cached caption
embeddings (see :mod:`fastrank.train.relevance_source`).

Large batches. ``train.cache_chunk = C`` computes each step with gradient caching
(:mod:`fastrank.train.grad_cache`): each rank embeds its batch C pairs at a time without a
graph, every loss term runs on all the embeddings and back-propagates to them, then each chunk
is embedded again under its replayed RNG state and the cached gradient flows into the
parameters (DDP's ``no_sync`` for every chunk but the last). The gradient is the full-batch one
(batch norm sees chunk statistics). ``train.memory_size = K`` adds a cross-batch memory
(:mod:`fastrank.train.cross_batch`): the triplet, Smooth-AP and Recall@k terms also rank the
last K image / caption embeddings of past global batches; it is the same on every rank and
stored in last.pt. See ``docs/training-at-scale.md``.

Files in ``train.out_dir``: ``last.pt`` (everything needed to resume: model, optimizer,
scheduler, grad scaler, RNG states, epoch, step inside the epoch, the epoch's running loss
sums, history, the cross-batch memory), written at each epoch's end and inside epochs every ``train.save_every_steps``
steps / ``train.save_every_minutes`` minutes; ``best.pt`` (the model, its config and vocabulary
at the best ``eval.best_by`` so far: what evaluation and export need); ``metrics.jsonl`` (one
JSON line per epoch); ``config.json``; with ``train.keep_checkpoints = K`` also the last K
``epoch{E}_step{S}.pt`` (last.pt is a hard link to the newest). Every file is written
atomically and loads with ``torch.load(weights_only=True)``.

Exact resume. ``--resume`` restores everything in last.pt and skips the epoch's first ``step``
batches without loading them (the epoch's order depends only on (seed, epoch)), so the resumed
run is the run that was never stopped: same weights, same metrics.jsonl lines. Under torchrun
only rank 0 writes, every rank restores the same file (rank 0's RNG states: the ranks are
seeded alike), and the epoch's loss sums are stored per rank.

Stopping. SIGTERM and SIGUSR1 (what schedulers send before a kill) set a flag; after the
current optimizer step the ranks agree on it (an all-reduce), write last.pt, log one line and
:meth:`Trainer.fit` raises :class:`TrainingInterrupted` (``fastrank train`` exits with
128 + the signal number: 143 for SIGTERM, 138 for SIGUSR1).
"""
from __future__ import annotations

import copy
import json
import math
import os
import random
import signal
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

from ..data import PrecompCollate, PrecompDataset, Vocab, make_demo
from ..distributed import LocalLoss
from ..models import VSE, build_vse
from ..nn import CombinedLoss
from .checkpoint import (CheckpointError, link_atomic, load_checkpoint, rng_state, save_atomic,
                         set_rng_state)
from .config import Config
from .cross_batch import MEMORY_TERMS, CrossBatchMemory
from .grad_cache import cached_step
from .relevance_source import CaptionRelevance

__all__ = ["Trainer", "load_datasets", "build_model", "epoch_batches", "seed_everything",
           "model_from_checkpoint", "evaluate_checkpoint", "CHECKPOINT_FORMAT", "TrainingInterrupted",
           "STOP_SIGNALS"]

CHECKPOINT_FORMAT = "fastrank-train-2"   # -1 (pickled numpy RNG states) needed weights_only=False
STOP_SIGNALS = ("SIGTERM", "SIGUSR1")
# config keys a mid-epoch resume must share with the run that wrote the checkpoint (the data order)
_ORDER_KEYS = ("batch_size", "seed", "max_steps_per_epoch")


class TrainingInterrupted(Exception):
    """Raised by :meth:`Trainer.fit` after a stop signal (SIGTERM, SIGUSR1): the current step
    finished and ``checkpoint`` (last.pt, or None with ``train.checkpoint = false``) was written.
    ``exit_code`` = 128 + ``signum`` (the shell's convention: 143 for SIGTERM)."""

    def __init__(self, signum: int, checkpoint: Optional[Path], message: str):
        super().__init__(message)
        self.signum = int(signum)
        self.checkpoint = checkpoint

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


DEMO_PIXELS = 32   # side of the rendered demo scenes of ``data.path = "demo_pixels"``


def load_datasets(data_cfg) -> Tuple[PrecompDataset, PrecompDataset]:
    """(train, eval) datasets of a :class:`~fastrank.train.config.DataConfig`; ``path = "demo"``
    generates the demo data in memory (its splits are "train" and "test"), ``"demo_pixels"``
    the same scenes rendered as 32 x 32 images (flattened, (n, 3072): for the ``cnn`` encoder)."""
    cpi = data_cfg.captions_per_image
    if data_cfg.path in ("demo", "demo_pixels"):
        splits = make_demo(seed=data_cfg.demo_seed, n_train=data_cfg.demo_n_train,
                           n_test=data_cfg.demo_n_test, captions_per_image=cpi,
                           pixels=DEMO_PIXELS if data_cfg.path == "demo_pixels" else None)
        out = []
        for name in (data_cfg.train_split, data_cfg.eval_split):
            if name not in splits:
                raise ValueError(f"the demo data has splits {sorted(splits)}, not {name!r}")
            out.append(PrecompDataset.from_arrays(splits[name].images, splits[name].captions, cpi, split=name))
        return out[0], out[1]
    return (PrecompDataset(data_cfg.path, data_cfg.train_split, cpi),
            PrecompDataset(data_cfg.path, data_cfg.eval_split, cpi))


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


def epoch_batches(n_items: int, batch_size: int, seed: int, epoch: int, max_steps: int = 0) -> torch.Tensor:
    """(n_steps, batch_size) LongTensor: the global batches of epoch ``epoch`` (0-based), a
    permutation of range(n_items) seeded by (seed, epoch), the last incomplete batch dropped."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch) + 1)
    n_steps = n_items // batch_size
    if max_steps:
        n_steps = min(n_steps, max_steps)
    if n_steps < 1:
        raise ValueError(f"the training split has {n_items} captions, fewer than one batch of "
                         f"train.batch_size = {batch_size}")
    return torch.randperm(n_items, generator=g)[: n_steps * batch_size].view(n_steps, batch_size)


def model_from_checkpoint(ckpt: Dict, device="cpu") -> Tuple[VSE, Config, Optional[Vocab]]:
    """Rebuild the model of a trainer checkpoint (dict from ``load_checkpoint``; last.pt or
    best.pt): (model in eval mode on ``device``, its Config, its Vocab or None)."""
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"not a fastrank trainer checkpoint (format {ckpt.get('format')!r}, "
                              f"expected {CHECKPOINT_FORMAT!r})")
    cfg = Config.from_dict(ckpt["config"])
    vocab = Vocab(ckpt["vocab"]) if ckpt.get("vocab") is not None else None
    model = build_model(cfg.model, ckpt["img_dim"], vocab)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), cfg, vocab


def _fmt_metrics(m: Dict[str, float]) -> str:
    keys = [("rsum", "rsum"), ("i2t_r1", "i2t R@1"), ("t2i_r1", "t2i R@1"), ("i2t_ndcg", "i2t NDCG"),
            ("t2i_ndcg", "t2i NDCG"), ("rerank_rsum", "rerank rsum")]
    return " ".join(f"{label} {m[k]:.4g}" for k, label in keys if k in m)


class Trainer:
    """Train a VSE model with a fastrank loss (see the module docstring).

    Args:
        config: a :class:`~fastrank.train.config.Config`.
        resume: False (start fresh); True or ``"latest"``: continue from ``<out_dir>/last.pt``
            when it exists, else start fresh and log one line saying so; a path: continue
            from that checkpoint (CheckpointNotFoundError / CheckpointError naming it when it is
            missing or not a full trainer checkpoint). Restores model, optimizer, scheduler,
            scaler, RNG states, epoch, step inside the epoch, history and best; training then
            runs up to ``train.epochs``.
        data: optional (train, eval) :class:`~fastrank.data.PrecompDataset` pair, instead of
            loading ``config.data`` (the demo shares one pair between recipes).
        relevance: optional (train, eval) :class:`~fastrank.train.relevance_source.CaptionRelevance`
            pair (or Nones), instead of embedding the captions per ``config.relevance``.
        log: called with each log line (rank 0 only); default ``print``.

    Under ``torchrun`` (WORLD_SIZE > 1) the process group is initialised here (NCCL on
    CUDA, else gloo) unless it already is; ``train.batch_size`` is the global batch.
    """

    def __init__(self, config: Config, resume: Union[bool, str, os.PathLike] = False,
                 data: Optional[Tuple[PrecompDataset, PrecompDataset]] = None,
                 relevance: Optional[Tuple[Optional[CaptionRelevance], Optional[CaptionRelevance]]] = None,
                 log: Optional[Callable[[str], None]] = None):
        self.cfg = config.validate()
        tc = self.cfg.train
        self._owns_pg = False
        self._setup_distributed()
        self.is_main = self.rank == 0
        self._log = log if log is not None else print
        if tc.threads:
            torch.set_num_threads(tc.threads)
        self.device = self._pick_device(tc.device)
        if tc.batch_size % self.world_size:
            raise ValueError(f"train.batch_size ({tc.batch_size}) must be divisible by the world size "
                             f"({self.world_size})")
        self.local_batch = tc.batch_size // self.world_size
        seed_everything(tc.seed)

        self.train_ds, self.eval_ds = data if data is not None else load_datasets(self.cfg.data)
        self.vocab = (Vocab.build(self.train_ds.captions, self.cfg.data.vocab_min_count)
                      if self.cfg.model.text_encoder == "gru" else None)
        self.out_dir = Path(tc.out_dir)
        ckpt, self.resumed_from = None, None
        if resume is True or resume == "latest":
            latest = self.out_dir / "last.pt"
            if latest.is_file():
                self.resumed_from = latest
            else:
                self.log(f"--resume: no checkpoint {latest} yet; starting from scratch")
        elif resume:
            self.resumed_from = Path(resume)
        if self.resumed_from is not None:
            ckpt = load_checkpoint(self.resumed_from, format=CHECKPOINT_FORMAT)
            if ckpt.get("kind") != "full":
                raise CheckpointError(f"{self.resumed_from} holds only a model ({ckpt.get('kind')!r} "
                                      f"checkpoint, e.g. best.pt); resume from a last.pt")
            if ckpt.get("vocab") is not None:
                self.vocab = Vocab(ckpt["vocab"])
        self.img_dim = self.train_ds.feature_dim
        self.model = build_model(self.cfg.model, self.img_dim, self.vocab).to(self.device)

        lc = self.cfg.loss
        self.loss_fn = self._local_losses(CombinedLoss(lc.spec, lc.options))
        self.warmup_loss_fn = (self._local_losses(CombinedLoss(lc.warmup_spec, lc.warmup_options))
                               if lc.warmup_epochs else None)
        needs_rel = any(l.needs_relevance for l, _ in self.loss_fn.values()) or (
            self.warmup_loss_fn is not None and any(l.needs_relevance for l, _ in self.warmup_loss_fn.values()))
        rc = self.cfg.relevance
        if relevance is not None:
            self.train_rel, self.eval_rel = relevance
        else:
            self.train_rel = (self._rank0_first(lambda: CaptionRelevance.from_dataset(
                self.train_ds, rc.source, rc.model, rc.cache_dir)) if needs_rel and rc.source != "none" else None)
            self.eval_rel = None  # built on first graded evaluation
        if needs_rel and self.train_rel is None:
            raise ValueError(f"loss {lc.spec!r} needs relevance, but relevance.source is "
                             f"{rc.source!r}; use 'sbert' (or 'tfidf')")
        self._eval_rel_matrix = None
        self.memory = None
        if tc.memory_size:
            names = set(self.loss_fn) | set(self.warmup_loss_fn or {})
            if not names & set(MEMORY_TERMS):
                raise ValueError(f"train.memory_size = {tc.memory_size} needs a loss term among "
                                 f"{MEMORY_TERMS}; loss.spec is {lc.spec!r}")
            self.memory = CrossBatchMemory(tc.memory_size)

        oc = self.cfg.optim
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=oc.lr, weight_decay=oc.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(self.optimizer, sorted(oc.lr_milestones),
                                                              gamma=oc.lr_gamma)
        self.amp = bool(tc.amp) and self.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp)
        self.ddp = (torch.nn.parallel.DistributedDataParallel(
            self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            if self.world_size > 1 else None)

        self.epoch = 0                 # epochs completed
        self.step = 0                  # optimizer steps done in epoch self.epoch (0-based)
        self.best = -math.inf          # best eval.best_by so far
        self.history: List[Dict] = []  # one record per completed epoch
        self._epoch_sums: Optional[torch.Tensor] = None   # this rank's running loss sums of the epoch
        self._epoch_time = 0.0         # training seconds of the epoch before a resume
        self._stop_signal = 0          # set by the SIGTERM / SIGUSR1 handler
        self._last_save = time.monotonic()
        if ckpt is not None:
            self._restore(ckpt)

    # ------------------------------------------------------------------ setup
    def _setup_distributed(self) -> None:
        if dist.is_available() and not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend)
            self._owns_pg = True
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world_size = 0, 1

    def _rank0_first(self, fn: Callable):
        """Run fn on rank 0 first, then on the other ranks (which then hit the caption-embedding
        cache that rank 0 wrote instead of encoding the same captions W times)."""
        if self.world_size > 1 and not self.is_main:
            dist.barrier()
        out = fn()
        if self.world_size > 1 and self.is_main:
            dist.barrier()
        return out

    def _pick_device(self, name: str) -> torch.device:
        if name == "auto":
            if torch.cuda.is_available():
                return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            return torch.device("cpu")
        dev = torch.device(name)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"train.device = {name!r} but CUDA is not available")
        return dev

    def _local_losses(self, combined: CombinedLoss) -> Dict[str, Tuple[LocalLoss, float]]:
        """name -> (LocalLoss over the global batch, weight) for each term."""
        return {name: (LocalLoss(module, sim_fn=VSE.similarity), combined.weights[name])
                for name, module in combined.losses.items()}

    def log(self, msg: str) -> None:
        if self.is_main:
            self._log(msg)

    @property
    def module(self) -> VSE:
        """The (unwrapped) model."""
        return self.model

    # ------------------------------------------------------------------ training
    def _autocast(self):
        return torch.autocast("cuda", dtype=torch.float16) if self.amp else nullcontext()

    def train_epoch(self) -> Dict:
        """Train one epoch (``self.epoch``, 0-based) from step ``self.step`` (0, or where a
        resumed checkpoint stopped); returns {"loss", "loss_parts", "lr", "steps",
        "time_train"} with losses averaged over the epoch's steps (full global-batch values).
        May write mid-epoch checkpoints (``train.save_every_*``) and raise
        :class:`TrainingInterrupted` after a stop signal."""
        tc = self.cfg.train
        e = self.epoch
        terms = self.warmup_loss_fn if (self.warmup_loss_fn is not None and e < self.cfg.loss.warmup_epochs) \
            else self.loss_fn
        batches = epoch_batches(len(self.train_ds), tc.batch_size, tc.seed, e, tc.max_steps_per_epoch)
        n_steps, start = len(batches), self.step
        if start > n_steps:
            raise CheckpointError(f"the checkpoint is at step {start} of epoch {e + 1}, which has only "
                                  f"{n_steps} steps")
        lo = self.rank * self.local_batch
        local = batches[start:, lo:lo + self.local_batch]   # resume: skip the steps already done
        loader = torch.utils.data.DataLoader(
            self.train_ds, batch_sampler=local.tolist(), collate_fn=PrecompCollate(self.vocab),
            num_workers=self.cfg.data.num_workers, pin_memory=self.device.type == "cuda",
            # its own generator: creating the iterator must not draw from the global RNG
            generator=torch.Generator().manual_seed(int(tc.seed) * 1_000_003 + e + 7))
        lr = self.optimizer.param_groups[0]["lr"]
        c2i = self.train_ds.caption_to_image
        net = self.ddp if self.ddp is not None else self.model
        self.model.train()
        if self._epoch_sums is None:
            self._epoch_sums = torch.zeros(1 + len(terms), dtype=torch.float64, device=self.device)
        sums = self._epoch_sums = self._epoch_sums.to(self.device)
        t0 = time.time()
        bar = loader
        if tc.progress and self.is_main:
            from tqdm.auto import tqdm
            bar = tqdm(loader, desc=f"epoch {e + 1}/{tc.epochs}", leave=False, dynamic_ncols=True,
                       initial=start, total=n_steps)
        for step, batch in enumerate(bar, start):
            g = batches[step]
            img_index = c2i[g]
            positives = (img_index[:, None] == img_index[None, :]).to(self.device)
            rel = None
            if any(l.needs_relevance for l, _ in terms.values()):
                rel = self.train_rel.matrix(img_index, g).to(self.device)
            images = batch.images.to(self.device, non_blocking=True)
            img_len = batch.image_lengths.to(self.device) if batch.image_lengths is not None else None
            caps = batch.captions.to(self.device, non_blocking=True) if torch.is_tensor(batch.captions) \
                else batch.captions
            ids = img_index.to(self.device)
            inputs = (images, caps, img_len, batch.caption_lengths)
            self.optimizer.zero_grad(set_to_none=True)
            if tc.cache_chunk:
                total, parts, img_emb, txt_emb = self._cached_backward(net, terms, inputs, rel, positives, ids)
            else:
                with self._autocast():
                    out = net(*inputs)
                    img_emb, txt_emb = out.img_emb, out.txt_emb
                    total, parts = self._loss_terms(terms, img_emb, txt_emb, rel, positives, ids)
                self.scaler.scale(total * self.world_size if self.ddp is not None else total).backward()
            if self.cfg.optim.grad_clip > 0:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.memory is not None:   # after the loss: the memory holds past batches only
                self.memory.enqueue(img_emb, txt_emb, ids)
            sums += torch.stack([total.detach()] + parts).double()   # stays on the device: no sync
            self.step = step + 1
            if bar is not loader and step % 10 == 0:
                bar.set_postfix(loss=f"{float(sums[0]) / (step + 1) * self.world_size:.4f}")
            self._after_step(n_steps, t0)
        if bar is not loader:
            bar.close()
        if self.world_size > 1:   # each rank holds its share; the sum is the global-batch loss
            sums = sums.clone()
            dist.all_reduce(sums)
        sums = sums.cpu() / n_steps
        time_train = self._epoch_time + time.time() - t0
        self.scheduler.step()
        self.epoch += 1
        self.step, self._epoch_sums, self._epoch_time = 0, None, 0.0
        return {"epoch": self.epoch, "loss": float(sums[0]),
                "loss_parts": {n: float(v) for n, v in zip(terms, sums[1:])},
                "lr": lr, "steps": n_steps, "time_train": time_train}

    def _loss_terms(self, terms, img_emb, txt_emb, rel, positives, ids):
        """(weighted total, [term values]) of this rank's share of the global-batch loss; the
        terms of :data:`~fastrank.train.cross_batch.MEMORY_TERMS` also rank the memory."""
        total, parts = None, []
        for name, (local_loss, w) in terms.items():
            if self.memory is not None and name in MEMORY_TERMS:
                v = self.memory.loss(local_loss, img_emb, txt_emb, ids, self.rank)
            else:
                v = local_loss(img_emb, txt_emb, relevance=rel, positives=positives)
            parts.append(v.detach())
            total = w * v if total is None else total + w * v
        return total, parts

    def _cached_backward(self, net, terms, inputs, rel, positives, ids):
        """The gradient-cached forward and backward of one step (``train.cache_chunk``; see
        :mod:`fastrank.train.grad_cache`): embed this rank's batch in chunks without a graph,
        the loss on all embeddings back to them, then each chunk again (its RNG replayed) with
        the cached gradient; under DDP the all-reduce runs in the last chunk only."""
        def embed_with(model):
            def embed(images, caps, img_len, cap_len):
                with self._autocast():
                    out = model(images, caps, img_len, cap_len)
                return out.img_emb, out.txt_emb
            return embed

        def loss_fn(img_emb, txt_emb):
            with self._autocast():
                total, parts = self._loss_terms(terms, img_emb, txt_emb, rel, positives, ids)
            return self.scaler.scale(total * self.world_size if self.ddp is not None else total), total, parts

        (_, total, parts), (img_emb, txt_emb) = cached_step(
            embed_with(self.model), inputs, self.cfg.train.cache_chunk, loss_fn,
            replay_embed=embed_with(net), no_sync=self.ddp.no_sync if self.ddp is not None else None,
            module=self.model)
        return total.detach(), parts, img_emb, txt_emb

    # ------------------------------------------------------------------ stopping and saving
    def _agreed(self, stop: int, timed: bool) -> Tuple[int, bool]:
        """(stop signal, time-triggered save) agreed by all ranks (max over ranks)."""
        if self.world_size == 1:
            return stop, timed
        flags = torch.tensor([stop, int(timed)], dtype=torch.int64, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, timed = flags.tolist()
        return int(stop), bool(timed)

    def _after_step(self, n_steps: int, t0: float) -> None:
        """After each optimizer step: stop on a signal (save, raise), or write the mid-epoch
        checkpoint when ``train.save_every_*`` says so."""
        tc = self.cfg.train
        timed = (self.is_main and tc.checkpoint and tc.save_every_minutes > 0
                 and time.monotonic() - self._last_save >= tc.save_every_minutes * 60)
        stop, timed = self._agreed(self._stop_signal, timed)
        if stop:
            self._epoch_time += time.time() - t0
            self._stop(stop, n_steps)
        every = tc.save_every_steps
        if tc.checkpoint and self.step < n_steps and (timed or (every and self.step % every == 0)):
            self._epoch_time += time.time() - t0
            self._save_last()
            self._epoch_time -= time.time() - t0   # the epoch's clock keeps running from t0

    def _stop(self, signum: int, n_steps: Optional[int] = None) -> None:
        """Write last.pt (when checkpoints are on), log one line, raise TrainingInterrupted."""
        path = self._save_last() if self.cfg.train.checkpoint else None
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        where = (f"epoch {self.epoch + 1}, step {self.step}/{n_steps}" if n_steps is not None
                 else f"the end of epoch {self.epoch}")
        saved = f"wrote {path}; continue with --resume" if path is not None else \
            "no checkpoint written (train.checkpoint = false)"
        msg = f"stopped by {name} at {where}: {saved} (exit status {128 + signum})"
        self.log(msg)
        raise TrainingInterrupted(signum, path, msg)

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = int(signum)

    def _install_signal_handlers(self) -> Dict:
        """SIGTERM / SIGUSR1 -> set the stop flag (main thread only); returns the old handlers."""
        old = {}
        if threading.current_thread() is not threading.main_thread():
            return old
        for name in STOP_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                old[sig] = signal.signal(sig, self._on_signal)
        return old

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def similarity(self, dataset: Optional[PrecompDataset] = None) -> torch.Tensor:
        """(n_images, n_captions) float32 similarity of a dataset (default: the eval split)."""
        ds = dataset if dataset is not None else self.eval_ds
        bs = self.cfg.eval.batch_size
        with self._autocast():
            img = self.model.encode_images(ds.images, batch_size=bs)
            txt = self.model.encode_texts(ds.captions, batch_size=bs)
        return VSE.similarity(img.float(), txt.float())   # float32 scores: no fp16 ties

    def eval_relevance(self) -> Optional[torch.Tensor]:
        """(n_images, n_captions) relevance of the eval split (cached), or None without a source."""
        if self._eval_rel_matrix is None:
            if self.eval_rel is None and self.cfg.relevance.source != "none":
                rc = self.cfg.relevance
                self.eval_rel = CaptionRelevance.from_dataset(self.eval_ds, rc.source, rc.model, rc.cache_dir)
            if self.eval_rel is not None:
                self._eval_rel_matrix = self.eval_rel.full()
        return self._eval_rel_matrix

    def evaluate(self, graded: Optional[bool] = None, rerank=False, sim: Optional[torch.Tensor] = None) -> Dict[str, float]:
        """``fastrank.metrics.evaluate`` on the eval split: a flat dict of floats (docs/spec.md §5 keys).
        graded: include NDCG / tau / CS@K (default ``eval.graded``; needs a relevance source).
        rerank: False, True or a dict of ``fast_rerank`` arguments. sim: reuse a similarity."""
        from ..metrics.evaluate import evaluate
        ec = self.cfg.eval
        graded = ec.graded if graded is None else graded
        if sim is None:
            sim = self.similarity()
        rel = self.eval_relevance() if graded else None
        res = evaluate(sim, self.eval_ds.caption_to_image.to(sim.device),
                       rel.to(sim.device) if rel is not None else None,
                       ks=tuple(ec.ks), cs_k=tuple(ec.cs_k), rerank=rerank or None)
        return {k: float(v) for k, v in res.items()}

    def _end_of_epoch(self, record: Dict) -> Dict:
        ec, tc = self.cfg.eval, self.cfg.train
        last = self.epoch >= tc.epochs
        if self.is_main and ((ec.every and self.epoch % ec.every == 0) or last):
            t0 = time.time()
            sim = self.similarity()
            record.update(self.evaluate(sim=sim))
            if ec.rerank:
                try:
                    record.update({f"rerank_{k}": v for k, v in self.evaluate(rerank=True, sim=sim).items()})
                except NotImplementedError as err:
                    self.log(f"  (re-ranked evaluation skipped: {err})")
            record["time_eval"] = time.time() - t0
        is_best = False
        if self.is_main and ec.best_by in record and record[ec.best_by] > self.best:
            self.best, is_best = record[ec.best_by], True
        record["best"] = is_best
        self.history.append(record)
        if self.is_main:
            self._append_metrics(record)
        if self.cfg.train.checkpoint:
            self._save_last()
            if is_best and self.is_main:
                save_atomic(self.model_state_dict(), self.out_dir / "best.pt")
        if self.is_main:
            parts = " ".join(f"{k} {v:.4f}" for k, v in record["loss_parts"].items())
            self.log(f"epoch {self.epoch}/{tc.epochs} loss {record['loss']:.4f} ({parts}) "
                     f"lr {record['lr']:.2e} | {_fmt_metrics(record)}{' *' if is_best else ''} | "
                     f"{record['time_train']:.1f}s train" +
                     (f", {record['time_eval']:.1f}s eval" if "time_eval" in record else ""))
        if self.world_size > 1:
            dist.barrier()
        return record

    def fit(self) -> List[Dict]:
        """Train up to ``train.epochs`` (from the resumed epoch and step); returns the history
        (one record per epoch: loss, loss parts, lr, times, and the metrics when evaluated).
        Raises :class:`TrainingInterrupted` after SIGTERM / SIGUSR1 (last.pt written)."""
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2))
            # exactly the lines of the epochs the state has seen: a resumed run drops the lines
            # a stopped run wrote after its checkpoint, and never duplicates one
            path = self.out_dir / "metrics.jsonl"
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.history))
            os.replace(tmp, path)
        self._last_save = time.monotonic()
        old = self._install_signal_handlers()
        try:
            while self.epoch < self.cfg.train.epochs:
                self._end_of_epoch(self.train_epoch())
                stop, _ = self._agreed(self._stop_signal, False)
                if stop and self.epoch < self.cfg.train.epochs:
                    self._stop(stop)   # last.pt of this epoch's end is written
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        return self.history

    def close(self, orderly: bool = True, exit_code: Optional[int] = None) -> None:
        """Destroy the process group if this trainer created it. orderly (every rank got here:
        training ended or stopped on an agreed signal): after a barrier, since a rank tearing
        the group down while another still talks to it can hang. Not orderly (an error on this
        rank, the others may be inside a collective): leave it to the process exit.

        exit_code (what ``fastrank train`` passes under torchrun): when this trainer owns a
        group of more than one process and the end is orderly, end the process right after the
        barrier with this code, flushing stdout and stderr, instead of tearing the group down.
        With torch 2.13 the last reference to a gloo group (the DDP reducer's, dropped when the
        trainer is freed) joins gloo's worker threads while holding the GIL, and a worker still
        releasing a collective needs the GIL: the process can hang for ever after its work is
        done (seen in CI, a loaded 2-core machine; ``tests/_gloo.py`` has the stacks).
        Past the barrier every rank has written all it writes, so nothing is lost.

        Without exit_code (a script that goes on after training) the group is destroyed after
        the barrier and a 0.1 s sleep, which releases the GIL so that a worker thread still
        freeing a finished collective (what the stacks showed) can take it first. That narrows
        the window; only exiting closes it."""
        if self._owns_pg and dist.is_initialized():
            if orderly:
                if self.world_size > 1:
                    dist.barrier()
                    if exit_code is not None:
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(exit_code)
                    time.sleep(0.1)
                dist.destroy_process_group()
            self._owns_pg = False

    # ------------------------------------------------------------------ checkpoints
    def model_state_dict(self) -> Dict:
        """What ``best.pt`` holds: the model, its config, vocabulary and input size (all that
        evaluation and export need, a third of last.pt), plus the epoch and its metrics."""
        return {
            "format": CHECKPOINT_FORMAT,
            "kind": "model",
            "config": self.cfg.to_dict(),
            "vocab": self.vocab.itos[len(Vocab.SPECIALS):] if self.vocab is not None else None,
            "img_dim": self.img_dim,
            "model": self.model.state_dict(),
            "epoch": self.epoch,
            "metrics": copy.deepcopy(self.history[-1]) if self.history else None,
        }

    def state_dict(self, epoch_sums: Optional[torch.Tensor] = None) -> Dict:
        """The full training state (what ``last.pt`` holds): :meth:`model_state_dict` plus
        optimizer, scheduler, grad scaler, epoch, step inside the epoch, the epoch's running
        loss sums (one row per rank: ``epoch_sums``, default this rank's), its training time,
        best, history and RNG states. Plain types and tensors only."""
        if epoch_sums is None and self._epoch_sums is not None:
            epoch_sums = self._epoch_sums.detach().cpu()[None]
        state = self.model_state_dict()
        state.update({
            "kind": "full",
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "epoch_sums": epoch_sums,
            "epoch_time": self._epoch_time,
            "world_size": self.world_size,
            "n_train": len(self.train_ds),
            "best": self.best,
            "history": self.history,
            "rng": rng_state(self.device),
            "memory": self.memory.state_dict() if self.memory is not None else None,
        })
        del state["metrics"]
        return state

    def save(self, path) -> Path:
        """Write the full training state atomically (single process; under torchrun the trainer
        writes last.pt itself, from rank 0)."""
        return save_atomic(self.state_dict(), path)

    def _gathered_sums(self) -> Optional[torch.Tensor]:
        """(world_size, terms + 1) running loss sums of every rank, on every rank (a collective
        when the world size is > 1), or None outside an epoch."""
        if self._epoch_sums is None:
            return None
        local = self._epoch_sums.detach()
        if self.world_size == 1:
            return local.cpu()[None]
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return torch.stack(parts).cpu()

    def _save_last(self) -> Path:
        """Write last.pt from rank 0 (called by every rank: gathers the epoch's loss sums);
        with ``train.keep_checkpoints = K`` through ``epoch{E}_step{S}.pt``, keeping K of those."""
        sums = self._gathered_sums()
        last = self.out_dir / "last.pt"
        if self.is_main:
            state = self.state_dict(epoch_sums=sums)
            keep = self.cfg.train.keep_checkpoints
            if keep:
                named = save_atomic(state, self.out_dir / f"epoch{self.epoch:03d}_step{self.step:06d}.pt")
                link_atomic(named, last)
                for old in sorted(self.out_dir.glob("epoch*_step*.pt"))[:-keep]:
                    old.unlink(missing_ok=True)
            else:
                save_atomic(state, last)
        self._last_save = time.monotonic()
        return last

    def load_state_dict(self, state: Dict) -> None:
        """Restore what :meth:`state_dict` returned: model, optimizer, scheduler, scaler, epoch,
        step, the epoch's loss sums, best, history and RNG states (the loss and data may differ:
        the demo starts every recipe from one shared warm-up epoch this way)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.best = int(state["epoch"]), float(state["best"])
        self.step = int(state.get("step", 0))
        self._epoch_time = float(state.get("epoch_time", 0.0))
        sums = state.get("epoch_sums")
        if sums is None:
            self._epoch_sums = None
        elif sums.shape[0] == self.world_size:
            self._epoch_sums = sums[self.rank].clone().to(self.device)
        else:   # another world size: rank 0 carries the total (the epoch's mean loss is the same)
            self._epoch_sums = (sums.sum(0) if self.is_main else torch.zeros_like(sums[0])).to(self.device)
        self.history = copy.deepcopy(list(state["history"]))
        set_rng_state(state["rng"], self.device)
        if self.memory is not None:   # a checkpoint without one (memory off then): start empty
            self.memory = CrossBatchMemory(self.memory.capacity)
            if state.get("memory") is not None:
                try:
                    self.memory.load_state_dict(state["memory"])
                except ValueError as err:
                    raise CheckpointError(f"{self.resumed_from or 'the checkpoint'}: {err}") from None

    def _restore(self, ckpt: Dict) -> None:
        if int(ckpt.get("step", 0)):   # inside an epoch: the data order must be the same
            saved = ckpt["config"]["train"]
            diff = [f"train.{k} {saved[k]!r} -> {getattr(self.cfg.train, k)!r}" for k in _ORDER_KEYS
                    if saved.get(k) != getattr(self.cfg.train, k)]
            if ckpt.get("n_train") != len(self.train_ds):
                diff.append(f"training captions {ckpt.get('n_train')} -> {len(self.train_ds)}")
            if diff:
                raise CheckpointError(f"{self.resumed_from} stopped inside an epoch; resuming it needs the "
                                      f"same data order, but {', '.join(diff)}")
        self.load_state_dict(ckpt)
        at = f"epoch {self.epoch + 1}, step {self.step}" if self.step else f"the end of epoch {self.epoch}"
        self.log(f"resumed from {self.resumed_from} at {at}")

    def _append_metrics(self, record: Dict) -> None:
        with (self.out_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")


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
    from ..metrics.evaluate import evaluate
    ckpt = load_checkpoint(checkpoint, format=CHECKPOINT_FORMAT)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else torch.device(device)
    model, cfg, _ = model_from_checkpoint(ckpt, dev)
    dc = copy.deepcopy(cfg.data)
    if data is not None:
        dc.path = data
    if split is not None:
        dc.eval_split = split
    if dc.path in ("demo", "demo_pixels"):
        ds = load_datasets(dc)[1]
    else:
        ds = PrecompDataset(dc.path, dc.eval_split, dc.captions_per_image)
    source = relevance or cfg.relevance.source
    rel = None
    if graded and source != "none":
        rc = cfg.relevance
        rel = CaptionRelevance.from_dataset(ds, source, rc.model, rc.cache_dir).full()
    amp = dev.type == "cuda" and cfg.train.amp
    with torch.no_grad(), (torch.autocast("cuda", dtype=torch.float16) if amp else nullcontext()):
        img = model.encode_images(ds.images, batch_size=cfg.eval.batch_size)
        txt = model.encode_texts(ds.captions, batch_size=cfg.eval.batch_size)
    sim = VSE.similarity(img.float(), txt.float())
    ks, cs = tuple(cfg.eval.ks), tuple(cs_k if cs_k is not None else cfg.eval.cs_k)
    c2i = ds.caption_to_image.to(sim.device)
    rel = rel.to(sim.device) if rel is not None else None
    out = {k: float(v) for k, v in evaluate(sim, c2i, rel, ks=ks, cs_k=cs).items()}
    if rerank:
        rr = evaluate(sim, c2i, rel, ks=ks, cs_k=cs, rerank=rerank)
        out.update({f"rerank_{k}": float(v) for k, v in rr.items()})
    return out
