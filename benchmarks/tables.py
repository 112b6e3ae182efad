"""Markdown tables from a result payload (results.py): the ``.md`` beside each JSON and the
README's tables, both drawn by :func:`table`.

A table has one row per (op, mode, size) of the records it selects, and the columns it
is asked for, each a token:

==================  ==========================================================
``impl``            median time · peak extra memory of that implementation
``impl:spread``     median ±half the interquartile range · peak extra memory
``impl:time``       median time alone
``impl:mem``        peak extra memory alone
``impl:cpu``        median CPU time of the process (all threads)
``a/b``             median of a / median of b, same op, mode and size
``impl:floor``      measured / floor (ceilings.py)
``impl:floors``     the bytes floor / the work floor (the unit that binds)
``impl:loop``       measured / the C++-loop floor of pair work (CPU, ceilings.py)
``impl:per_output`` peak extra memory in output matrices
``impl:diff``       the largest difference from the baseline's value
``impl:t2i/i2t``    on a t2i row, its median / the median of the i2t row of the
                    same op, mode and size (rows whose size has a ``direction``)
==================  ==========================================================

``token as Label`` names the column. Skipped cases show why, shortly ("skip: mem 16 GB").
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Iterable, List, Optional

from .results import MODES

_UNITS = {"exp": "exp", "fp32": "fp32", "mm_flop": "matmul", "cmp_select_add": "cmp+sel+add"}


def fmt_bytes(b: float) -> str:
    for unit, k in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= k:
            return f"{b / k:.3g} {unit}"
    return f"{int(b)} B"


def fmt_time(s: Optional[float]) -> str:
    if s is None:
        return ""
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def short_reason(r: dict) -> str:
    why = r.get("reason") or ""
    for start, short in (("not run in --quick", "skip: --quick"), ("native kernels unavailable", "skip: not built"),
                         ("run time limit", "skip: run limit"), ("torch.compile failed", "skip: compile failed"),
                         ("fastrank has no", "skip: not in fastrank")):
        if why.startswith(start):
            return short
    if why.startswith("would not fit"):
        return "skip: mem " + why.split("~")[1].split(",")[0]
    if why.startswith("OOM predicted"):
        return why.split(";")[0]
    if why.startswith("too slow"):
        return "skip: time ~" + why.split("~")[1].split(" s")[0] + " s/call"
    if why == "not implemented":
        return "skip: not impl."
    return ("error" if r["status"] == "error" else "skip") + (": " + why[:40] if why else "")


# ------------------------------------------------------------------ columns

class Column:
    def __init__(self, token: str):
        token, _, label = (t.strip() for t in token.partition(" as "))
        self.token = token
        if token.endswith(":t2i/i2t"):
            self.impl, self.kind = token[:-len(":t2i/i2t")], "directions"
        elif "/" in token:
            self.kind, (self.impl, self.other) = "ratio", token.split("/", 1)
        else:
            self.impl, _, self.kind = token.partition(":")
            self.kind = self.kind or "cell"
        self.label = label or {
            "cell": self.impl, "spread": self.impl, "time": self.impl, "mem": f"{self.impl} peak",
            "cpu": f"{self.impl} CPU time", "ratio": f"{self.impl} / {getattr(self, 'other', '')}",
            "floor": f"{self.impl} / floor", "loop": f"{self.impl} / C++ loop floor", "floors": f"{self.impl} floor (bytes / work)",
            "per_output": f"{self.impl} peak / one output", "diff": "max abs diff",
            "directions": f"{self.impl} t2i / i2t"}[self.kind]

    def cell(self, by_impl: Dict[str, dict], i2t: Optional[Dict[str, dict]] = None) -> str:
        """The cell of a row (``by_impl``: its records by implementation); ``i2t``: the
        records of the i2t row of the same op, mode and size, for a t2i row."""
        r = by_impl.get(self.impl)
        if self.kind == "directions":
            o = (i2t or {}).get(self.impl)
            if r and o and r["status"] == "ok" and o["status"] == "ok" and o["time"]["median_s"]:
                return f"{r['time']['median_s'] / o['time']['median_s']:.3g}x"
            return ""
        if self.kind == "ratio":
            o = by_impl.get(self.other)
            if r and o and r["status"] == "ok" and o["status"] == "ok" and o["time"]["median_s"]:
                return f"{r['time']['median_s'] / o['time']['median_s']:.3g}x"
            return ""
        if r is None:
            return ""
        if r["status"] != "ok":
            return short_reason(r) if self.kind in ("cell", "spread", "time", "mem", "cpu") else ""
        t, mem = r["time"], (r.get("memory") or {}).get("peak_bytes")
        mem_s = fmt_bytes(mem) if mem is not None else "n/a"
        with_mem = f" · {mem_s}" if r.get("memory") else ""   # the per-call case measures no memory
        if self.kind == "cell":
            return f"{fmt_time(t['median_s'])}{with_mem}"
        if self.kind == "spread":
            spread = (t["p75_s"] - t["p25_s"]) / 2 / t["median_s"] * 100 if t["median_s"] else 0
            return f"{fmt_time(t['median_s'])} ±{spread:.0f}%{with_mem}"
        if self.kind == "time":
            return fmt_time(t["median_s"])
        if self.kind == "mem":
            return mem_s
        if self.kind == "cpu":
            return fmt_time(t.get("cpu_median_s"))
        if self.kind == "per_output":
            po = (r.get("memory") or {}).get("peak_over_one_output")
            return f"{po:.2f}" if po is not None else ""
        if self.kind == "diff":
            d = r.get("max_abs_diff")
            return f"{d:.1e}" if d is not None else ""
        fl = r.get("floor") or {}
        if self.kind == "floor":
            return f"{fl['measured_over_floor']:.3g}x" if fl.get("measured_over_floor") else ""
        if self.kind == "loop":
            return f"{fl['measured_over_loop_floor']:.3g}x" if fl.get("measured_over_loop_floor") else ""
        if self.kind == "floors":
            if not fl:
                return ""
            b = fmt_time(fl["bytes_s"]) if fl.get("bytes_s") else "n/a"
            w = fmt_time(fl["work_s"]) if fl.get("work_s") else "n/a"
            if fl.get("work_unit"):
                w += f" ({_UNITS.get(fl['work_unit'], fl['work_unit'])})"
            return f"{b} / {w}"
        raise ValueError(f"unknown column kind {self.kind!r} in {self.token!r}")


# ------------------------------------------------------------------ one table

def select(records: List[dict], ops: Optional[Iterable[str]] = None, modes: Optional[Iterable[str]] = None,
           max_n: Optional[float] = None, min_n: Optional[float] = None) -> List[dict]:
    ops, modes = (set(ops) if ops else None), (set(modes) if modes else None)
    return [r for r in records if (ops is None or r["op"] in ops) and (modes is None or r["mode"] in modes)
            and (max_n is None or r["x"] <= max_n) and (min_n is None or r["x"] >= min_n)]


def table(records: List[dict], columns: Iterable[str], row_label: Optional[str] = None,
          op_label: Optional[str] = None) -> str:
    """One markdown table: a row per (op, mode, size) of ``records`` (op and mode columns
    shown where they vary, the size column unless every row of several ops has the same
    size), then ``columns`` (tokens, module docstring)."""
    cols = [Column(c) for c in columns]
    op_order = list(OrderedDict.fromkeys(r["op"] for r in records))
    keys = sorted(OrderedDict.fromkeys((r["op"], r["mode"], r["size_label"], r["x"]) for r in records),
                  key=lambda k: (op_order.index(k[0]), MODES.index(k[1]) if k[1] in MODES else 9, k[3]))
    show_op = len({k[0] for k in keys}) > 1
    show_mode = len({k[1] for k in keys}) > 1
    show_size = not show_op or len({k[2] for k in keys}) > 1
    head = (([op_label or "op"] if show_op else []) + (["mode"] if show_mode else [])
            + ([row_label or "size"] if show_size else []))
    head += [c.label for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    i2t = {_undirected(r): r for r in records if _direction(r) == "i2t"}
    for op, mode, size, _x in keys:
        by_impl = {r["impl"]: r for r in records if (r["op"], r["mode"], r["size_label"]) == (op, mode, size)}
        peers = {impl: i2t.get(_undirected(r)) for impl, r in by_impl.items() if _direction(r) == "t2i"}
        row = ([op] if show_op else []) + ([mode] if show_mode else []) + ([size] if show_size else [])
        lines.append("| " + " | ".join(row + [c.cell(by_impl, peers) for c in cols]) + " |")
    return "\n".join(lines)


def _direction(r: dict) -> Optional[str]:
    """The direction a record's size names (the sweep's --directions), or None."""
    return (r.get("size") or {}).get("direction")


def _undirected(r: dict) -> tuple:
    """What a record is but its direction: op, implementation, mode and the rest of its size."""
    return (r["op"], r["impl"], r["mode"], tuple(sorted((k, v) for k, v in r["size"].items() if k != "direction")))


def default_columns(payload: dict, op: str, records: List[dict]) -> List[str]:
    """Every implementation (time ±spread · memory), the case's ratios among them, and the
    fast implementation's memory per output and floor where the records have them."""
    rep = payload.get("report") or {}
    impls = list(OrderedDict.fromkeys(r["impl"] for r in records))
    cols = [f"{i}:spread" for i in impls]
    baseline = (rep.get("baselines") or {}).get(op)
    fast = "native" if "native" in impls else next((i for i in impls if i != baseline), None)
    ratios = rep.get("ratios") or ([f"{baseline}/{fast}"] if baseline and fast else [])
    cols += [q for q in ratios if all(p in impls for p in q.split("/"))]
    if fast and {"i2t", "t2i"} <= {_direction(r) for r in records if r["impl"] == fast}:
        cols.append(f"{fast}:t2i/i2t")
    if fast and any("peak_over_one_output" in (r.get("memory") or {}) for r in records if r["impl"] == fast):
        cols.append(f"{fast}:per_output")
    if fast and any(r.get("max_abs_diff") is not None for r in records if r["impl"] == fast):
        cols.append(f"{fast}:diff")
    if fast and any(r.get("floor") for r in records if r["impl"] == fast):
        cols += [f"{fast}:floors", f"{fast}:floor"]
    if fast and any((r.get("floor") or {}).get("loop_s") for r in records if r["impl"] == fast):
        cols.append(f"{fast}:loop")
    return cols


# ------------------------------------------------------------------ a whole result

def provenance(payload: dict) -> str:
    """One line: the command, the machine, threads and load average of a run."""
    m, cfg = payload["machine"], payload.get("config") or {}
    hw = m["gpu"]["name"] if "gpu" in m else f"{m['cpu_model']}, {m['cpu_count']} cores"
    threads = m.get("torch_threads")
    la = m.get("loadavg_start")
    command = f"`{cfg['command']}`" if cfg.get("command") else None
    if cfg.get("command_now"):     # a run from before the cases had their current names
        command += f" (today: `{cfg['command_now']}`)"
    parts = [command,
             f"{payload['created'][:10]}", hw,
             f"{threads} thread{'s' if threads != 1 else ''}" if threads else None,
             f"load average {la[0]:.1f} at the start" if la else None,
             f"torch {m['torch']}", f"fastrank @ {m['git_commit']}" if m.get("git_commit") else None]
    return "; ".join(p for p in parts if p)


def header_lines(payload: dict, provenance: str, load_note: str) -> List[str]:
    """The first lines of a result's ``.md`` (a timing's or a training-quality result's): its
    title, how it was run (``provenance``: :func:`provenance`'s line), a partial run's warning,
    the load average with ``load_note`` after it, the report's method lines, a blank line."""
    lines = [f"# {payload['case']}: {payload['device']}, {payload['created'][:10]}", "", f"- {provenance}"]
    if not payload.get("complete", True):
        lines.append("- PARTIAL: written while the run was going on (it was cut or is still running)")
    la0, la1 = payload["machine"].get("loadavg_start"), payload.get("loadavg_end")
    if la0:
        lines.append(f"- load average (1, 5, 15 min) at start {la0[0]:.2f}, {la0[1]:.2f}, {la0[2]:.2f}"
                     + (f"; at end {la1[0]:.2f}, {la1[1]:.2f}, {la1[2]:.2f}" if la1 else "") + load_note)
    lines += [f"- {line}" for line in (payload.get("report") or {}).get("method") or []]
    return lines + [""]


def markdown(payload: dict) -> str:
    """The ``.md`` of a result: how it was measured, then a table per op and mode."""
    from quality import report as quality_report
    if quality_report.is_quality(payload):   # a training-quality result: a row per loss, its metrics
        return quality_report.markdown(payload, provenance(payload))
    recs = payload["results"]
    rep = payload.get("report") or {}
    lines = header_lines(payload, provenance(payload), " (compare implementations within a run)")
    ceil = payload.get("ceilings") or {}
    if ceil:
        lines += ["### ceilings (ceilings.py)", "", ceilings_table(ceil), ""]
    notes = rep.get("notes") or {}
    if rep.get("table"):   # a case that renders its own table (cases/isa.py)
        lines += rep["table"] + [""]
        recs = []
    for op in OrderedDict.fromkeys(r["op"] for r in recs):
        for mode in MODES + tuple(sorted({r["mode"] for r in recs} - set(MODES))):
            rs = [r for r in recs if r["op"] == op and r["mode"] == mode]
            if rs:
                lines += [f"### {op}: {mode}", "", table(rs, default_columns(payload, op, rs)), ""]
        if notes.get(op):
            lines += [f"{op}: {notes[op]}", ""]
    errors = [r for r in recs if r["status"] == "error"]
    if errors:
        lines += ["### errors", ""]
        lines += [f"- {r['op']} {r['impl']} {r['mode']} {r['size_label']}: {r['reason']}" for r in errors]
        lines.append("")
    lines += [] if not recs else ["Cells: median ±half-IQR · peak extra memory. `skip: mem X`: the estimated peak memory X "
              "exceeds the budget (a fraction of free memory); `skip: time`: predicted from the previous "
              "size, over the per-case limit; `skip: not impl.`: the op is not implemented yet.", ""]
    return "\n".join(lines)


CEILINGS = (("copy_bytes_per_s", "copy bandwidth (read + write)", 1e9, "GB/s"),
            ("exp_per_s", "exp", 1e9, "G/s"), ("exp_per_s_1core", "exp, one core", 1e9, "G/s"),
            ("cmp_select_add_per_s", "compare+select+add", 1e9, "G/s"),
            ("cmp_select_add_per_s_1core", "compare+select+add, one core", 1e9, "G/s"),
            ("cmp_select_add_loop_per_s_1core", "compare+select+add C++ loop, one core", 1e9, "G/s"),
            ("fp32_per_s", "fp32", 1e12, "T/s"), ("matmul_flops_per_s", "matmul float32", 1e12, "TFLOP/s"))


def ceilings_table(ceil: dict) -> str:
    """The measured rates of a run, each with how it was measured."""
    methods = ceil.get("methods") or {}
    lines = ["| rate | value | how |", "| --- | --- | --- |"]
    for key, name, scale, unit in CEILINGS:
        if ceil.get(key):
            lines.append(f"| {name} | {ceil[key] / scale:.3g} {unit} | {methods.get(key, '')} |")
    if ceil.get("threads"):
        lines.append(f"| threads | {ceil['threads']} | the CPU rates are the one-core rates times this |")
    return "\n".join(lines)
