"""The command line shared by ``python -m benchmarks`` and every ``bench_<op>.py``.

    python -m benchmarks                      # every op, every mode, this machine's sizes
    python -m benchmarks --quick              # tiny sizes, about a minute: the CI smoke run
    python -m benchmarks --ops smooth_ndcg,kendall_sw --modes forward+backward
    python -m benchmarks --device cuda --out results/gpu --huge
    python benchmarks/bench_smooth_ndcg.py    # one op (its own defaults), same flags
    python -m benchmarks --case percall       # one call's cost at N = 4 .. 512 (bench_percall.py)
    python -m benchmarks --order breadth      # every op's small sizes before any large one

Results: ``<out>/<device>-<date>[-<op>].json``, ``.md`` and ``-<op>.png`` (report.py).
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import importlib
import os
import time
from pathlib import Path
from typing import List, Optional

import torch

from .floors import annotate, complete_cpu_ceilings, measure_ceilings
from .harness import MODES, ORDERS, Config, bench_ops
from .memory import PeakMemory
from . import report

# op name -> (module, attribute) ; "losses" is a group of several specs
# (in priority order: with --time-limit, what comes first is what gets measured)
OPS = {
    "smooth_ndcg": ("bench_smooth_ndcg", "SMOOTH_NDCG"),
    "kendall_sw": ("bench_kendall", "KENDALL_SW"),
    "fast_rerank": ("bench_rerank", "FAST_RERANK"),
    "kendall": ("bench_kendall", "KENDALL"),
    "fast_rerank_topk": ("bench_rerank", "FAST_RERANK_TOPK"),
    "losses": ("bench_losses", "LOSSES"),
}
IMPLS = ("native", "reference", "compiled", "chunked", "dense", "eager")
RESULTS = Path(__file__).resolve().parent / "results"


def load_specs(names: List[str]):
    specs = []
    for name in names:
        if name not in OPS:
            raise SystemExit(f"unknown op {name!r}; choose from {', '.join(OPS)}")
        mod, attr = OPS[name]
        obj = getattr(importlib.import_module(f"benchmarks.{mod}"), attr)
        specs += obj if isinstance(obj, (list, tuple)) else [obj]
    return specs


def _csv(s: str) -> List[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def build_parser(default_ops, default_modes, description, name_suffix="") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=None if name_suffix else "python -m benchmarks", description=description)
    p.add_argument("--case", default="sweep", choices=("sweep", "percall"),
                   help="sweep: every op over its sizes (default); percall: the cost of one "
                        "forward+backward call at N = 4 .. 512 against trivial autograd, the eager "
                        "and compiled reference and (CUDA) a CUDA graph (benchmarks/bench_percall.py; "
                        "CPU: one thread unless --threads)")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes and few repeats (about a minute; torch.compile not run)")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"output folder (default {RESULTS})")
    p.add_argument("--name", default=None, help="file name prefix (default <device>-<date>[-<op>])")
    p.add_argument("--ops", type=_csv, default=None,
                   help=f"comma-separated, from: {', '.join(OPS)} (default: {','.join(default_ops)}; "
                        "--case percall: smooth_ndcg, kendall, kendall_sw, fast_rerank)")
    p.add_argument("--modes", type=_csv, default=list(default_modes),
                   help=f"comma-separated, from: {', '.join(MODES)}")
    p.add_argument("--impls", type=_csv, default=None,
                   help=f"comma-separated, from: {', '.join(IMPLS)} (each op has some of them; "
                        "--case percall: native, reference, compiled, trivial, cuda_graph)")
    p.add_argument("--order", default="depth", choices=ORDERS,
                   help="depth: mode, op, then its sizes (default); breadth: every op's smallest size, "
                        "then every op's next size, ...: a --time-limit cuts large sizes, not ops")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, or auto (cuda when available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    p.add_argument("--huge", action="store_true",
                   help="also run fast_rerank_topk at 100k x 500k, 64-d (one timed call; long on CPU)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds for the whole sweep; later cases are skipped (recorded) after it")
    p.add_argument("--case-limit", type=float, default=None,
                   help="skip a case whose predicted warm-up + repeats exceed this many seconds")
    p.add_argument("--repeat-budget", type=float, default=None, help="seconds of timed repeats per case")
    p.add_argument("--min-repeats", type=int, default=None)
    p.add_argument("--max-repeats", type=int, default=None)
    p.add_argument("--mem-fraction", type=float, default=0.5,
                   help="a case may use this fraction of the free memory (default 0.5)")
    p.add_argument("--mem-budget-gb", type=float, default=None, help="hard cap on one case's memory")
    p.add_argument("--max-n", type=int, default=None, help="only the sizes with N <= this")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch and for fastrank's OpenMP kernels (default: as configured)")
    p.add_argument("--samples", type=int, default=None,
                   help="--case percall: samples per case (default 25; --quick 5)")
    p.add_argument("--sample-time", type=float, default=None,
                   help="--case percall: seconds per sample of k back-to-back calls (default 0.02)")
    p.add_argument("--case-time", type=float, default=None,
                   help="--case percall: stop sampling a case after this many seconds (default 5)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--rerender", type=Path, default=None, metavar="RESULTS.json",
                   help="no benchmark: recompute the floors and speedups of a saved run and "
                        "rewrite its .json, .md and plots (after a change to floors.py or report.py)")
    p.add_argument("--no-floors", action="store_true", help="do not measure the device ceilings")
    return p


def make_config(args, device: torch.device) -> Config:
    cfg = Config(device=device, dtype=getattr(torch, args.dtype))
    if device.type == "cuda":
        cfg.repeat_budget_s, cfg.max_repeats, cfg.case_limit_s = 1.0, 50, 60.0
    if args.quick:
        cfg.min_repeats, cfg.max_repeats, cfg.repeat_budget_s, cfg.case_limit_s = 1, 3, 0.02, 5.0
        cfg.max_warmup = 1
        cfg.mem_budget_bytes = 16 << 20   # small on purpose: the quick run shows a skipped reference
    for attr, val in (("repeat_budget_s", args.repeat_budget), ("case_limit_s", args.case_limit),
                      ("min_repeats", args.min_repeats), ("max_repeats", args.max_repeats)):
        if val is not None:
            setattr(cfg, attr, val)
    cfg.mem_fraction = args.mem_fraction
    if args.mem_budget_gb:
        cfg.mem_budget_bytes = args.mem_budget_gb * (1 << 30)
    if args.time_limit:
        cfg.deadline = time.monotonic() + args.time_limit
        cfg.compile_reserve_s = min(30.0, 0.1 * args.time_limit)  # no first compilation in the last seconds
    return cfg


def main(argv: Optional[List[str]] = None, default_ops=tuple(OPS), default_modes=MODES,
         name_suffix: str = "", description: str = None) -> int:
    args = build_parser(default_ops, default_modes, description or __doc__.splitlines()[0],
                        name_suffix).parse_args(argv)
    faulthandler.enable()  # a crash in a kernel prints the Python stack of the case
    if args.rerender:
        return rerender(args.rerender, plots=not args.no_plots)
    dev = args.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(dev)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch sees no CUDA device")
    if args.case == "percall" and device.type == "cpu" and args.threads is None:
        args.threads = 1      # the per-call case measures one core
    if args.threads:
        # before fastrank's native module (its own OpenMP runtime) is loaded
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    if args.case == "percall":
        from . import bench_percall
        return bench_percall.run(args, device)
    args.ops = args.ops or list(default_ops)
    args.impls = args.impls or list(IMPLS)
    for m in args.modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    cfg = make_config(args, device)
    specs = load_specs(args.ops)
    size_key = "quick" if args.quick else device.type
    if args.max_n:
        for s in specs:
            s.sizes[size_key] = [z for z in s.sizes[size_key] if s.x_of(z) <= args.max_n]
    impls = list(args.impls)
    if args.quick:
        for s in specs:
            if "compiled" in s.impls:
                s.unavailable["compiled"] = "not run in --quick (torch.compile takes about a minute)"
    t0 = time.monotonic()
    machine = report.machine_info(device)
    print(f"fastrank benchmarks on {device} ({machine.get('gpu', {}).get('name', machine['cpu_model'])}), "
          f"load average {machine['loadavg_start']}; fastrank from {machine['fastrank_path']}", flush=True)
    ceilings = {}
    if not args.no_floors:
        ceilings = measure_ceilings(device, quick=args.quick)
        print(f"ceilings: {ceilings}", flush=True)

    gc.freeze()  # torch's many long-lived objects out of the collector's way: gc.collect is cheap
    records = bench_ops(specs, impls, args.modes, cfg, size_key, log=lambda s: print(s, flush=True),
                        order=args.order)
    if args.huge:
        huge_cfg = make_config(args, device)
        huge_cfg.min_repeats = huge_cfg.max_repeats = 1
        huge_cfg.case_limit_s, huge_cfg.deadline, huge_cfg.no_warmup = 1e9, None, True
        huge = [s for s in specs if "huge" in s.sizes]
        if not huge:
            huge = load_specs(["fast_rerank_topk"])
            specs += huge
        for s in huge:
            s_h = _with_sizes(s, s.sizes["huge"])
            records += bench_ops([s_h], ["native"], ["forward"], huge_cfg, "huge",
                                 log=lambda s: print(s, flush=True))

    by_name = {s.name: s for s in specs}
    annotate(records, by_name, ceilings, lambda d: torch.empty((), dtype=getattr(torch, d)).element_size())
    report.add_speedups(records, {s.name: s.baseline for s in specs})
    payload = {
        "schema": report.SCHEMA,
        "created": report.created_now(),
        "device": str(device),
        "machine": machine,
        "config": {"command": report.command_line(), "quick": args.quick, "ops": args.ops,
                   "modes": args.modes, "impls": impls, "dtype": args.dtype, "huge": args.huge,
                   "min_repeats": cfg.min_repeats, "max_repeats": cfg.max_repeats,
                   "repeat_budget_s": cfg.repeat_budget_s, "case_limit_s": cfg.case_limit_s,
                   "mem_fraction": cfg.mem_fraction, "mem_budget_bytes": cfg.mem_budget_bytes,
                   "time_limit_s": args.time_limit, "seed": cfg.seed, "threads": args.threads,
                   "order": args.order},
        "ceilings": ceilings,
        "memory_method": PeakMemory(device).method,
        "x_names": {s.name: s.x_name for s in specs},
        "baselines": {s.name: s.baseline for s in specs},
        "notes": {s.name: s.notes for s in specs if s.notes},
        "results": records,
        "loadavg_end": list(os.getloadavg()),
        "elapsed_s": time.monotonic() - t0,
    }
    prefix = args.name or report.default_prefix(device) + name_suffix
    paths = report.write_all(payload, args.out, prefix, plots=not args.no_plots)
    print()
    print(report.markdown(payload))
    print("wrote: " + ", ".join(str(p) for p in paths))
    return 0


def _with_sizes(spec, sizes):
    import dataclasses
    return dataclasses.replace(spec, sizes={**spec.sizes, "huge": sizes}, unavailable=dict(spec.unavailable))


def rerender(path: Path, plots: bool = True) -> int:
    """Floors, speedups, markdown and plots of a saved run, recomputed from its records."""
    import json

    payload = json.loads(path.read_text())
    specs = load_specs([op for op in OPS if any(r["op"] in _names(op) for r in payload["results"])])
    if payload["device"].startswith("cpu"):
        complete_cpu_ceilings(payload["ceilings"])
    for r in payload["results"]:
        r.pop("floor", None)
    annotate(payload["results"], {s.name: s for s in specs}, payload["ceilings"],
             lambda d: torch.empty((), dtype=getattr(torch, d)).element_size())
    report.add_speedups(payload["results"], {s.name: s.baseline for s in specs})
    paths = report.write_all(payload, path.parent, path.stem, plots=plots)
    print("rewrote: " + ", ".join(str(p) for p in paths))
    return 0


def _names(op: str) -> set:
    return {s.name for s in load_specs([op])}
