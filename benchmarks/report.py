"""Writing a run's results: JSON (everything), a markdown table, PNG plots.

Files, for a run named ``<prefix>`` (``<device>-<date>`` by default) in ``--out DIR``:

- ``<prefix>.json``: machine info, configuration, device ceilings, one record per case;
- ``<prefix>.md``: per op and mode, one row per size, one column per implementation
  (median time, spread, peak extra memory), the speedup of the native kernel over the
  eager reference, and its floor with measured / floor;
- ``<prefix>-<op>.png``: time and peak memory against N, log-log, one line per
  implementation, one row of panels per mode.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List

import torch

from .harness import MODES, fmt_bytes

SCHEMA = 1


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
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if device.type == "cuda":
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


def default_prefix(device: torch.device, date: _dt.date = None) -> str:
    return f"{device.type}-{(date or _dt.date.today()).isoformat()}"


def add_speedups(records: List[dict], baselines: Dict[str, str]) -> None:
    """``vs_baseline``: baseline median / this median, for the same op, mode and size."""
    base = {}
    for r in records:
        if r["status"] == "ok" and r["impl"] == baselines.get(r["op"]):
            base[(r["op"], r["mode"], r["size_label"])] = r["time"]["median_s"]
    for r in records:
        b = base.get((r["op"], r["mode"], r["size_label"]))
        r["baseline"] = baselines.get(r["op"])
        r["vs_baseline"] = (b / r["time"]["median_s"]) if (b and r["status"] == "ok") else None


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str))


# ---------------------------------------------------------------------- markdown

def _short_reason(r: dict) -> str:
    why = r["reason"] or ""
    if why.startswith("would not fit"):
        return "skip: mem " + why.split("~")[1].split(",")[0]
    if why.startswith("too slow"):
        return "skip: time ~" + why.split("~")[1].split(" s")[0] + " s/call"
    if why == "not implemented":
        return "skip: not impl."
    if why.startswith("native kernels unavailable"):
        return "skip: not built"
    if why.startswith("run time limit"):
        return "skip: run limit"
    if why.startswith("not run in --quick"):
        return "skip: --quick"
    if why.startswith("torch.compile failed"):
        return "skip: compile failed"
    return ("error" if r["status"] == "error" else "skip") + (": " + why[:40] if why else "")


def _fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


_UNIT_NAMES = {"exp": "exp", "fp32": "fp32", "mm_flop": "matmul", "cmp_select_add": "cmp+sel+add"}


def _cell(r: dict) -> str:
    if r is None:
        return ""
    if r["status"] != "ok":
        return _short_reason(r)
    t = r["time"]
    spread = (t["p75_s"] - t["p25_s"]) / 2 / t["median_s"] * 100 if t["median_s"] else 0
    mem = r["memory"]["peak_bytes"]
    return f"{_fmt_time(t['median_s'])} ±{spread:.0f}% · {fmt_bytes(mem) if mem is not None else 'n/a'}"


def markdown(payload: dict) -> str:
    recs = payload["results"]
    m = payload["machine"]
    dev = payload["device"]
    lines = [f"# fastrank benchmarks: {dev}, {payload['created'][:10]}", ""]
    hw = m.get("gpu", {}).get("name") if "gpu" in m else m["cpu_model"]
    lines.append(f"- machine: {hw}; {m['cpu_count']} CPU cores, torch {m['torch']} "
                 f"({m['torch_threads']} threads), fastrank {m['fastrank_version']}"
                 + (f" @ {m['git_commit']}" if m.get("git_commit") else ""))
    la0, la1 = m.get("loadavg_start"), payload.get("loadavg_end")
    if la0:
        lines.append(f"- load average (1, 5, 15 min) at start {la0[0]:.2f}, {la0[1]:.2f}, {la0[2]:.2f}"
                     + (f"; at end {la1[0]:.2f}, {la1[1]:.2f}, {la1[2]:.2f}" if la1 else "")
                     + " (a shared machine: compare within a run)")
    cfg = payload["config"]
    lines.append(f"- dtype {cfg['dtype']}; command `{cfg['command']}`; "
                 f"warm-up then repeats (min {cfg['min_repeats']}, up to {cfg['max_repeats']} or "
                 f"{cfg['repeat_budget_s']} s); cells: median ±half-IQR · peak extra memory "
                 f"({payload['memory_method']})")
    ceil = payload.get("ceilings") or {}
    if ceil:
        parts = []
        if ceil.get("copy_bytes_per_s"):
            parts.append(f"copy {ceil['copy_bytes_per_s'] / 1e9:.3g} GB/s")
        per_core = (f" ({ceil['threads']} thread(s) x the one-core rate)"
                    if ceil.get("exp_per_s_1core") else "")
        if ceil.get("exp_per_s"):
            parts.append(f"exp {ceil['exp_per_s'] / 1e9:.3g} G/s" + per_core)
        if ceil.get("cmp_select_add_per_s"):
            parts.append(f"compare+select+add {ceil['cmp_select_add_per_s'] / 1e9:.3g} G/s" + per_core)
        if ceil.get("fp32_per_s"):
            parts.append(f"fp32 {ceil['fp32_per_s'] / 1e12:.3g} T/s")
        if ceil.get("matmul_flops_per_s"):
            parts.append(f"matmul {ceil['matmul_flops_per_s'] / 1e12:.3g} TFLOP/s")
        lines.append("- measured ceilings (floors.py): " + ", ".join(parts))
    lines.append("")

    ops = list(OrderedDict.fromkeys(r["op"] for r in recs))
    for op in ops:
        for mode in MODES:
            rs = [r for r in recs if r["op"] == op and r["mode"] == mode]
            if not rs:
                continue
            impls = list(OrderedDict.fromkeys(r["impl"] for r in rs))
            sizes = list(OrderedDict.fromkeys(r["size_label"] for r in rs))
            baseline = rs[0].get("baseline")
            fast = "native" if "native" in impls else None
            has_floor = any(r.get("floor") for r in rs if r["impl"] == fast)
            per_output = fast and any("peak_over_one_output" in (r.get("memory") or {}) for r in rs)
            head = ["size"] + impls
            if fast and baseline in impls:
                head.append(f"{baseline} / {fast}")
            if per_output:
                head.append(f"{fast} peak / one output")
            if has_floor:
                head += [f"{fast} floor (bytes / work)", f"{fast} / floor"]
            lines += [f"### {op}: {mode}", "", "| " + " | ".join(head) + " |",
                      "|" + "---|" * len(head)]
            for size in sizes:
                by_impl = {r["impl"]: r for r in rs if r["size_label"] == size}
                row = [size] + [_cell(by_impl.get(i)) for i in impls]
                if fast and baseline in impls:
                    f = by_impl.get(fast)
                    row.append(f"{f['vs_baseline']:.3g}x" if f and f.get("vs_baseline") else "")
                if per_output:
                    pm = (by_impl.get(fast) or {}).get("memory") or {}
                    row.append(f"{pm['peak_over_one_output']:.2f}" if "peak_over_one_output" in pm else "")
                if has_floor:
                    fl = (by_impl.get(fast) or {}).get("floor")
                    if fl:
                        b = _fmt_time(fl["bytes_s"]) if fl.get("bytes_s") else "n/a"
                        w = _fmt_time(fl["work_s"]) if fl.get("work_s") else "n/a"
                        if fl.get("work_unit"):
                            w += f" ({_UNIT_NAMES.get(fl['work_unit'], fl['work_unit'])})"
                        row += [f"{b} / {w}", f"{fl['measured_over_floor']:.3g}x"
                                if fl.get("measured_over_floor") else ""]
                    else:
                        row += ["", ""]
                lines.append("| " + " | ".join(row) + " |")
            lines.append("")
    errors = [r for r in recs if r["status"] == "error"]
    if errors:
        lines += ["### errors", ""]
        lines += [f"- {r['op']} {r['impl']} {r['mode']} {r['size_label']}: {r['reason']}" for r in errors]
        lines.append("")
    lines += ["Legend: `skip: mem X` = the estimated peak memory X exceeds the budget (a fraction of "
              "free memory); `skip: time` = predicted from the previous size, over the per-case limit; "
              "`skip: not impl.` = the op is not implemented yet.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------- plots

def plot(payload: dict, out_dir: Path, prefix: str) -> List[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = payload["results"]
    x_names = payload.get("x_names", {})
    paths = []
    for group in OrderedDict.fromkeys(r.get("group", r["op"]) for r in recs):
        grecs = [r for r in recs if r.get("group", r["op"]) == group]
        ops = list(OrderedDict.fromkeys(r["op"] for r in grecs))
        modes = [mo for mo in MODES if any(r["mode"] == mo for r in grecs)]
        fig, axes = plt.subplots(len(modes), 2, figsize=(10, 3.6 * len(modes)), squeeze=False)
        for row, mode in enumerate(modes):
            rs = [r for r in grecs if r["mode"] == mode]
            for op, impl in OrderedDict.fromkeys((r["op"], r["impl"]) for r in rs):
                ok = sorted((r for r in rs if r["op"] == op and r["impl"] == impl and r["status"] == "ok"),
                            key=lambda r: r["x"])
                if not ok:
                    continue
                label = impl if len(ops) == 1 else f"{op} ({impl})"
                axes[row][0].plot([r["x"] for r in ok], [r["time"]["median_s"] for r in ok],
                                  marker="o", label=label)
                mem = [(r["x"], r["memory"]["peak_bytes"]) for r in ok if r["memory"]["peak_bytes"]]
                if mem:
                    axes[row][1].plot([a for a, _ in mem], [b / 2 ** 20 for _, b in mem], marker="o", label=label)
            for col, ylabel in ((0, "time per call (s)"), (1, "peak extra memory (MiB)")):
                ax = axes[row][col]
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel(x_names.get(ops[0], "N"))
                ax.set_ylabel(ylabel)
                ax.set_title(f"{group}: {mode} ({payload['device']})", fontsize=10)
                ax.grid(True, which="both", alpha=0.3)
                if ax.lines:
                    ax.legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / f"{prefix}-{group}.png"
        fig.savefig(p, dpi=80)
        plt.close(fig)
        paths.append(p)
    return paths


def write_all(payload: dict, out_dir: Path, prefix: str, plots: bool = True) -> List[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    jp, mp = out_dir / f"{prefix}.json", out_dir / f"{prefix}.md"
    write_json(jp, payload)
    mp.write_text(markdown(payload))
    paths = [jp, mp]
    if plots:
        paths += plot(payload, out_dir, prefix)
    return paths


def created_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("benchmarks", "__main__.py")):
        argv[0] = "-m benchmarks"
    elif argv:
        argv[0] = os.path.relpath(argv[0]) if not argv[0].startswith("..") else argv[0]
    return " ".join(["python"] + argv)
