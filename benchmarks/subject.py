"""Which fastrank a run measures: one with its native module, or none at all.

A benchmark without its subject is worse than none: run from a checkout that was never
built (``pip install .`` builds the native modules into site-packages, not into the
source tree), ``python -m benchmarks`` would import the source tree's pure-Python
fastrank, report every native row as skipped and crash the cases that call a kernel.
So, before anything imports fastrank, :func:`choose` looks at the fastrank Python would
import (without importing it):

1. it has the native module of the device measured (``_C_cpu``, or ``_C_cuda`` for
   ``--device cuda``): it is measured;
2. it has none, and the fastrank Python finds when that folder is left out of
   ``sys.path`` (the installed one) has it: that one is measured, and the run says so;
3. otherwise the run stops with one line that says how to build the module.

:func:`confirm`, after the import, checks that the module really loads (a broken build
is reported with the loader's error).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import List, Optional

FIX = "build it: `pip install .` (then run `python -m benchmarks` or `make bench`), " \
      "or `python setup.py build_ext --inplace` in the checkout and run with PYTHONPATH=src"


def module_name(device_type: str) -> str:
    return "_C_cuda" if device_type == "cuda" else "_C_cpu"


def has_native(package_dir: Path, name: str) -> bool:
    """Whether ``package_dir`` holds an extension module ``name`` this Python can load."""
    return any((package_dir / (name + suffix)).is_file() for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def _package_dir(spec) -> Optional[Path]:
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in"):
        return Path(spec.origin).resolve().parent
    locations = list(spec.submodule_search_locations or [])
    return Path(locations[0]).resolve() if locations else None


def _same(entry: str, folder: Path) -> bool:
    try:
        return Path(entry or ".").resolve() == folder
    except OSError:
        return False


def choose(device_type: str, path: Optional[List[str]] = None) -> str:
    """Makes ``import fastrank`` give a fastrank with the native module for
    ``device_type`` (reordering ``path``, default ``sys.path``, when the first one found
    has none); returns the line that says which one. Raises SystemExit with one line when
    there is none."""
    path = sys.path if path is None else path
    name = module_name(device_type)
    loaded = sys.modules.get("fastrank")
    if loaded is not None:   # imported already (in-process use): it is the one measured
        first = Path(loaded.__file__).resolve().parent
        if not has_native(first, name):
            raise SystemExit(f"benchmarks: fastrank at {first} has no native module {name}; {FIX}")
        return f"measuring fastrank at {first} ({name})"
    first = _package_dir(importlib.util.find_spec("fastrank"))
    if first is None:
        raise SystemExit(f"benchmarks: fastrank is not importable; {FIX}")
    if has_native(first, name):
        return f"measuring fastrank at {first} ({name})"
    shadowing = [e for e in path if _same(e, first.parent)]
    others = [e for e in path if not _same(e, first.parent)]
    installed = _package_dir(importlib.machinery.PathFinder.find_spec("fastrank", others))
    if installed is None or not has_native(installed, name):
        where = f"; the installed one at {installed} has none either" if installed else ""
        raise SystemExit(f"benchmarks: fastrank at {first} has no native module {name}{where}; {FIX}")
    path[:] = others + shadowing   # the folder stays importable (benchmarks may live there), after the rest
    importlib.invalidate_caches()
    return (f"measuring the installed fastrank at {installed} ({name}): the one at {first} "
            f"has no native module")


def confirm(device_type: str) -> None:
    """After ``import fastrank``: its native module for ``device_type`` loads, or SystemExit."""
    import fastrank
    from fastrank import _native

    name = module_name(device_type)
    if (_native.cuda_module() if name == "_C_cuda" else _native.cpu_module()) is None:
        why = fastrank.backends().get(f"{name}_error", "not built")
        raise SystemExit(f"benchmarks: fastrank at {Path(fastrank.__file__).parent} cannot load "
                         f"{name} ({why}); {FIX}")
