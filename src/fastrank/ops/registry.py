"""The table of fastrank's losses and ops: one row each, read by everything that lists them.

Each public module of ``fastrank.losses`` and ``fastrank.ops`` declares its rows next to what
they name, as ``ROWS`` (a tuple of :class:`Loss`, src/fastrank/ops/_row.py); this module
finds those modules and puts their rows in one table, in the order of their names. So a new
loss or op is one new module and touches no list. A row names the functional form
(``fastrank.<functional>``), the ``nn.Module`` form (``fastrank.nn.<Module>``), and, for an op
with native kernels (docs/spec.md §2, §3), its part of the contract
(src/fastrank/ops/_contract.py: example inputs, the calls of its ``torch.library`` custom ops,
bad inputs), declared in the op's own file next to its glue.

Read from here: ``fastrank.__all__`` and ``fastrank.nn.__all__``; :class:`fastrank.nn.CombinedLoss`'s
names (``combined``); the compat tables (``compat``: fastrank.compat.open_clip,
fastrank.compat.sentence_transformers); the benchmarks' ops (benchmarks/ops.py); the
emulated CUDA matrix's files (``cuda_matrix``, tests/test_emulated.py); and
tests/test_contract.py, which runs one contract over every native row (:data:`NATIVE_OPS`)
and fails on a custom op under ``fastrank::`` that no row lists, so a new op cannot skip it
(CONTRIBUTING.md, "Adding an op").
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Dict, Tuple

from .. import losses as _losses
from .. import ops as _ops
from ._contract import BadInput, Example, OpSample
from ._row import Loss

__all__ = ["Loss", "LOSSES", "NATIVE_OPS", "Example", "BadInput", "OpSample"]

# the packages whose public modules (no leading underscore) each declare ROWS
_PACKAGES = (_losses, _ops)


def _declared_rows(packages=_PACKAGES) -> Tuple[Loss, ...]:
    """The ROWS of every public module of ``packages``, imported here, in the order of their
    names (a module without ROWS is an error: a loss that no list would know)."""
    rows = []
    for package in packages:
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            name = info.name
            if name.rpartition(".")[2].startswith("_") or name == __name__:   # private, or this module
                continue
            module = importlib.import_module(name)
            if not hasattr(module, "ROWS"):
                raise ImportError(f"{name} declares no ROWS: each public module of fastrank.losses and "
                                  f"fastrank.ops puts its losses in the table (src/fastrank/ops/registry.py)")
            rows.extend(module.ROWS)
    return tuple(sorted(rows, key=lambda row: row.name))


#: the table, by spec name, in the order of the names (CombinedLoss lists them so)
LOSSES: Dict[str, Loss] = {row.name: row for row in _declared_rows()}

#: the rows with native kernels, each run through tests/test_contract.py
NATIVE_OPS: Dict[str, Loss] = {name: row for name, row in LOSSES.items() if row.contract is not None}


def functional_names() -> Tuple[str, ...]:
    """The public functions of the table, in its order (``fastrank.__all__``)."""
    return tuple(row.functional.__name__ for row in LOSSES.values())


def module_names() -> Tuple[str, ...]:
    """The module forms of the table, in its order (``fastrank.nn.__all__``)."""
    return tuple(row.module.__name__ for row in LOSSES.values() if row.module is not None)


def compat_losses(table: str) -> Dict[str, Loss]:
    """The rows that are listwise terms of the compat table ``table``, by name."""
    return {name: row for name, row in LOSSES.items() if table in row.compat}
