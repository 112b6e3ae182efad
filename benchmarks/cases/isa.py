"""isa: every native op at each CPU instruction-set level of the dispatching build, beside a
``-march=native`` build of the same sources, in one run, with the op's floor beside.

    python -m benchmarks isa                     # one thread, N = 128 and 512, 3 rounds
    python -m benchmarks isa --threads 2 --ops smooth_ndcg,kendall

One step is ``sim.grad = None; loss(sim, relevance).backward()`` (percall's step), float32,
direction="both", reduction="mean"; for fast_rerank_topk (no gradient) its forward on N x N
unit embeddings, d = 64, k = 10. Each level this CPU runs is timed in a process of its
own with ``FASTRANK_CPU_ISA=<level>``; the ``native`` column loads a CPU module built with
``FASTRANK_CPU_NATIVE=1`` (``setup.py build_ext`` into a temporary directory; its CMake build
is kept in ``build/cmake-*-native``, so a rerun compiles nothing). The levels are timed in
rounds (3, each in a new order), and every number is the median over the rounds of each
round's median (timing.autorange). ``floor``: the op's exponentials (ops.py) at the one-core
exp rate the ``floors`` case measures (ceilings.py), scaled by the thread count, plus its
matmul flops (fast_rerank_topk) at the measured matmul rate.

``--before DIR``: every column once more for the fastrank checkout DIR (built in place; its
``-march=native`` module built there too), "<level> before", timed in the same rounds, and a
"before / after" ratio per level (> 1: this checkout is faster): a change's effect at each
level, in one run on one machine.

    python -m benchmarks isa --before ../fastrank-main
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

import fastrank
from fastrank.ops import registry

from ..case import Case, payload
from .percall import before_path, before_tree_info
from ..ceilings import measure_ceilings
from ..cli_args import A
from ..ops import OPS, TOPK_D, square
from ..results import machine_info

NATIVE_OPS = tuple(registry.NATIVE_OPS)   # every op with native kernels (the table of losses)
ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import importlib.util, json, sys, torch
args = json.loads(sys.argv[1])
sys.path.insert(0, args["root"])
if args["fastrank_path"]:   # the fastrank of another checkout (--before)
    sys.path.insert(0, args["fastrank_path"])
if args["module"]:   # the -march=native build, in place of the installed CPU module
    spec = importlib.util.spec_from_file_location("fastrank._C_cpu", args["module"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["fastrank._C_cpu"] = mod
import fastrank
from benchmarks.ops import OPS, TOPK_D
from benchmarks.cases.isa import step_mode
from benchmarks.cases.percall import _scalar, _step
from benchmarks.timing import autorange
torch.set_num_threads(args["threads"])
out = {"level": fastrank.backends()["cpu_isa"], "compiler": fastrank.backends()["cpu_compiler"], "times": {},
       "fastrank_file": fastrank.__file__}
for name in args["ops"]:
    op = OPS[name]
    for n in args["sizes"]:
        size = {"n": n, "m": n, "d": TOPK_D}
        torch.manual_seed(0)
        inputs = op.inputs(size, torch.device("cpu"), torch.float32, True)
        fn = op.impls["native"]()
        if step_mode(op) == "forward+backward":
            step = _step(_scalar(op, fn), inputs)
        else:
            step = lambda fn=fn, x=inputs: fn(**x)
        r = autorange(step, torch.device("cpu"), args["sample_s"], args["samples"], min_samples=3, case_s=args["case_s"])
        out["times"][f"{name}/{n}"] = r["time"]
print(json.dumps(out))
"""


def step_mode(op) -> str:
    """What one step times: forward + backward, or the forward of an op without a gradient
    (fast_rerank_topk: its Op's only mode)."""
    return "forward+backward" if "forward+backward" in op.modes else "forward"


def build_native(tmp: Path, root: Path = ROOT) -> Path:
    """The CPU module of the checkout `root` built with -march=native (FASTRANK_CPU_NATIVE=1), into tmp."""
    env = dict(os.environ, FASTRANK_CPU_NATIVE="1", FASTRANK_CUDA="0")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp)], cwd=root, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    (so,) = (tmp / "fastrank").glob("_C_cpu" + sysconfig.get_config_var("EXT_SUFFIX"))
    return so


def run_child(level: str, module, ops, sizes, threads, quick, tree=None) -> dict:
    """One process timing every op at `level`: this checkout's fastrank, or that of `tree`."""
    env = {k: v for k, v in os.environ.items() if k != "FASTRANK_CPU_ISA"}
    env.update(FASTRANK_CPU_ISA=level, OMP_NUM_THREADS=str(threads))
    args = {"module": str(module) if module else None, "root": str(ROOT), "ops": ops, "sizes": sizes,
            "fastrank_path": str(before_path(tree)) if tree else None,
            "threads": threads, "samples": 3 if quick else 9, "sample_s": 0.01 if quick else 0.05,
            "case_s": 0.5 if quick else 3.0}
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"isa: level {level} failed:\n{r.stderr[-3000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if tree and not Path(got["fastrank_file"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"isa: the child imported {got['fastrank_file']}, not the fastrank in {tree}")
    return got


def run(args, device, save):
    t0 = time.monotonic()
    if device.type != "cpu":
        raise A.UsageError("argument --device: isa is a CPU case (--device cpu)")
    threads = args.threads or 1
    torch.set_num_threads(threads)
    machine = machine_info(device)
    ops = [o for o in (args.ops or NATIVE_OPS) if o in NATIVE_OPS]
    # --quick: one small size, every op and level (the run shows the case works, not the levels' speed)
    sizes = [s["n"] for s in square(16)] if args.quick else [128, 512]
    levels = fastrank.backends()["cpu_isa_levels"].split(",")
    before = Path(args.before).resolve() if args.before else None
    ceilings = measure_ceilings(device, quick=args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        # the -march=native column needs a C++ compiler and a checkout to build from; --quick
        # (CI's smoke run, also where an installed wheel is tested without a compiler) leaves it out
        native, native_skipped = {}, "left out by --quick" if args.quick else None
        if not args.quick:
            for tree in [None] + ([before] if before else []):
                try:
                    native[tree] = build_native(Path(tmp) / ("before" if tree else "this"), tree or ROOT)
                except (OSError, subprocess.CalledProcessError) as e:
                    native_skipped = f"the -march=native build failed ({type(e).__name__}: {e})"
                    print(f"isa: {native_skipped}", flush=True)
        # (column, level, -march=native module or None, checkout or None: this one)
        columns = []
        for tree in [None] + ([before] if before else []):
            suffix = " before" if tree else ""
            columns += [(level + suffix, level, None, tree) for level in levels]
            if tree in native:
                columns.append(("native" + suffix, "native", native[tree], tree))
        rounds = 1 if args.quick else 3
        runs = {name: [] for name, *_ in columns}
        compilers = {}
        for r in range(rounds):
            order = columns[r % len(columns):] + columns[:r % len(columns)]
            for name, level, module, tree in order:
                print(f"isa: round {r + 1}/{rounds}, {name}", flush=True)
                got = run_child(level, module, ops, sizes, threads, args.quick, tree)
                compilers[name] = got["compiler"]
                runs[name].append(got["times"])
    records = []
    rate = ceilings["exp_per_s_1core"] * threads
    best = levels[-1]
    for name in ops:
        for n in sizes:
            key = f"{name}/{n}"
            mode = step_mode(OPS[name])
            counts = OPS[name].floor(mode, {"n": n, "m": n, "d": TOPK_D}, 4) if OPS[name].floor else None
            floor = (counts.get("exp", 0) / rate + counts.get("mm_flop", 0) / ceilings["matmul_flops_per_s"]
                     if counts and (counts.get("exp") or counts.get("mm_flop")) else None)
            med = {col: statistics.median(t[key]["median_s"] for t in runs[col]) for col in runs}
            # the timing statistics of the best level's median round (the schema's "time")
            best_rounds = sorted((t[key] for t in runs[best]), key=lambda s: s["median_s"])
            records.append({"op": name, "impl": "native", "status": "ok", "n": n, "mode": mode,
                            "threads": threads, "times_s": med, "time": best_rounds[len(best_rounds) // 2],
                            "rounds": {col: [t[key]["median_s"] for t in runs[col]] for col in runs},
                            "floor_s": floor, "best_level": best,
                            "best_over_native": med[best] / med["native"] if "native" in med else None,
                            "best_over_floor": med[best] / floor if floor else None,
                            "before_over_after": {col: med[f"{col} before"] / med[col] for col in med
                                                  if f"{col} before" in med}})
    report = {"method": [f"one step = sim.grad = None; loss(sim, relevance).backward(), float32, both "
                         f"directions, mean (an op without a gradient: its forward); {threads} thread(s); each level in a "
                         f"process of its own "
                         f"(FASTRANK_CPU_ISA), median of {rounds} rounds' medians",
                         "floor: the op's exponentials (benchmarks/ops.py) / the one-core exp rate x threads, + its matmul flops / the matmul rate"],
              "compilers": compilers, "native_skipped": native_skipped, "table": table(records, list(runs))}
    if before:
        info = before_tree_info(before)
        report["before"] = info
        report["method"].append(f"'<level> before': the fastrank in {info['path']} ({info['commit'] or 'not a git checkout'}), "
                                "built in place, timed in the same rounds; before / after > 1: this checkout is faster")
    print("\n".join(report["table"]))
    return payload("isa", device, {"quick": args.quick, "threads": threads, "ops": ops, "sizes": sizes},
                   records, report, machine, t0, ceilings=ceilings)


def table(records, columns) -> list:
    """The markdown table of the records (docs/benchmarks.md carries it)."""
    ratios = [c for c in columns if f"{c} before" in columns]
    head = (["op", "N"] + [f"{c} ms" for c in columns] + [f"{c} before / after" for c in ratios]
            + ["best / native", "floor ms", "best / floor"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        cells = [r["op"], str(r["n"])] + [f"{r['times_s'][c] * 1e3:.3g}" for c in columns]
        cells += [f"{r['before_over_after'][c]:.2f}" for c in ratios]
        cells.append(f"{r['best_over_native']:.2f}" if r["best_over_native"] else "-")
        cells.append(f"{r['floor_s'] * 1e3:.3g}" if r["floor_s"] else "-")
        cells.append(f"{r['best_over_floor']:.2f}" if r["best_over_floor"] else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


CASE = Case("isa", "every native op at each CPU instruction-set level and a -march=native build, one thread, "
                   "N = 128 and 512, beside the floor", run, cpu_threads=1, choices={"ops": NATIVE_OPS})
