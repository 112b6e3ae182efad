"""Retrieval-metric timings on COCO-5K-sized random input: the README's metrics table.

    python benchmarks/bench_metrics.py              # 5000 x 25000 float32, as in the README
    python benchmarks/bench_metrics.py --quick      # 500 x 2500: a few seconds, checks it runs
    python benchmarks/bench_metrics.py --repeats 3 --threads 2 --json out.json

Input: `sim` and `relevance` uniform random (seeded) float32 (n_images, 5 n_images)
matrices, caption j belonging to image j // 5 (COCO's 5 captions per image), `cs_k=(100,)`.
Every call runs once untimed first (warm-up: thread pools, first-call allocations), then
`--repeats` times; the table shows the median wall time (`time.perf_counter`) and the
median CPU time of the process (`time.process_time`, all threads: with 2 cores busy it
approaches twice the wall time). Metrics run on the CPU only, as in the README.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: an installed fastrank wins over the checkout
    import pathlib
    _here = pathlib.Path(__file__).resolve()
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _here.parent]
    sys.path.append(str(_here.parents[1]))

import fastrank.metrics as M


def calls(sim, c2i, rel, cs_k):
    """(label as in the README, function) for every timed call."""
    return [
        ("`recall_at_k`", lambda: M.recall_at_k(sim, c2i)),
        ("`evaluate` without relevance (R@K, medr, meanr, mAP@R, R-P)",
         lambda: M.evaluate(sim, c2i, cs_k=cs_k)),
        ("`ndcg`", lambda: M.ndcg(sim, rel)),
        ("`kendall_tau`", lambda: M.kendall_tau(sim, rel)),
        (f"`coherent_score(k={cs_k[0]})`", lambda: M.coherent_score(sim, rel, k=cs_k[0])),
        ("`evaluate` with relevance (all of the above, one sort shared)",
         lambda: M.evaluate(sim, c2i, relevance=rel, cs_k=cs_k)),
        ("`coco_5fold_1k` with relevance", lambda: M.coco_5fold_1k(sim, c2i, relevance=rel, cs_k=cs_k)),
    ]


def measure(fn, repeats):
    fn()  # warm-up
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def fmt(sec):
    return f"{sec * 1e3:.0f} ms" if sec < 0.1 else f"{sec:.2f} s" if sec < 1 else f"{sec:.1f} s"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-images", type=int, default=5000, help="images; captions = 5 x images (default 5000)")
    ap.add_argument("--quick", action="store_true", help="500 images x 2500 captions, one repeat")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls per metric (median), default 1")
    ap.add_argument("--cs-k", type=int, default=100)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results as JSON to this path")
    args = ap.parse_args(argv)
    n = 500 if args.quick else args.n_images
    if args.threads:
        torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(args.seed)
    sim = torch.rand(n, 5 * n, generator=g)
    rel = torch.rand(n, 5 * n, generator=g)
    c2i = torch.arange(5 * n) // 5
    cs_k = (min(args.cs_k, n),)

    env = (f"{n} x {5 * n} float32 `sim` and `relevance`, `cs_k=({cs_k[0]},)`, CPU; "
           f"torch {torch.__version__}, NumPy {np.__version__}, {torch.get_num_threads()} threads, "
           f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
           f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}, "
           f"median of {args.repeats} after one warm-up call")
    print(env, flush=True)
    print("\n| call | wall | CPU time |\n| --- | --- | --- |", flush=True)
    rows = []
    for label, fn in calls(sim, c2i, rel, cs_k):
        wall, cpu = measure(fn, args.repeats)
        rows.append({"call": label, "wall_s": wall, "cpu_s": cpu})
        print(f"| {label} | {fmt(wall)} | {fmt(cpu)} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setup": env, "n_images": n, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
