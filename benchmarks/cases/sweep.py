"""sweep: every op (ops.py) over its sizes, in every mode: the native kernel against the
eager reference, torch.compile of it and a memory-chunked PyTorch version; time, peak
extra memory, and each native case against its floor (ceilings.py).

    python -m benchmarks sweep                                   # every op, every mode
    python -m benchmarks sweep --ops smooth_ndcg,kendall --impls native,reference --max-n 512
    python -m benchmarks sweep --threads 1 --ops smooth_ndcg --modes forward+backward   # one core
    python -m benchmarks sweep --device cuda --order breadth --huge --time-limit 300

Sizes are the op's for the device (``--quick``: tiny ones, torch.compile not run, a
16 MB memory budget so that a reference that does not fit is shown skipped). Cases are
run and guarded by harness.py. With ``--huge``, fast_rerank_topk also runs once at
100k x 500k (one timed call, no warm-up).
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
from ..ops import OPS
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


def run(args, device, save):
    t0 = time.monotonic()
    names = args.ops or list(OPS)
    ops = [OPS[n] for n in names]
    modes = args.modes or list(MODES)
    impls = args.impls or list(IMPLS)
    cfg = config(args, device)
    size_key = "quick" if args.quick else device.type

    def sizes_of(op):
        return op.within(op.sizes[size_key], args.min_n, args.max_n)

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
    conf = {"quick": args.quick, "ops": names, "modes": modes, "impls": impls, "dtype": args.dtype,
            "huge": args.huge, "min_repeats": cfg.min_repeats, "max_repeats": cfg.max_repeats,
            "repeat_budget_s": cfg.repeat_budget_s, "case_limit_s": cfg.case_limit_s,
            "mem_fraction": cfg.mem_fraction, "mem_budget_bytes": cfg.mem_budget_bytes,
            "time_limit_s": args.time_limit, "min_n": args.min_n, "seed": cfg.seed, "threads": args.threads, "order": args.order}

    def current(records, done):
        annotate(records, OPS, ceilings)
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
