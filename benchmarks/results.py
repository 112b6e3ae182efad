"""A case's results: one JSON payload per run, in one layout.

File names: ``<out>/<device>-<date>-<case>[-<tag>].json`` (``--tag`` tells apart two runs
of one case on one day: ``cpu-2026-11-23-percall-compiled.json``); report.py writes the
``.md`` and ``.png`` beside it from the JSON alone. A result file is written only by a run
that measured something (:func:`measured`), and never over one that git tracks unless
``--force``; what a run saves as it goes is ``<stem>.partial.json`` (``complete: false``),
which is no result: report.py skips it, git ignores it.

Payload (every case)::

    {"schema": 2, "case": "sweep", "created": ISO time, "device": "cpu",
     "machine": machine_info(), "config": {"command": ..., "quick": ..., ...},
     "report": {"baselines": {op: impl}, "ratios": ["reference/native", ...],
                "x_names": {op: "N (= M)"}, "notes": {op: text}},
     "results": [record, ...], "complete": bool, "loadavg_end": [...], "elapsed_s": s}

A record is one measured (op, impl, mode, size)::

    {"op", "impl", "mode", "size": {...}, "size_label", "x", "dtype", "device",
     "status": "ok" | "skipped" | "error", "reason",
     "time": {"median_s", "p25_s", "p75_s", "min_s", "max_s", "repeats", ...} | None,
     "memory": {"peak_bytes", "method"} | None, ...}

and whatever the case adds (``floor``, ``first_call_s``, ``max_abs_diff``, ...).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

SCHEMA = 2
RESULTS = Path(__file__).resolve().parent / "results"
# a record's mode, in the order tables and runs take them
MODES = ("forward+backward", "forward", "backward")


def stem(device: torch.device, case: str, tag: str = "", date: _dt.date = None) -> str:
    """``<device>-<date>-<case>[-<tag>]``, the name of a run's files."""
    name = f"{torch.device(device).type}-{(date or _dt.date.today()).isoformat()}-{case}"
    return f"{name}-{tag}" if tag else name


def created_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    """The command that ran, as a user would type it."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("benchmarks", "__main__.py")):
        argv[0] = "-m benchmarks"
    elif argv:
        argv[0] = os.path.relpath(argv[0]) if not argv[0].startswith("..") else argv[0]
    return " ".join(["python"] + argv)


def loadavg():
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def machine_info(device: torch.device) -> dict:
    import fastrank

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "fastrank_version": fastrank.__version__,
        "fastrank_path": os.path.dirname(fastrank.__file__),
        "fastrank_backends": fastrank.backends(),
        "git_commit": _git_commit(),
        "loadavg_start": loadavg(),
    }
    if torch.device(device).type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info["gpu"] = {"name": p.name, "capability": f"{p.major}.{p.minor}",
                       "memory_bytes": p.total_memory, "sms": p.multi_processor_count,
                       "torch_cuda": torch.version.cuda}
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


#: what a run saves as it goes (``complete: false``) is named ``<stem>.partial.json``: never a result
PARTIAL = ".partial.json"


def partial_path(path: Path) -> Path:
    """Where the run of the result ``<stem>.json`` saves what it measured so far."""
    return path.with_name(path.name[: -len(".json")] + PARTIAL)


def is_partial(path: Path) -> bool:
    return path.name.endswith(PARTIAL)


def measured(payload: dict) -> bool:
    """Whether a payload holds a measurement: a record with status ok and a time or a memory
    peak, or the device's ceilings. A run without one writes no result file."""
    return bool(payload.get("ceilings")) or any(
        r.get("status") == "ok" and (r.get("time") or r.get("memory")) for r in payload.get("results", []))


def why_nothing(payload: dict) -> str:
    """The reasons the records of a payload without a measurement give (or that there are none)."""
    reasons = sorted({str(r["reason"]) for r in payload.get("results", []) if r.get("reason")})
    if not reasons:
        return "no record has a time or a memory peak" if payload.get("results") else "no records"
    return "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")


def committed(path: Path) -> bool:
    """Whether git tracks the file ``path`` (False outside a git checkout or without git)."""
    path = Path(path).resolve()
    if not path.is_file():
        return False
    try:
        out = subprocess.run(["git", "ls-files", "--error-unmatch", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())
