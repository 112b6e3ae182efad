"""The command line: ``python -m benchmarks [CASE ...] [flags]`` and ``python -m benchmarks report``.

    python -m benchmarks --list                  # every case and what it measures
    python -m benchmarks --quick                 # every case at tiny sizes (the CI smoke run)
    python -m benchmarks                         # every case at this device's sizes (long on a CPU)
    python -m benchmarks percall sweep --ops smooth_ndcg
    python -m benchmarks sweep --threads 1 --max-n 512      # one core
    python -m benchmarks report README.md docs/benchmarks.md docs/porting.md docs/training-at-scale.md benchmarks/results   # tables and plots from the JSON
    python -m benchmarks cuda_resources          # every CUDA kernel's registers, spills, occupancy

Each case writes ``<out>/<device>-<date>-<case>[-<tag>].json`` and its ``.md`` and
``.png`` (results.py, report.py). Several cases run one after another, each in its own
process (its own threads, its own memory high-water mark, a crash stays its own).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

RESULTS = Path(__file__).resolve().parent / "results"


def _csv(s: str) -> List[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def parser(case_names) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:9]))
    p.add_argument("cases", nargs="*", metavar="CASE", help=f"cases to run (default: all): {', '.join(case_names)}")
    p.add_argument("--list", action="store_true", help="print every case and what it measures, then exit")
    g = p.add_argument_group("every case")
    g.add_argument("--quick", action="store_true", help="tiny sizes, few repeats, no torch.compile: seconds per case")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, or auto (cuda when available)")
    g.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch and fastrank's OpenMP kernels (default: all; percall: 1)")
    g.add_argument("--out", type=Path, default=None,
                   help=f"output folder (default {RESULTS}; --quick: {RESULTS / 'quick'}, not tracked by git)")
    g.add_argument("--tag", default=None, help="file name suffix: <device>-<date>-<case>-<tag> (--quick: quick)")
    g.add_argument("--time-limit", type=float, default=None, help="seconds per case; later cells are skipped")
    g.add_argument("--ops", type=_csv, default=None, help="sweep, percall: comma-separated ops (ops.py)")
    g.add_argument("--impls", type=_csv, default=None, help="comma-separated implementations / columns")
    g.add_argument("--max-n", type=int, default=None, help="only the sizes with N <= this")
    g.add_argument("--min-n", type=int, default=None, help="only the sizes with N >= this")
    g.add_argument("--no-plots", action="store_true")
    g = p.add_argument_group("sweep")
    g.add_argument("--modes", type=_csv, default=None, help="forward+backward, forward, backward")
    g.add_argument("--order", default="depth", choices=("depth", "breadth"),
                   help="depth: mode, op, then its sizes; breadth: every op's smallest size first, so a "
                        "--time-limit cuts large sizes, not ops")
    g.add_argument("--huge", action="store_true", help="also fast_rerank_topk at 100k x 500k (one call)")
    g.add_argument("--case-limit", type=float, default=None, help="skip a cell predicted to take longer (s)")
    g.add_argument("--repeat-budget", type=float, default=None, help="seconds of timed repeats per cell")
    g.add_argument("--min-repeats", type=int, default=None)
    g.add_argument("--max-repeats", type=int, default=None)
    g.add_argument("--mem-fraction", type=float, default=0.5, help="of the free memory, per cell (default 0.5)")
    g.add_argument("--mem-budget-gb", type=float, default=None, help="hard cap on one cell's memory")
    g.add_argument("--no-floors", action="store_true", help="do not measure the ceilings")
    g = p.add_argument_group("percall")
    g.add_argument("--samples", type=int, default=None, help="samples per cell (default 25)")
    g.add_argument("--sample-time", type=float, default=None, help="seconds per sample of k calls (default 0.02)")
    g.add_argument("--case-time", type=float, default=None, help="seconds of sampling per cell (default 5)")
    g.add_argument("--before", default=None, metavar="DIR",
                   help="percall, isa: also time the native step of the fastrank checkout DIR (built in place) "
                        "beside this one")
    g = p.add_argument_group("metrics")
    g.add_argument("--n-images", type=int, default=None, help="images (captions: 5x); default 5000")
    g = p.add_argument_group("scale")
    g.add_argument("--chunk", type=int, default=None, help="gradient-caching chunk (default: 128 text, 256 image)")
    g.add_argument("--towers", type=_csv, default=None, help="text, image (default: both; --quick: image)")
    g.add_argument("--sizes", type=lambda s: [int(x) for x in _csv(s)], default=None,
                   help="batch sizes (default: 256..8192 image, 256, 1024, 4096, 8192 text)")
    g = p.add_argument_group("quality")
    g.add_argument("--full", action="store_true", help="the full setting (5 splits, twice the steps: ~40 min on one core)")
    g.add_argument("--splits", type=int, default=None, help="splits (default: 2; --full: 5)")
    g.add_argument("--steps", type=int, default=None, help="training steps per loss (default: 20; --full: 40)")
    g = p.add_argument_group("cpu_kernels")
    g.add_argument("--kernel-src", default=None, metavar="CSRC",
                   help="A/B: also build the kernels of this csrc/ folder (e.g. of a git worktree at REV)")
    return p


def _set_threads(argv: List[str]) -> Optional[int]:
    """--threads N, applied before torch and fastrank load their OpenMP runtimes."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=None)
    threads = pre.parse_known_args(argv)[0].threads
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


def _device_type(argv: List[str], torch) -> str:
    """--device's type (auto: cuda when torch sees one), before the full parse."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--device", default="auto")
    device = pre.parse_known_args(argv)[0].device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch sees no CUDA device")
    return device.split(":")[0]


def main(argv: Optional[List[str]] = None, launcher: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        from . import report
        return report.main(argv[1:])
    if argv[:1] == ["cuda_resources"]:
        from . import cuda_resources
        return cuda_resources.main(argv[1:])
    threads = _set_threads(argv)
    import torch
    if threads:
        torch.set_num_threads(threads)
    measures = not {"--list", "-h", "--help"} & set(argv)
    if measures:   # before the cases import fastrank: the one measured has its native module
        from . import subject
        device_type = _device_type(argv, torch)
        measured = subject.choose(device_type)
    from .cases import CASES
    if measures:
        subject.confirm(device_type)

    args = parser(list(CASES)).parse_args(argv)
    args.out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    if args.list:
        width = max(len(n) for n in CASES)
        for name, case in CASES.items():
            print(f"{name:<{width}}  benchmarks/cases/{name}.py\n{'':<{width}}  {case.about}")
        return 0
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; choose from {', '.join(CASES)} (--list says what each measures)")
    names = args.cases or list(CASES)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch sees no CUDA device")
    case = CASES[names[0]]
    wants = case.cpu_threads if device.type == "cpu" and args.threads is None else None
    if len(names) == 1 and not wants:   # this process measures (run_each's children say it themselves)
        print(f"benchmarks: {measured}", flush=True)
        return run_case(case, args, device)
    return run_each(names, argv, args, device, launcher or [sys.executable, "-m", "benchmarks"], CASES)


def run_each(names, argv, args, device, launcher, cases) -> int:
    """Every case in a process of its own; the exit status is the first failure's."""
    rest = [a for a in argv if a not in cases]
    status, t0 = 0, time.monotonic()
    for name in names:
        extra = []
        if args.threads is None and device.type == "cpu" and cases[name].cpu_threads:
            extra = ["--threads", str(cases[name].cpu_threads)]
        print(f"\n=== {name}: {cases[name].about}", flush=True)
        t = time.monotonic()
        rc = subprocess.run(launcher + [name] + rest + extra).returncode
        print(f"=== {name}: exit {rc} after {time.monotonic() - t:.1f} s", flush=True)
        status = status or rc
    print(f"\n{len(names)} case(s) in {time.monotonic() - t0:.1f} s", flush=True)
    return status


def run_case(case, args, device) -> int:
    import faulthandler
    import gc

    from . import report, results

    faulthandler.enable()  # a crash in a kernel prints the Python stack of the cell
    tag = args.tag if args.tag is not None else ("quick" if args.quick else "")
    paths = {}

    def save(payload):
        path = args.out / (results.stem(payload["device"], case.name, tag) + ".json")
        results.write_json(path, payload)
        paths["json"] = path

    payload = case.run(args, device, save)
    save(payload)
    gc.unfreeze()
    written = [paths["json"]] + report.render_result(paths["json"], plot=not args.no_plots)
    print("\n" + report.result_markdown(paths["json"]))
    print("wrote: " + ", ".join(str(p) for p in written), flush=True)
    return 0
