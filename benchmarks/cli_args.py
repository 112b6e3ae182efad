"""The rule of every command for a user's mistake, as ``A``: fastrank's src/fastrank/_cli_args.py
(one line ``<command>: error: ...``, exit status 2, before any work; the argument types).

Loaded from the checkout these benchmarks are part of (``src/fastrank/``, or ``fastrank/``
beside ``benchmarks/``), by its file: ``import fastrank._cli_args`` would import fastrank
before subject.py has chosen which fastrank the run measures, and the one measured may be an
installed one from before the file existed. It needs nothing but the standard library.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[1]
_NAME = "benchmarks._fastrank_cli_args"


def _load():
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    for package in (_CHECKOUT / "src" / "fastrank", _CHECKOUT / "fastrank"):
        path = package / "_cli_args.py"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(_NAME, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[_NAME] = module
            spec.loader.exec_module(module)
            return module
    raise ImportError(f"no src/fastrank/_cli_args.py in the checkout {_CHECKOUT}")


A = _load()
