"""sweep: every op (ops.py) over its sizes, in every mode: the native kernel against the
eager reference, torch.compile of it and a memory-chunked PyTorch version; time, peak
extra memory, and each native case against its floor (ceilings.py).

    python -m benchmarks sweep                                   # every op, every mode
    python -m benchmarks sweep --ops smooth_ndcg,kendall --impls native,reference --max-n 512
    python -m benchmarks sweep --threads 1 --ops smooth_ndcg --modes forward+backward   # one core
    python -m benchmarks sweep --device cuda --order breadth --huge --time-limit 300

    python -m benchmarks sweep --ops smooth_ndcg,kendall --impls native --directions i2t,t2i --topk 8 \
        --sizes 4096 --modes forward+backward --threads 2              # t2i beside i2t, sparse relevance

Sizes are the op's for the device (``--quick``: tiny ones, torch.compile not run, a
16 MB memory budget so that a reference that does not fit is shown skipped), or N = M for
each of ``--sizes`` (the ops whose sizes are N x N). Cases are run and guarded by
harness.py. With ``--huge``, fast_rerank_topk also runs once at 100k x 500k (one timed
call, no warm-up).

``--directions i2t,t2i`` calls each op once per direction (``direction=``), each size's
rows side by side, and the table gives t2i / i2t (ratio of medians); the default is one
call of both directions, as the ops' defaults. ``--topk K`` gives the graded ops that take a
``fastrank.TopKRelevance`` (smooth_ndcg, kendall) one of K random distinct columns a row
with random gains in [0, 1) (ops.random_topk; the rest of the row 0) in place of the dense
relevance. Both show in each record's size and row label, and in the config. Naming an op
that takes no direction, or no TopKRelevance, with them is a usage error. Such rows have no
floor: the ops' models count the dense work of both directions.
"""
from __future__ import annotations

import dataclasses
import gc
import time

import torch

from ..case import Case, payload
from ..ceilings import annotate, measure_ceilings
from ..harness import Config, bench_ops
from ..memory import PeakMemory
from ..cli_args import A
from ..ops import OPS, square, takes_direction, takes_topk, variant, variant_sizes
from ..results import MODES, machine_info

IMPLS = ("native", "reference", "compiled", "chunked", "dense", "eager")
QUICK_SKIP = "not run in --quick (torch.compile takes about a minute)"


def config(args, device: torch.device) -> Config:
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


def check_variants(args, ops) -> None:
    """--directions, --topk and --sizes name only ops that take them (A.UsageError, before
    anything is measured)."""
    for option, given, takes, why in (
            ("--directions", args.directions, takes_direction, "no direction argument"),
            ("--topk", args.topk, takes_topk, "no TopKRelevance in place of a dense relevance"),
            ("--sizes", args.sizes, lambda op: all(s == {"n": s["n"], "m": s["n"]} for s in op.sizes["cpu"]),
             "sizes other than N x N")):
        refused = [op.name for op in ops if given and not takes(op)]
        if refused:
            fit = [op.name for op in OPS.values() if takes(op)]
            raise A.UsageError(f"argument {option}: {', '.join(refused)}: {why}; give --ops among "
                               f"{', '.join(fit)}")


def run(args, device, save):
    t0 = time.monotonic()
    names = args.ops or list(OPS)
    ops = [OPS[n] for n in names]
    check_variants(args, ops)
    directions = list(dict.fromkeys(args.directions)) if args.directions else None
    if directions or args.topk:
        ops = [variant(op, directions, args.topk) for op in ops]
    modes = args.modes or list(MODES)
    impls = args.impls or list(IMPLS)
    cfg = config(args, device)
    size_key = "quick" if args.quick else device.type

    def sizes_of(op):
        sizes = square(*args.sizes) if args.sizes else op.sizes[size_key]
        return variant_sizes(op.within(sizes, args.min_n, args.max_n), directions, args.topk)

    machine = machine_info(device)
    ceilings = {}
    if not args.no_floors:
        ceilings = measure_ceilings(device, quick=args.quick, cpp_loop=True)
        print(f"ceilings: {ceilings}", flush=True)
    report = {"baselines": {op.name: op.baseline for op in ops},
              "x_names": {op.name: op.x_name for op in ops},
              "notes": {op.name: op.notes for op in ops if op.notes},
              "method": [f"dtype {args.dtype}; warm-up then repeats (min {cfg.min_repeats}, up to "
                         f"{cfg.max_repeats} or {cfg.repeat_budget_s:g} s); peak extra memory: "
                         f"{PeakMemory(device).method}"]}
    if directions:
        report["method"].append(f"directions {', '.join(directions)}: each op called with direction= the row's, "
                                f"a size's directions side by side; t2i / i2t: ratio of the medians")
    if args.topk:
        report["method"].append(f"relevance: a fastrank.TopKRelevance of {args.topk} random distinct columns a row, "
                                f"random gains in [0, 1), the rest 0 (benchmarks/ops.py random_topk)")
    if args.topk or set(directions or ["both"]) != {"both"}:
        report["method"].append("no floor for one direction or top-k relevance: the ops' models count the dense "
                                "work of both directions")
    conf = {"quick": args.quick, "ops": names, "modes": modes, "impls": impls, "dtype": args.dtype,
            "huge": args.huge, "min_repeats": cfg.min_repeats, "max_repeats": cfg.max_repeats,
            "repeat_budget_s": cfg.repeat_budget_s, "case_limit_s": cfg.case_limit_s,
            "mem_fraction": cfg.mem_fraction, "mem_budget_bytes": cfg.mem_budget_bytes,
            "time_limit_s": args.time_limit, "min_n": args.min_n, "seed": cfg.seed, "threads": args.threads, "order": args.order,
            "directions": directions or ["both"], "topk": args.topk, "sizes": args.sizes}

    def current(records, done):
        annotate(records, {**OPS, **{op.name: op for op in ops}}, ceilings)
        return payload("sweep", device, conf, records, report, machine, t0, ceilings=ceilings,
                       memory_method=PeakMemory(device).method, complete=done)

    gc.freeze()  # torch's many long-lived objects out of the collector's way: gc.collect is cheap
    records = bench_ops(ops, impls, modes, cfg, sizes_of, log=lambda s: print(s, flush=True),
                        order=args.order, skip={"compiled": QUICK_SKIP} if args.quick else None,
                        on_record=lambda recs: save(current(recs, False)))
    if args.huge:
        huge_cfg = dataclasses.replace(cfg, min_repeats=1, max_repeats=1, case_limit_s=1e9, deadline=None,
                                       no_warmup=True)
        records += bench_ops([OPS["fast_rerank_topk"]], ["native"], ["forward"], huge_cfg,
                             lambda op: op.sizes["huge"], log=lambda s: print(s, flush=True))
    return current(records, True)

CASE = Case("sweep", "every op over its sizes, every mode: native vs eager reference, torch.compile, "
                     "chunked; time, peak memory, measured / floor", run,
            choices={"ops": list(OPS), "impls": IMPLS, "modes": MODES})
