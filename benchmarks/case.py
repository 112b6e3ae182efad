"""What a case is: a name, a line saying what it measures, and the function that runs it.

Every measurement fastrank publishes is a case of ``python -m benchmarks`` (cases/, one
file per case, named as ``--list`` names the case). ``run(args, device, save)`` measures
and returns a result payload (results.py); ``save(payload)`` may be called along the way
so that a run cut short keeps what it measured (as ``<stem>.partial.json``). The command
line (cli.py) writes the payload to ``<out>/<device>-<date>-<case>[-<tag>].json`` and its
``.md`` and ``.png`` when it holds a measurement. A bad option value is refused before
``run`` starts (cli.py, ``choices``); a check only the case can make raises
``A.UsageError`` (cli_args.py) before it measures anything.
"""
from __future__ import annotations

import argparse
import inspect
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

from . import results


@dataclass
class Case:
    name: str
    about: str                      # one line, for --list
    run: Callable[[argparse.Namespace, torch.device, Callable[[dict], None]], dict]
    cpu_threads: Optional[int] = None   # CPU threads when --threads is not given (None: all)
    # the names it takes in the shared list options, by dest ("ops", "impls", "modes", "towers"):
    # a sequence, or a function returning one; cli.py refuses any other name before the run
    choices: Dict[str, Union[Sequence[str], Callable[[], Sequence[str]]]] = field(default_factory=dict)
    # what an optional dependency of the case lacks (a line saying what to install), or None:
    # the run of every case skips it, a run of it alone refuses to start (cli.py)
    missing: Optional[Callable[[], Optional[str]]] = None

    def lacks(self) -> Optional[str]:
        return self.missing() if self.missing else None

    @property
    def source(self) -> str:
        """The file that defines the case, from the repository's root (``benchmarks/cases/<name>.py``;
        the quality study's is ``quality/study.py``)."""
        path = Path(inspect.getsourcefile(self.run)).resolve()
        return path.relative_to(Path(__file__).resolve().parents[1]).as_posix()


def payload(case: str, device: torch.device, config: dict, records: List[dict], report: dict,
            machine: dict, t0: float, complete: bool = True, **extra) -> dict:
    """A case's result in the common layout (results.py)."""
    return {"schema": results.SCHEMA, "case": case, "created": results.created_now(), "device": str(device),
            "machine": machine, "config": {"command": results.command_line(), **config}, "report": report,
            **extra, "results": records, "complete": complete, "loadavg_end": results.loadavg(),
            "elapsed_s": time.monotonic() - t0}
