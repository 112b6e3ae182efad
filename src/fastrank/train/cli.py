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

import json
import sys

from ..nn.combined import LOSS_NAMES

__all__ = ["add_subcommands"]

# flag -> config key (None value = not given)
_SHORTCUTS = [
    ("data", "data.path", str, "precomp dataset root, or 'demo'"),
    ("train_split", "data.train_split", str, "training split name"),
    ("eval_split", "data.eval_split", str, "evaluation split name"),
    ("out", "train.out_dir", str, "output directory (checkpoints, metrics.jsonl)"),
    ("loss", "loss.spec", str, "CombinedLoss spec, e.g. 'triplet:1.0,smooth_ndcg:1.0'; names: "
                               + ", ".join(LOSS_NAMES)),
    ("image_encoder", "model.image_encoder", str, "image encoder name (fastrank.models.IMAGE_ENCODERS)"),
    ("text_encoder", "model.text_encoder", str, "text encoder name (gru, sbert)"),
    ("embed_dim", "model.embed_dim", int, "joint embedding dimension"),
    ("relevance", "relevance.source", str, "relevance source: sbert, tfidf or none"),
    ("epochs", "train.epochs", int, "number of epochs"),
    ("batch_size", "train.batch_size", int, "global batch size"),
    ("lr", "optim.lr", float, "learning rate"),
    ("seed", "train.seed", int, "random seed"),
    ("device", "train.device", str, "auto, cpu, cuda, cuda:N"),
    ("workers", "data.num_workers", int, "DataLoader workers"),
    ("cache_chunk", "train.cache_chunk", int, "gradient caching: embed in chunks of this many pairs, "
                                              "then replay them with the cached gradient (0 = off)"),
    ("memory_size", "train.memory_size", int, "cross-batch memory: past embeddings per modality that "
                                              "triplet / smooth_ap / recall_at_k also rank (0 = off)"),
]


def _cmd_train(args) -> int:
    from .config import load_config
    from .loop import Trainer
    values = {key: getattr(args, dest) for dest, key, _, _ in _SHORTCUTS if getattr(args, dest) is not None}
    if args.rerank:
        values["eval.rerank"] = True
    if args.no_progress:
        values["train.progress"] = False
    from .checkpoint import CheckpointError
    from .signals import TrainingInterrupted
    cfg = load_config(args.config, args.set or (), **values)
    try:
        trainer = Trainer(cfg, resume=False if args.resume is None else args.resume)
    except CheckpointError as err:   # --resume PATH: missing or not a trainer checkpoint
        print(f"fastrank train: error: {err}", file=sys.stderr)
        return 2
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
    from .checkpoint import CheckpointError
    from .evaluation import evaluate_checkpoint
    try:
        res = evaluate_checkpoint(args.checkpoint, data=args.data, split=args.split, relevance=args.relevance,
                                  rerank=args.rerank, device=args.device, graded=not args.no_graded)
    except CheckpointError as err:
        print(f"fastrank eval: error: {err}", file=sys.stderr)
        return 2
    width = max(len(k) for k in res)
    for k, v in res.items():
        last = k.split("_")[-1]
        ranks = last in ("rsum", "medr", "meanr") or (last[:1] == "r" and last[1:].isdigit())   # R@K: percent
        print(f"{k:<{width}}  {v:.2f}" if ranks else f"{k:<{width}}  {v:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def _cmd_demo(args) -> int:
    from .demo import run_demo
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()] if args.recipes else None
    run_demo(out=args.out, quick=args.quick, device=args.device, seed=args.seed, epochs=args.epochs,
             recipes=recipes, progress=not args.no_progress, threads=args.threads or None)
    return 0


def add_subcommands(sub) -> None:
    """Add the ``train``, ``eval`` and ``demo`` subparsers to an argparse subparsers object;
    each sets ``func`` (called with the parsed args, returns the exit code)."""
    p = sub.add_parser("train", help="train a VSE model with fastrank losses (TOML config and/or flags)",
                       description="Train a VSE model. Settings come from --config (TOML), then --set "
                                   "overrides, then the shortcut flags. Under torchrun the job is data parallel.")
    p.add_argument("--config", "-c", help="TOML config file (see configs/ and fastrank.train.config)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override one config key (value parsed as TOML); repeatable")
    for dest, key, typ, text in _SHORTCUTS:
        p.add_argument("--" + dest.replace("_", "-"), dest=dest, type=typ, default=None, help=f"{text} [{key}]")
    p.add_argument("--rerank", action="store_true", help="also evaluate with fast re-ranking [eval.rerank]")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="PATH",
                   help="continue from <out>/last.pt (start from scratch, saying so, when there is none "
                        "yet), or from the checkpoint PATH. SIGTERM / SIGUSR1 stop after the current "
                        "step, write last.pt and exit with status 128 + signal (143 / 138)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="evaluate a checkpoint: every metric of fastrank.metrics.evaluate",
                       description="Print every metric of a trainer checkpoint on a split.")
    p.add_argument("--checkpoint", required=True, help="a last.pt / best.pt written by fastrank train")
    p.add_argument("--data", help="precomp dataset root or 'demo' (default: the checkpoint's)")
    p.add_argument("--split", help="split name (default: the checkpoint's eval split)")
    p.add_argument("--relevance", choices=("sbert", "tfidf", "none"),
                   help="relevance for the graded metrics (default: the checkpoint's source)")
    p.add_argument("--rerank", action="store_true", help="also the metrics after fast re-ranking (rerank_*)")
    p.add_argument("--no-graded", action="store_true", help="skip NDCG / tau / CS@K")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", help="also write the metrics to this JSON file")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("demo", help="train the papers' recipes side by side on the demo data and compare",
                       description="Train the seed recipes (VSE++ triplet, +smooth-NDCG, BCLS, ladder, top-k) "
                                   "on the built-in demo data and evaluate them with and without fast re-ranking.")
    p.add_argument("--out", default="demo_results", help="output directory [demo_results]")
    p.add_argument("--quick", action="store_true", help="tiny smoke version (< 1 min; TF-IDF relevance)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda")
    p.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recipes", help="comma-separated subset of: triplet, triplet+smooth_ndcg, bcls, ladder, topk, smooth_ap, "
                                                 "pixel_triplet, pixel_triplet+smooth_ndcg")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: 1 on CPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_demo)
