"""The reference trainer (``fastrank train``), evaluation (``fastrank eval``) and the demo
(``fastrank demo``).

- :class:`Trainer` (``fastrank.train.loop``): VSE model + ``CombinedLoss`` with AdamW, step
  decay, clipping, AMP on CUDA, evaluation every epoch, atomic mid-epoch checkpoints (loadable
  with ``weights_only=True``), exact ``--resume``, a clean stop on SIGTERM / SIGUSR1,
  data parallel under ``torchrun`` via ``fastrank.distributed.LocalLoss``. Its parts:
  ``build`` (datasets, model, seeds), ``state`` (training state, last.pt / best.pt, resume),
  ``evaluation`` (:func:`evaluate_checkpoint` and the trainer's evaluation: one
  ``encode_split``), ``signals`` (SIGTERM / SIGUSR1), ``loop`` (setup and the loop).
- :class:`Config` / :func:`load_config` (``fastrank.train.config``): TOML + flag overrides.
- :func:`run_demo` (``fastrank.train.demo``): the seed recipes of the five papers side by side.
"""
from .config import (Config, DataConfig, EvalConfig, LossConfig, ModelConfig, OptimConfig,
                     RelevanceConfig, TrainConfig, load_config, parse_override)
from .checkpoint import CheckpointError, CheckpointNotFoundError, load_checkpoint, save_atomic
from .relevance_source import CaptionRelevance, embed_captions
from .build import build_model, load_datasets
from .evaluation import evaluate_checkpoint
from .loop import Trainer, epoch_batches
from .signals import TrainingInterrupted
from .state import model_from_checkpoint

__all__ = ["Config", "DataConfig", "EvalConfig", "LossConfig", "ModelConfig", "OptimConfig",
           "RelevanceConfig", "TrainConfig", "load_config", "parse_override", "load_checkpoint",
           "save_atomic", "CheckpointError", "CheckpointNotFoundError", "TrainingInterrupted",
           "CaptionRelevance", "embed_captions", "Trainer", "build_model",
           "epoch_batches", "evaluate_checkpoint", "load_datasets", "model_from_checkpoint", "run_demo"]


def __getattr__(name):
    if name == "run_demo":  # matplotlib and the recipes load on first use
        from .demo import run_demo
        return run_demo
    raise AttributeError(f"module 'fastrank.train' has no attribute {name!r}")
