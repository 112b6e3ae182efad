"""The ``fastrank`` command line: ``fastrank info | train | eval | demo``.

``python -m fastrank ...`` is the same command. Subcommands other than ``info`` live
in fastrank.train and are imported only when used, so ``fastrank info`` stays fast.
"""
from __future__ import annotations

import argparse
import platform
import sys
from typing import List, Optional


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastrank", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="what was built and what can run; torch, CUDA, compiler versions")
    try:
        from .train import cli as train_cli
    except ImportError:  # the training stack is optional at import time
        train_cli = None
    if train_cli is not None:
        train_cli.add_subcommands(sub)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "info":
        return _cmd_info(args)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
