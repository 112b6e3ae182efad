"""Training configuration: nested dataclasses, loaded from TOML and overridden by flags.

A TOML file has one table per section (every key optional; the defaults are below)::

    [data]
    path = "data/coco_precomp"      # precomp root ({split}_ims.npy + {split}_caps.txt) or "demo"
    train_split = "train"
    eval_split = "dev"

    [model]
    image_encoder = "gpo"           # fastrank.models.IMAGE_ENCODERS
    text_encoder = "gru"            # fastrank.models.TEXT_ENCODERS ("gru" or "sbert")
    embed_dim = 1024
    [model.text_kw]
    word_dim = 300

    [loss]
    spec = "triplet:1.0,smooth_ndcg:1.0"   # fastrank.nn.CombinedLoss spec
    [loss.options.smooth_ndcg]
    tau = 0.01

    [relevance]
    source = "sbert"                # "sbert" | "tfidf" | "none"
    topk = 0                        # 0: dense; K: each image's K best captions, the rest 0

    [optim]
    lr = 5e-4
    lr_milestones = [15]            # step decay: lr *= lr_gamma at each of these epochs

    [train]
    epochs = 30
    batch_size = 128

    [eval]
    rerank = true

Flags override single keys: ``--set optim.lr=2e-4`` (the value is parsed as a TOML value, a
bare word is a string), plus shortcuts such as ``--lr`` and ``--epochs`` (see ``fastrank train -h``).
"""
from __future__ import annotations

import copy
import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

try:  # Python 3.11+
    import tomllib
except ImportError:  # pragma: no cover - Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["DataConfig", "ModelConfig", "LossConfig", "RelevanceConfig", "OptimConfig", "TrainConfig",
           "EvalConfig", "Config", "load_config", "check_value", "parse_override", "RELEVANCE_SOURCES"]

RELEVANCE_SOURCES = ("sbert", "tfidf", "none")


@dataclass
class DataConfig:
    """Where the data comes from.

    path: a precomp root (SCAN / VSE-infinity layout, see ``fastrank.data.PrecompDataset``) or
        ``"demo"``: the built-in demo data (``fastrank.data.make_demo``), generated in memory, or
        ``"demo_pixels"``: its scenes rendered as 32 x 32 images (for ``model.image_encoder = "cnn"``).
    train_split / eval_split: split names (files ``{split}_ims.npy``, ``{split}_caps.txt``); the
        demo has "train" and "test".
    vocab_min_count: words seen fewer times in the training captions map to ``<unk>`` (gru).
    demo_*: arguments of ``make_demo`` when path is "demo" or "demo_pixels".
    num_workers: DataLoader worker processes.
    """
    path: str = "demo"
    train_split: str = "train"
    eval_split: str = "test"
    captions_per_image: int = 5
    vocab_min_count: int = 1
    demo_seed: int = 0
    demo_n_train: int = 3000
    demo_n_test: int = 1000
    num_workers: int = 0


@dataclass
class ModelConfig:
    """``fastrank.models.build_vse(image_encoder, text_encoder, img_dim, embed_dim=...,
    image_kw=..., text_kw=...)``; img_dim is read from the data, the gru vocabulary is built
    from the training captions."""
    image_encoder: str = "fc_max"
    text_encoder: str = "gru"
    embed_dim: int = 1024
    image_kw: Dict[str, Any] = field(default_factory=dict)
    text_kw: Dict[str, Any] = field(default_factory=dict)


@dataclass
class LossConfig:
    """The training loss: ``fastrank.nn.CombinedLoss(spec, options)``.

    warmup_epochs: the first warmup_epochs epochs use ``CombinedLoss(warmup_spec,
    warmup_options)`` instead (VSE-infinity's warm-up: triplet summed over all negatives
    before hardest-negative mining). 0 disables it.
    """
    spec: str = "triplet:1.0"
    options: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    warmup_epochs: int = 0
    warmup_spec: str = "triplet:1.0"
    warmup_options: Dict[str, Dict[str, Any]] = field(
        default_factory=lambda: {"triplet": {"mining": "all"}})


@dataclass
class RelevanceConfig:
    """Where graded relevance comes from (docs/spec.md §4).

    source: ``"sbert"`` = (1 + cos) / 2 of sentence-transformers caption embeddings
        (``fastrank.relevance.CaptionEncoder``, cached on disk), an image's relevance to a
        caption being the max over the image's own captions and ground truth = 1;
        ``"tfidf"`` = the same with TF-IDF caption vectors (a cheap stand-in for tests and
        ``fastrank demo --quick``, not the papers' RSC); ``"none"`` = no relevance (losses
        that need it are refused; no graded metrics).
    model: sentence-transformers name or path ("" = the bundled all-MiniLM-L6-v2).
    cache_dir: embedding cache directory ("" = the CaptionEncoder default).
    topk: 0 (default) = the papers' dense relevance; K >= 1 = the training batch's relevance
        truncated to each image's K best captions, the rest 0 (``BatchRelevance.topk``: the
        image's own captions always kept, at relevance 1), given to the loss terms as a
        ``fastrank.TopKRelevance``: smooth-NDCG and Kendall then cost O(B * K) a list, not
        O(B^2) (docs/spec.md §2.1b, §4); kendall_sw and ladder, which take a matrix, get the
        truncated relevance as one. The evaluation's graded metrics keep the dense relevance.
    """
    source: str = "sbert"
    model: str = ""
    cache_dir: str = ""
    topk: int = 0


@dataclass
class OptimConfig:
    """AdamW(lr, weight_decay); step decay lr *= lr_gamma at each epoch in lr_milestones
    (``torch.optim.lr_scheduler.MultiStepLR``); gradient-norm clipping at grad_clip (0 = off)."""
    lr: float = 5e-4
    weight_decay: float = 1e-4
    lr_milestones: List[int] = field(default_factory=lambda: [15])
    lr_gamma: float = 0.1
    grad_clip: float = 2.0


@dataclass
class TrainConfig:
    """epochs: total epochs (resume continues up to this number). batch_size: the *global*
    batch (split over the ranks of a torchrun job; must be divisible by the world size).
    device: "auto" (the rank's CUDA device when available, else CPU), "cpu", "cuda", "cuda:1".
    amp: autocast (bfloat16 where supported, else float16 with a GradScaler) on CUDA only.
    max_steps_per_epoch: 0 = the whole training split (drop_last) each epoch.
    threads: torch CPU threads (0 = leave torch's default).
    checkpoint: write last.pt / best.pt (metrics.jsonl is always written).
    save_every_steps / save_every_minutes: also write last.pt inside an epoch, after every
        that many optimizer steps / once that many minutes have passed since the last write
        (0 = off; either one triggers). ``--resume`` continues from that step exactly.
    keep_checkpoints: also keep the last K checkpoints as ``epoch{E}_step{S}.pt`` (last.pt is
        a hard link to the newest; 0 = only last.pt).
    cache_chunk: gradient caching (``fastrank.train.grad_cache``): embed each rank's batch in
        chunks of this many pairs without a graph, compute the loss on all embeddings, then
        re-embed chunk by chunk and back-propagate the cached gradients (0 = off). Memory of the
        encoders' activations is that of one chunk; batch norm sees chunk statistics.
    memory_size: cross-batch memory (``fastrank.train.cross_batch``): the triplet, Smooth-AP and
        Recall@k terms also rank the last memory_size image / caption embeddings of past
        batches (0 = off). Stored in last.pt; the same on every rank.
    """
    epochs: int = 30
    batch_size: int = 128
    seed: int = 0
    device: str = "auto"
    amp: bool = True
    out_dir: str = "runs/fastrank"
    progress: bool = True
    max_steps_per_epoch: int = 0
    threads: int = 0
    checkpoint: bool = True
    save_every_steps: int = 0
    save_every_minutes: float = 10.0
    keep_checkpoints: int = 0
    cache_chunk: int = 0
    memory_size: int = 0


@dataclass
class EvalConfig:
    """Evaluation on data.eval_split every ``every`` epochs (0 = only after the last epoch)
    with ``fastrank.metrics.evaluate``. graded: also the graded metrics (NDCG, tau, CS@K) at
    every evaluation (needs a relevance source; they always run in ``fastrank eval``).
    rerank: also evaluate with fast re-ranking (DVSE), keys prefixed ``rerank_``.
    best_by: the key that selects ``best.pt`` (higher is better)."""
    every: int = 1
    graded: bool = True
    rerank: bool = False
    ks: List[int] = field(default_factory=lambda: [1, 5, 10])
    cs_k: List[int] = field(default_factory=lambda: [100])
    batch_size: int = 256
    best_by: str = "rsum"


@dataclass
class Config:
    """The whole training configuration (see the module docstring for the TOML format)."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    relevance: RelevanceConfig = field(default_factory=RelevanceConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> Dict[str, Any]:
        """Plain nested dict (JSON / TOML friendly)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Config":
        """Build from a nested dict (a parsed TOML file); unknown sections or keys raise
        ValueError naming them."""
        cfg = cls()
        cfg.update(d)
        return cfg

    def update(self, d: Mapping[str, Any]) -> "Config":
        """Merge a nested dict into this config (in place; returns self)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"config must be a table of sections, got {type(d).__name__}")
        for section, values in d.items():
            if section not in _SECTIONS:
                raise ValueError(f"unknown config section [{section}]; known: {sorted(_SECTIONS)}")
            if not isinstance(values, Mapping):
                raise ValueError(f"config section [{section}] must be a table, got {values!r}")
            for key, value in values.items():
                self.set(f"{section}.{key}", value)
        return self

    def set(self, dotted: str, value: Any) -> None:
        """Set one key ``"section.key"`` (for dict-valued keys also ``"section.key.sub..."``),
        checking the type against the field's declared type."""
        parts = dotted.split(".")
        if len(parts) < 2 or parts[0] not in _SECTIONS:
            raise ValueError(f"config key {dotted!r} must be 'section.key' with a section among "
                             f"{sorted(_SECTIONS)}")
        sec = getattr(self, parts[0])
        fields = {f.name: f for f in dataclasses.fields(sec)}
        if parts[1] not in fields:
            raise ValueError(f"unknown config key {parts[0]}.{parts[1]}; [{parts[0]}] has "
                             f"{sorted(fields)}")
        hint = _hints(type(sec))[parts[1]]
        if len(parts) > 2:  # into a dict-valued field: model.text_kw.word_dim = 300
            if _origin(hint) is not dict:
                raise ValueError(f"config key {'.'.join(parts[:2])} is not a table; cannot set {dotted}")
            target = getattr(sec, parts[1])
            for p in parts[2:-1]:
                target = target.setdefault(p, {})
                if not isinstance(target, dict):
                    raise ValueError(f"config key {dotted}: {p!r} is not a table")
            target[parts[-1]] = copy.deepcopy(value)
            return
        setattr(sec, parts[1], _coerce(value, hint, dotted))

    def validate(self) -> "Config":
        """Cheap consistency checks (ValueError naming the key)."""
        from .. import _validation as V
        V.check_choice(self.relevance.source, "relevance.source", RELEVANCE_SOURCES)
        V.check_int(self.relevance.topk, "relevance.topk", 0)
        V.check_int(self.train.epochs, "train.epochs")
        V.check_int(self.train.batch_size, "train.batch_size", 2)
        V.check_int(self.train.max_steps_per_epoch, "train.max_steps_per_epoch", 0)
        V.check_int(self.train.threads, "train.threads", 0)
        V.check_int(self.train.seed, "train.seed", 0)
        V.check_int(self.train.save_every_steps, "train.save_every_steps", 0)
        V.check_nonnegative(self.train.save_every_minutes, "train.save_every_minutes")
        V.check_int(self.train.keep_checkpoints, "train.keep_checkpoints", 0)
        V.check_int(self.train.cache_chunk, "train.cache_chunk", 0)
        V.check_int(self.train.memory_size, "train.memory_size", 0)
        V.check_int(self.eval.every, "eval.every", 0)
        V.check_int(self.eval.batch_size, "eval.batch_size")
        V.check_int(self.loss.warmup_epochs, "loss.warmup_epochs", 0)
        V.check_int(self.model.embed_dim, "model.embed_dim")
        V.check_int(self.data.captions_per_image, "data.captions_per_image")
        V.check_int(self.data.num_workers, "data.num_workers", 0)
        V.check_positive(self.optim.lr, "optim.lr")
        V.check_nonnegative(self.optim.weight_decay, "optim.weight_decay")
        V.check_positive(self.optim.lr_gamma, "optim.lr_gamma")
        V.check_nonnegative(self.optim.grad_clip, "optim.grad_clip")
        for m in self.optim.lr_milestones:
            V.check_int(m, "optim.lr_milestones[]")
        for k in list(self.eval.ks) + list(self.eval.cs_k):
            V.check_int(k, "eval.ks / eval.cs_k")
        self._check_names()
        return self

    def _check_names(self) -> None:
        """What the trainer looks up by name, checked without building a model or reading data:
        the device, the encoders, the loss terms and their options (and what they need)."""
        import torch

        from ..models import _registry
        from ..nn import CombinedLoss
        from .cross_batch import MEMORY_TERMS
        device = self.train.device
        try:
            if device != "auto":
                torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(f"train.device must be auto, cpu, cuda or cuda:N, got {device!r}") from None
        _registry.check_encoder_name("image", self.model.image_encoder)
        _registry.check_encoder_name("text", self.model.text_encoder)
        lc = self.loss
        terms = [("loss.spec", lc.spec, lc.options)]
        if lc.warmup_epochs:
            terms.append(("loss.warmup_spec", lc.warmup_spec, lc.warmup_options))
        names, needs_relevance = set(), False
        for key, spec, options in terms:
            try:
                combined = CombinedLoss(spec, options)
            except (TypeError, ValueError) as err:   # an unknown term, a bad weight or option
                raise type(err)(f"{key} = {spec!r}: {err}") from err
            names |= set(combined.losses)
            needs_relevance = needs_relevance or combined.needs_relevance
        if needs_relevance and self.relevance.source == "none":
            raise ValueError(f"loss.spec = {lc.spec!r} has a term that needs relevance, but relevance.source "
                             f"is 'none'; use 'sbert' (or 'tfidf')")
        if self.train.memory_size and not names & set(MEMORY_TERMS):
            raise ValueError(f"train.memory_size = {self.train.memory_size} needs a loss term among "
                             f"{MEMORY_TERMS}; loss.spec is {lc.spec!r}")


_SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _hints(cls) -> Dict[str, Any]:
    return typing.get_type_hints(cls)


def _origin(hint):
    o = typing.get_origin(hint)
    if o is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _origin(args[0]) if args else None
    return o if o is not None else hint


def _coerce(value, hint, key: str):
    """Check value against a field type (int, float, bool, str, List[int], Dict[...])."""
    o = _origin(hint)
    bad = ValueError(f"config key {key} expects {getattr(hint, '__name__', str(hint))}, got {value!r}")
    if o is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if o is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if o is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if o is str:
        if not isinstance(value, str):
            raise bad
        return value
    if o is list:
        if not isinstance(value, (list, tuple)):
            raise bad
        (item,) = typing.get_args(hint) or (object,)
        return [v if item is object else _coerce(v, item, key + "[]") for v in value]
    if o is dict:
        if not isinstance(value, Mapping):
            raise bad
        return copy.deepcopy(dict(value))
    return value


def parse_override(item: str):
    """``"section.key=value"`` -> (``"section.key"``, value). The value is parsed as TOML
    (``2e-4``, ``true``, ``[10, 20]``, ``{margin = 0.1}``, ``"text"``); anything TOML cannot
    parse is taken as a plain string (``--set data.path=/data/coco``)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"override {item!r} must look like section.key=value")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def check_value(key: str, value: Any) -> Any:
    """``value`` as the config key ``key`` holds it, checked as :meth:`Config.validate` checks
    a default config with that one key set (a ValueError / TypeError naming the key): what
    ``fastrank train``'s shortcut flags are parsed with."""
    cfg = Config()
    cfg.set(key, value)
    cfg.validate()
    section, name = key.split(".", 1)
    return getattr(getattr(cfg, section), name)


def load_config(path=None, overrides: Sequence[str] = (), **values) -> Config:
    """Config from an optional TOML file, then ``overrides`` ("section.key=value" strings),
    then ``values`` (``{"optim.lr": 2e-4}``-style keyword pairs, passed as a dict with
    dotted keys: ``load_config(None, **{"train.epochs": 2})``). Returns a validated Config."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        with path.open("rb") as f:
            try:
                cfg.update(tomllib.load(f))
            except tomllib.TOMLDecodeError as e:
                raise ValueError(f"{path}: invalid TOML: {e}") from None
    for item in overrides:
        cfg.set(*parse_override(item))
    for key, value in values.items():
        cfg.set(key, value)
    return cfg.validate()
