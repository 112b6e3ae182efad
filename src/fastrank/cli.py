"""The ``fastrank`` command line: ``fastrank info | check | train | eval | demo | extract``.

``python -m fastrank ...`` is the same command. Subcommands other than ``info`` live
in their modules (fastrank.check, fastrank.train, fastrank.extract) and are imported only
when used, so ``fastrank info`` stays fast.
"""
from __future__ import annotations

import argparse
import platform
import re
import sys
from pathlib import Path
from typing import List, Optional

from . import _cli_args as A


def info() -> dict:
    """Everything `fastrank info` prints: the backends and the versions around them."""
    import torch

    from . import backends

    out = dict(backends())
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["torch_cuda_available"] = torch.cuda.is_available()
    out["python"] = platform.python_version()
    out["platform"] = platform.platform()
    if torch.cuda.is_available():
        out["cuda_device"] = torch.cuda.get_device_name(0)
    return out


def _cmd_info(args) -> int:
    width = 22
    for k, v in info().items():
        print(f"{k:<{width}} {v}")
    return 0


def _native_ops():
    from .ops.registry import NATIVE_OPS
    return list(NATIVE_OPS)


def _cmd_check(args) -> int:
    from .check import run
    return run(args.device, args.ops)


def _add_check(sub) -> None:
    p = sub.add_parser("check", help="every native op against the pure-PyTorch reference on this machine's devices",
                       description="Run every native op on every device there (the CPU at each instruction-set "
                                   "level it runs; each CUDA device, under each version of the CUDA kernels) "
                                   "against the pure-PyTorch reference on small inputs: float32, float64, "
                                   "bfloat16, values and gradients. One line per case, a summary line; exit "
                                   "status 1 when a case fails. Run it after installing on a new machine.")
    p.add_argument("--device", default="auto", type=A.device,
                   help="auto (the CPU and every CUDA device), cpu, cuda, cuda:N [auto]")
    p.add_argument("--ops", type=A.csv(choices=_native_ops), default=None,
                   help="the ops to check, comma-separated [every native op]")
    p.set_defaults(func=_cmd_check)


def _cmd_extract(args) -> int:
    from .data.image_captions import read_image_captions
    from .extract import plan_extraction, run_extraction
    split = ",".join(args.split) if args.split else None
    with A.usage_errors("fastrank extract"):   # the data file and the output folder's state
        items = read_image_captions(args.data, args.images, split, args.captions_per_image)
        name = args.name or (split.replace(",", "+") if split else "train")
        plan = plan_extraction(items, args.out, name, args.backbone, features=args.features,
                               batch_size=args.batch_size, chunk_size=args.chunk_size, dtype=args.dtype,
                               workers=args.workers, max_chunks=args.max_chunks)
    done = run_extraction(plan, device=args.device, progress=not args.no_progress)
    return 0 if done is not None else 3


_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def _backbone(text: str) -> str:
    """A transformers model: a folder that exists, or a hub name (``name`` or ``org/name``)."""
    if not Path(text).exists() and not _HUB_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"no such folder {text!r}, and not a model name such as "
                                         f"microsoft/resnet-152")
    return text


def _karpathy_splits():
    from .data.image_captions import KARPATHY_SPLITS
    return KARPATHY_SPLITS


def _add_extract(sub) -> None:
    p = sub.add_parser("extract", help="run a vision backbone over images on disk -> precomp features",
                       description="Run a transformers vision backbone over the images of a Karpathy split "
                                   "JSON or a (path, caption) CSV and write <out>/<name>_ims.npy and "
                                   "<name>_caps.txt, the layout `fastrank train --data <out>` reads. "
                                   "Resumable: rerun the same command after an interruption.")
    p.add_argument("--data", required=True, type=A.existing_file,
                   help="dataset_coco.json / dataset_flickr30k.json, or a path,caption CSV")
    p.add_argument("--images", type=A.existing_dir,
                   help="image folder (required for a JSON; default for a CSV: its folder)")
    p.add_argument("--backbone", required=True, type=_backbone,
                   help="transformers vision model name or path (e.g. microsoft/resnet-152, "
                        "google/vit-base-patch16-224)")
    p.add_argument("--out", required=True, type=A.out_dir, help="output folder (the precomp dataset root)")
    p.add_argument("--split", type=A.csv(choices=_karpathy_splits),
                   help="Karpathy split(s): train, val, test, restval, or e.g. train,restval (JSON only)")
    p.add_argument("--name", type=A.name, help="output split name [the split, commas as '+'; 'train' for a CSV]")
    p.add_argument("--features", choices=("pooled", "grid"), default="pooled",
                   help="pooled: one vector per image (n, D); grid: token / grid features (n, T, D) [pooled]")
    p.add_argument("--captions-per-image", type=A.positive_int, default=5, help="captions kept per image [5]")
    p.add_argument("--batch-size", type=A.positive_int, default=32, help="images per forward pass [32]")
    p.add_argument("--chunk-size", type=A.positive_int, default=1024, help="images per resumable chunk [1024]")
    p.add_argument("--device", default="auto", type=A.device, help="auto, cpu, cuda, cuda:N [auto]")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="stored dtype [float32]")
    p.add_argument("--workers", type=A.nonnegative_int, default=0, help="image loading processes [0]")
    p.add_argument("--max-chunks", type=A.nonnegative_int, default=None,
                   help="stop after this many new chunks (exit status 3); rerun to continue")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_extract)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand; a user's mistake is one line and exit status 2
    (fastrank._cli_args, the rule of every command)."""
    p = A.Parser(prog="fastrank", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="what was built and what can run; torch, CUDA, compiler versions")
    _add_check(sub)
    try:
        from .train import cli as train_cli
    except ImportError:  # the training stack is optional at import time
        train_cli = None
    if train_cli is not None:
        train_cli.add_subcommands(sub)
    _add_extract(sub)
    return p


@A.command
def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "info":
        return _cmd_info(args)
    if getattr(args, "device", None):
        with A.usage_errors(f"fastrank {args.command}"):
            A.check_cuda(args.device)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
