"""The picture of a result: speed-up and peak memory against N, log scales, one line per
implementation (and direction, for the sweep's --directions), the floor drawn.

One PNG per result file, one row per op (the PyTorch losses share a row), in the op's
headline mode (forward+backward where it has one). Left: speed-up over the case's
baseline for that op (baseline median / median; the baseline is the line at 1), and the
floor as the speed-up an implementation running at the floor would have (dashed): the
gap between a line and it is what is left to gain. Right: peak extra memory.
The speed-up is drawn where the baseline ran (a reference that does not fit has none),
the memory at every size measured. Ops measured at fewer than two sizes, or without a
baseline, are left out.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Optional

from .results import MODES


def save_figure(fig, path) -> Path:
    """Lays ``fig`` out, writes it to ``path`` (80 dpi, the size of every result's figure) and
    closes it; returns the path."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _rows(payload: dict):
    recs = payload["results"]
    baselines = (payload.get("report") or {}).get("baselines") or {}
    rows = OrderedDict()
    for op in OrderedDict.fromkeys(r["op"] for r in recs):
        ok = [r for r in recs if r["op"] == op and r["status"] == "ok"]
        mode = next((m for m in MODES if any(r["mode"] == m for r in ok)), None)
        ok = [r for r in ok if r["mode"] == mode and "x" in r]   # a size axis (the isa case has none)
        if len({r["x"] for r in ok}) < 2 or baselines.get(op) not in {r["impl"] for r in ok}:
            continue
        group = next((r.get("group") for r in ok if r.get("group")), op)
        rows.setdefault(group, []).append((op, mode, ok))
    return rows


def _line(r: dict) -> str:
    """A record's line: its implementation, and its direction where its size has one (the
    sweep's --directions: a line per direction)."""
    direction = (r.get("size") or {}).get("direction")
    return f"{r['impl']}, {direction}" if direction else r["impl"]


def plot(payload: dict, path: Path) -> Optional[Path]:
    """Write the PNG; None (and no file) when there is nothing to draw."""
    from quality import report as quality_report
    if quality_report.is_quality(payload):
        return quality_report.plot(payload, path)
    if (payload.get("report") or {}).get("layout") == "times":
        return plot_times(payload, path)
    rows = _rows(payload)
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    baselines = payload["report"]["baselines"]
    x_names = payload["report"].get("x_names") or {}
    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 3.6 * len(rows)), squeeze=False)
    for row, (group, members) in enumerate(rows.items()):
        ax_s, ax_m = axes[row]
        several = len(members) > 1
        for op, _mode, ok in members:
            base = {r["size_label"]: r["time"]["median_s"] for r in ok if r["impl"] == baselines[op]}
            floor = []
            for i, line in enumerate(OrderedDict.fromkeys(_line(r) for r in ok)):
                every = sorted((r for r in ok if _line(r) == line), key=lambda r: r["x"])
                rs = [r for r in every if r["size_label"] in base]    # a speed-up needs the baseline's time
                label = f"{op} ({line})" if several else line
                color = f"C{(len(ax_s.lines) if several else i) % 10}"
                ax_s.plot([r["x"] for r in rs], [base[r["size_label"]] / r["time"]["median_s"] for r in rs],
                          marker="o", label=label, color=color)
                mem = [(r["x"], r["memory"]["peak_bytes"]) for r in every
                       if (r.get("memory") or {}).get("peak_bytes")]
                if mem:
                    ax_m.plot([a for a, _ in mem], [b / 2 ** 20 for _, b in mem], marker="o", label=label, color=color)
                floor += [(r["x"], base[r["size_label"]] / r["floor"]["floor_s"]) for r in rs
                          if (r.get("floor") or {}).get("floor_s")]
            if floor:
                floor = sorted(dict(floor).items())
                ax_s.plot([a for a, _ in floor], [b for _, b in floor], "k--", linewidth=1,
                          label=f"{op}: floor" if several else "floor")
        title = f"{group}: {members[0][1]} ({payload['device']}, {payload['created'][:10]})"
        for ax, ylabel in ((ax_s, f"speed-up over {baselines[members[0][0]]}"), (ax_m, "peak extra memory (MiB)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(x_names.get(members[0][0], "N"))
            ax.set_ylabel(ylabel)
            ax.set_title(title, fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_times(payload: dict, path: Path) -> Optional[Path]:
    """Time against N (log-log), a line per implementation and op, with the slopes of the
    report's ``slopes`` (name -> exponent) drawn through the first point of each op's baseline;
    right: peak extra memory. None when no op has two sizes."""
    recs = [r for r in payload["results"] if r["status"] == "ok"]
    ops = [op for op in OrderedDict.fromkeys(r["op"] for r in recs) if len({r["x"] for r in recs if r["op"] == op}) > 1]
    if not ops:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    report = payload["report"]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.6))
    styles = ["-", "--", ":", "-."]
    impls = list(OrderedDict.fromkeys(r["impl"] for r in recs))
    for j, op in enumerate(ops):
        for i, impl in enumerate(impls):
            rs = sorted((r for r in recs if r["op"] == op and r["impl"] == impl), key=lambda r: r["x"])
            if not rs:
                continue
            kw = dict(marker="o", color=f"C{i}", linestyle=styles[j % len(styles)], label=f"{op}: {impl}")
            ax_t.plot([r["x"] for r in rs], [r["time"]["median_s"] for r in rs], **kw)
            mem = [(r["x"], r["memory"]["peak_bytes"]) for r in rs if (r.get("memory") or {}).get("peak_bytes")]
            if mem:
                ax_m.plot([a for a, _ in mem], [b / 2 ** 20 for _, b in mem], **kw)
    first = min((r for r in recs if r["op"] == ops[0]), key=lambda r: (r["x"], r["time"]["median_s"]))
    xs = sorted({r["x"] for r in recs})
    for k, (name, power) in enumerate((report.get("slopes") or {}).items()):
        ax_t.plot(xs, [first["time"]["median_s"] * (x / first["x"]) ** power for x in xs], color="k",
                  linestyle=styles[k % len(styles)], linewidth=0.8, label=f"slope {name}")
    x_name = next(iter((report.get("x_names") or {"": "N"}).values()))
    for ax, ylabel in ((ax_t, "seconds per call"), (ax_m, "peak extra memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(x_name)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.suptitle(f"{payload['case']} ({payload['device']}, {payload['created'][:10]})", fontsize=10)
    return save_figure(fig, path)
