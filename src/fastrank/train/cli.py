"""``fastrank train | eval | demo`` (added to the ``fastrank`` parser by src/fastrank/cli.py).

    fastrank train --config configs/coco_vse_listwise.toml --out runs/coco
    fastrank train --data demo --loss "triplet:1.0,smooth_ndcg:1.0" --epochs 5 --set model.embed_dim=256
    fastrank train --config ... --out runs/coco --resume        # from runs/coco/last.pt if any
    fastrank train --config ... --out runs/coco --resume runs/coco/epoch003_step001200.pt
    torchrun --nproc_per_node 4 -m fastrank train --config ...     # data parallel
    fastrank eval --checkpoint runs/coco/best.pt --data data/coco_precomp --split testall
    fastrank demo [--quick] [--out demo_results]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import _cli_args as A
from ..nn.combined import LOSS_NAMES

__all__ = ["add_subcommands"]


def _data_path(text: str) -> str:
    """A precomp dataset folder, or one of the built-in demo data sets."""
    from .build import _DEMO_PATHS
    if text not in _DEMO_PATHS and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {text!r} (a precomp dataset root, or "
                                         f"{' / '.join(_DEMO_PATHS)})")
    return text


# flag -> config key (None value = not given); the type parses the text, then the value is
# checked as the config checks the key (_config_type)
_SHORTCUTS = [
    ("data", "data.path", _data_path, "precomp dataset root, or 'demo'"),
    ("train_split", "data.train_split", A.name, "training split name"),
    ("eval_split", "data.eval_split", A.name, "evaluation split name"),
    ("out", "train.out_dir", A.out_dir, "output directory (checkpoints, metrics.jsonl)"),
    ("loss", "loss.spec", str, "CombinedLoss spec, e.g. 'triplet:1.0,smooth_ndcg:1.0'; names: "
                               + ", ".join(LOSS_NAMES)),
    ("image_encoder", "model.image_encoder", str, "image encoder name (fastrank.models.IMAGE_ENCODERS)"),
    ("text_encoder", "model.text_encoder", str, "text encoder name (gru, sbert)"),
    ("embed_dim", "model.embed_dim", int, "joint embedding dimension"),
    ("relevance", "relevance.source", str, "relevance source: sbert, tfidf or none"),
    ("relevance_topk", "relevance.topk", int, "truncate the training relevance to each image's K best "
                                              "captions, the rest 0 (0 = the papers' dense relevance)"),
    ("epochs", "train.epochs", int, "number of epochs"),
    ("batch_size", "train.batch_size", int, "global batch size"),
    ("lr", "optim.lr", float, "learning rate"),
    ("seed", "train.seed", int, "random seed"),
    ("device", "train.device", A.device, "auto, cpu, cuda, cuda:N"),
    ("workers", "data.num_workers", int, "DataLoader workers"),
    ("cache_chunk", "train.cache_chunk", int, "gradient caching: embed in chunks of this many pairs, "
                                              "then replay them with the cached gradient (0 = off)"),
    ("memory_size", "train.memory_size", int, "cross-batch memory: past embeddings per modality that "
                                              "triplet / smooth_ap / recall_at_k also rank (0 = off)"),
]


def _config_type(key: str, parse):
    """The argparse type of the shortcut flag of config key ``key``: ``parse`` reads the text
    (str, int, float or an argument type of fastrank._cli_args), then the value is checked as
    ``Config.validate`` checks the key (config.check_value), so the error names the flag and the key."""
    from .config import check_value

    def config_value(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key} expects {parse.__name__}, got {text!r}") from None
        try:
            return check_value(key, str(value) if isinstance(value, Path) else value)
        except (ValueError, TypeError) as err:
            raise argparse.ArgumentTypeError(A.one_line(err)) from None
    config_value.__name__ = getattr(parse, "__name__", key)
    return config_value


def _override(text: str) -> str:
    """A --set item: ``section.key=value`` naming a config key, the value of its type (the
    checks across keys run when the whole config is loaded)."""
    from .config import Config, parse_override
    try:
        Config().set(*parse_override(text))
    except (ValueError, TypeError) as err:
        raise argparse.ArgumentTypeError(A.one_line(err)) from None
    return text


def _resume(text: str) -> str:
    """--resume PATH: "latest", or a checkpoint file that exists."""
    return text if text == "latest" else str(A.existing_file(text))


def _cmd_train(args) -> int:
    from .build import load_datasets
    from .config import load_config
    from .loop import Trainer
    values = {key: getattr(args, dest) for dest, key, _, _ in _SHORTCUTS if getattr(args, dest) is not None}
    if args.rerank:
        values["eval.rerank"] = True
    if args.no_progress:
        values["train.progress"] = False
    from .checkpoint import CheckpointError
    from .signals import TrainingInterrupted
    flags = {key: "--" + dest.replace("_", "-") for dest, key, _, _ in _SHORTCUTS if getattr(args, dest) is not None}
    with A.usage_errors("fastrank train", explain=A.naming(flags)):   # the config and the data it names
        cfg = load_config(args.config, args.set or (), **values)
        data = load_datasets(cfg.data)
        A.check_cuda(cfg.train.device, "train.device")
    try:
        trainer = Trainer(cfg, resume=False if args.resume is None else args.resume, data=data)
    except CheckpointError as err:   # --resume PATH: not a trainer checkpoint
        A.fail("fastrank train", err)
    code = None   # set when every rank ends here together (done, or stopped on an agreed signal)
    try:
        trainer.log(f"training {cfg.loss.spec} on {cfg.data.path} ({trainer.train_ds.n_captions} captions) "
                    f"-> {trainer.out_dir}; {trainer.world_size} process(es) on {trainer.device}")
        try:
            history = trainer.fit()
        except TrainingInterrupted as stop:   # SIGTERM / SIGUSR1: the trainer logged the line
            code = stop.exit_code
        else:
            if trainer.is_main and history:
                trainer.log(f"done: {trainer.epoch} epochs; best {cfg.eval.best_by} {trainer.best:.4g}; "
                            f"checkpoints and metrics.jsonl in {trainer.out_dir}")
            code = 0
    finally:
        # under torchrun the process ends inside close() with `code` (see Trainer.close)
        trainer.close(orderly=code is not None, exit_code=code)
    return code


def _cmd_eval(args) -> int:
    from .evaluation import checkpoint_split, evaluate_split
    explain = A.naming({"data.eval_split": "--split"} if args.split else {})
    with A.usage_errors("fastrank eval", explain=explain):   # the checkpoint and the split it names
        loaded = checkpoint_split(args.checkpoint, data=args.data, split=args.split, device=args.device)
    res = evaluate_split(*loaded, relevance=args.relevance, rerank=args.rerank, graded=not args.no_graded)
    width = max(len(k) for k in res)
    for k, v in res.items():
        last = k.split("_")[-1]
        ranks = last in ("rsum", "medr", "meanr") or (last[:1] == "r" and last[1:].isdigit())   # R@K: percent
        print(f"{k:<{width}}  {v:.2f}" if ranks else f"{k:<{width}}  {v:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def _demo_epochs(text: str) -> int:
    from .demo import MIN_EPOCHS
    return A.integer(MIN_EPOCHS)(text)


def _recipe_names():
    from .demo import RECIPES
    return [r.name for r in RECIPES]


def _cmd_demo(args) -> int:
    from .demo import run_demo
    run_demo(out=args.out, quick=args.quick, device=args.device, seed=args.seed, epochs=args.epochs,
             recipes=args.recipes, progress=not args.no_progress, threads=args.threads or None)
    return 0


def add_subcommands(sub) -> None:
    """Add the ``train``, ``eval`` and ``demo`` subparsers to an argparse subparsers object;
    each sets ``func`` (called with the parsed args, returns the exit code)."""
    p = sub.add_parser("train", help="train a VSE model with fastrank losses (TOML config and/or flags)",
                       description="Train a VSE model. Settings come from --config (TOML), then --set "
                                   "overrides, then the shortcut flags. Under torchrun the job is data parallel.")
    p.add_argument("--config", "-c", type=A.existing_file, help="TOML config file (see configs/ and fastrank.train.config)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", type=_override,
                   help="override one config key (value parsed as TOML); repeatable")
    for dest, key, typ, text in _SHORTCUTS:
        p.add_argument("--" + dest.replace("_", "-"), dest=dest, type=_config_type(key, typ), default=None,
                       help=f"{text} [{key}]")
    p.add_argument("--rerank", action="store_true", help="also evaluate with fast re-ranking [eval.rerank]")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="PATH", type=_resume,
                   help="continue from <out>/last.pt (start from scratch, saying so, when there is none "
                        "yet), or from the checkpoint PATH. SIGTERM / SIGUSR1 stop after the current "
                        "step, write last.pt and exit with status 128 + signal (143 / 138)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="evaluate a checkpoint: every metric of fastrank.metrics.evaluate",
                       description="Print every metric of a trainer checkpoint on a split.")
    p.add_argument("--checkpoint", required=True, type=A.existing_file,
                   help="a last.pt / best.pt written by fastrank train")
    p.add_argument("--data", type=_data_path, help="precomp dataset root or 'demo' (default: the checkpoint's)")
    p.add_argument("--split", type=A.name, help="split name (default: the checkpoint's eval split)")
    p.add_argument("--relevance", choices=("sbert", "tfidf", "none"),
                   help="relevance for the graded metrics (default: the checkpoint's source)")
    p.add_argument("--rerank", action="store_true", help="also the metrics after fast re-ranking (rerank_*)")
    p.add_argument("--no-graded", action="store_true", help="skip NDCG / tau / CS@K")
    p.add_argument("--device", default="auto", type=A.device, help="auto, cpu, cuda, cuda:N [auto]")
    p.add_argument("--json", type=A.out_file, help="also write the metrics to this JSON file")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("demo", help="train the papers' recipes side by side on the demo data and compare",
                       description="Train the seed recipes (VSE++ triplet, +smooth-NDCG, BCLS, ladder, top-k) "
                                   "on the built-in demo data and evaluate them with and without fast re-ranking.")
    p.add_argument("--out", default="demo_results", type=A.out_dir, help="output directory [demo_results]")
    p.add_argument("--quick", action="store_true", help="tiny smoke version (< 1 min; TF-IDF relevance)")
    p.add_argument("--device", default="auto", type=A.device, help="auto, cpu, cuda")
    p.add_argument("--epochs", type=_demo_epochs, default=None,
                   help="override the number of epochs (>= 2: the shared warm-up epoch and the recipe's)")
    p.add_argument("--seed", type=A.nonnegative_int, default=0)
    p.add_argument("--recipes", type=A.csv(choices=_recipe_names),
                   help="comma-separated subset of: triplet, triplet+smooth_ndcg, bcls, ladder, topk, smooth_ap, "
                        "pixel_triplet, pixel_triplet+smooth_ndcg")
    p.add_argument("--threads", type=A.nonnegative_int, default=0, help="torch CPU threads (default: 1 on CPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_demo)
