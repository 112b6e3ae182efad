"""The reference trainer's loop: a VSE model, a ``CombinedLoss`` over each global batch, AdamW
with step decay, gradient clipping, AMP on CUDA, evaluation every epoch, atomic checkpoints with
exact resume, and data parallelism over ``torchrun`` ranks. :class:`Trainer` joins parts that
each have a file: what a run is built from (:mod:`fastrank.train.build`), its state and
checkpoints (:mod:`fastrank.train.state`: the files in ``train.out_dir``, exact resume),
evaluation (:mod:`fastrank.train.evaluation`, shared with ``fastrank eval``) and stop signals
(:mod:`fastrank.train.signals`); this file holds the setup and the loop.

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
embeddings (see :mod:`fastrank.train.relevance_source`); with ``relevance.topk = K``, each
image's K best captions as a ``fastrank.TopKRelevance`` (smooth-NDCG and Kendall take it as
it is, kendall_sw and ladder its matrix).

Large batches. ``train.cache_chunk = C`` computes each step with gradient caching
(:mod:`fastrank.train.grad_cache`): each rank embeds its batch C pairs at a time without a
graph, every loss term runs on all the embeddings and back-propagates to them, then each chunk
is embedded again under its replayed RNG state and the cached gradient flows into the
parameters (DDP's ``no_sync`` for every chunk but the last). The gradient is the full-batch one
(batch norm sees chunk statistics). ``train.memory_size = K`` adds a cross-batch memory
(:mod:`fastrank.train.cross_batch`): the triplet, Smooth-AP and Recall@k terms also rank the
last K image / caption embeddings of past global batches; it is the same on every rank and
stored in last.pt. See ``docs/training-at-scale.md``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from ..data import PrecompCollate, PrecompDataset, Vocab
from ..distributed import LocalLoss
from ..models import VSE
from ..nn import CombinedLoss
from ..topk import TopKRelevance
from .build import DEMO_PIXELS, autocast, build_model, load_datasets, seed_everything
from .checkpoint import CheckpointError, save_atomic
from .config import Config
from .cross_batch import MEMORY_TERMS, CrossBatchMemory
from .evaluation import Evaluation, evaluate_checkpoint, format_metrics
from .grad_cache import cached_step
from .relevance_source import CaptionRelevance, takes_topk
from .signals import STOP_SIGNALS, StopSignals, TrainingInterrupted
from .state import CHECKPOINT_FORMAT, TrainingState, model_from_checkpoint

# the trainer and the pieces a run is made of, importable from this module too
__all__ = ["Trainer", "load_datasets", "build_model", "epoch_batches", "seed_everything",
           "model_from_checkpoint", "evaluate_checkpoint", "CHECKPOINT_FORMAT", "TrainingInterrupted",
           "STOP_SIGNALS", "DEMO_PIXELS"]


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


class Trainer(TrainingState, Evaluation, StopSignals):
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
        ckpt = self._open_resume(resume)
        if ckpt is not None and ckpt.get("vocab") is not None:
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
            self.train_rel = (self._rank0_first(lambda: CaptionRelevance.from_config(self.train_ds, rc))
                              if needs_rel and rc.source != "none" else None)
            self.eval_rel = None  # built on first graded evaluation
        if needs_rel and self.train_rel is None:
            raise ValueError(f"loss {lc.spec!r} needs relevance, but relevance.source is "
                             f"{rc.source!r}; use 'sbert' (or 'tfidf')")
        self._eval_rel_matrix = None
        self.memory = None
        if tc.memory_size:   # a term among MEMORY_TERMS: checked by config.validate()
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

        self._init_state()             # epoch, step, best, history, ... (fastrank.train.state)
        self._stop_signal = 0          # set by the SIGTERM / SIGUSR1 handler
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
        return autocast(self.amp)

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
                k = self.cfg.relevance.topk
                rel = (self.train_rel.topk(img_index, g, k) if k else self.train_rel.matrix(img_index, g))
                rel = rel.to(self.device)
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
        terms of :data:`~fastrank.train.cross_batch.MEMORY_TERMS` also rank the memory. A
        TopKRelevance ``rel`` goes as it is to the terms that take one, as its matrix to the
        others (``relevance.topk``)."""
        total, parts = None, []
        matrix = None   # a TopKRelevance's matrix, for the terms that take only a matrix
        for name, (local_loss, w) in terms.items():
            if self.memory is not None and name in MEMORY_TERMS:
                v = self.memory.loss(local_loss, img_emb, txt_emb, ids, self.rank)
            else:
                r = rel
                if isinstance(rel, TopKRelevance) and local_loss.needs_relevance and not takes_topk(name):
                    if matrix is None:
                        matrix = rel.to_dense()
                    r = matrix
                v = local_loss(img_emb, txt_emb, relevance=r, positives=positives)
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

    # ------------------------------------------------------------------ stopping, saving, evaluating
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

    def _end_of_epoch(self, record: Dict) -> Dict:
        ec, tc = self.cfg.eval, self.cfg.train
        last = self.epoch >= tc.epochs
        if self.is_main and ((ec.every and self.epoch % ec.every == 0) or last):
            t0 = time.time()
            record.update(self._epoch_metrics())
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
                     f"lr {record['lr']:.2e} | {format_metrics(record)}{' *' if is_best else ''} | "
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
            self._write_run_files()
        self._last_save = time.monotonic()
        with self._stop_signals_handled():
            while self.epoch < self.cfg.train.epochs:
                self._end_of_epoch(self.train_epoch())
                stop, _ = self._agreed(self._stop_signal, False)
                if stop and self.epoch < self.cfg.train.epochs:
                    self._stop(stop)   # last.pt of this epoch's end is written
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
