"""What a case is: a name, a line saying what it measures, and the function that runs it.

Every measurement fastrank publishes is a case of ``python -m benchmarks`` (cases/, one
file per case, named as ``--list`` names the case). ``run(args, device, save)`` measures
and returns a result payload (results.py); ``save(payload)`` may be called along the way
so that a run cut short keeps what it measured. The command line (cli.py) writes the
payload to ``<out>/<device>-<date>-<case>[-<tag>].json`` and its ``.md`` and ``.png``.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

from . import results


@dataclass
class Case:
    name: str
    about: str                      # one line, for --list
    run: Callable[[argparse.Namespace, torch.device, Callable[[dict], None]], dict]
    cpu_threads: Optional[int] = None   # CPU threads when --threads is not given (None: all)


def payload(case: str, device: torch.device, config: dict, records: List[dict], report: dict,
            machine: dict, t0: float, complete: bool = True, **extra) -> dict:
    """A case's result in the common layout (results.py)."""
    return {"schema": results.SCHEMA, "case": case, "created": results.created_now(), "device": str(device),
            "machine": machine, "config": {"command": results.command_line(), **config}, "report": report,
            **extra, "results": records, "complete": complete, "loadavg_end": results.loadavg(),
            "elapsed_s": time.monotonic() - t0}
