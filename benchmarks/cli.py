"""The command line: ``python -m benchmarks [CASE ...] [flags]`` and ``python -m benchmarks report``.

    python -m benchmarks --list                  # every case and what it measures
    python -m benchmarks --quick                 # every case at tiny sizes (the CI smoke run)
    python -m benchmarks                         # every case at this device's sizes (long on a CPU)
    python -m benchmarks percall sweep --ops smooth_ndcg
    python -m benchmarks sweep --threads 1 --max-n 512      # one core
    python -m benchmarks report README.md docs/benchmarks.md docs/porting.md docs/training-at-scale.md benchmarks/results   # tables and plots from the JSON
    python -m benchmarks cuda_resources          # every CUDA kernel's registers, spills, occupancy
    python -m benchmarks gpu_tests --junit cuda-tests.xml --out DIR   # a GPU run's CUDA test counts as a result

Each case writes ``<out>/<device>-<date>-<case>[-<tag>].json`` and its ``.md`` and
``.png`` (results.py, report.py), only when it measured something, and never over a result
of that name that git tracks (give ``--tag``, or ``--force``); what it saves along the way is
``<name>.partial.json``. Several cases run one after another, each in its own process (its
own threads, its own memory high-water mark, a crash stays its own). A user's mistake is one
line and exit status 2, before anything runs (cli_args.py).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from .cli_args import A

RESULTS = Path(__file__).resolve().parent / "results"


PROG = "python -m benchmarks"


def parser(case_names=()) -> argparse.ArgumentParser:
    """Every option of every case; a bad value is one line and exit status 2 (cli_args.py).
    What depends on the case (the names --ops, --impls, --modes, --towers take) is checked
    after parsing, against the case's ``choices`` (case.py)."""
    p = A.Parser(prog=PROG, description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                 epilog="\n".join(__doc__.splitlines()[2:10]))
    p.add_argument("cases", nargs="*", metavar="CASE",
                   help=f"cases to run (default: all): {', '.join(case_names) or 'see --list'}")
    p.add_argument("--list", action="store_true", help="print every case and what it measures, then exit")
    g = p.add_argument_group("every case")
    g.add_argument("--quick", action="store_true", help="tiny sizes, few repeats, no torch.compile: seconds per case")
    g.add_argument("--device", default="auto", type=A.device, help="cpu, cuda, cuda:1, or auto (cuda when available)")
    g.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    g.add_argument("--threads", type=A.positive_int, default=None,
                   help="CPU threads for torch and fastrank's OpenMP kernels (default: all; percall: 1)")
    g.add_argument("--out", type=A.out_dir, default=None,
                   help=f"output folder (default {RESULTS}; --quick: {RESULTS / 'quick'}, not tracked by git)")
    g.add_argument("--tag", type=A.name, default=None,
                   help="file name suffix: <device>-<date>-<case>-<tag> (--quick: quick)")
    g.add_argument("--force", action="store_true",
                   help="replace a result file of the same name that git tracks (else: refused; give --tag)")
    g.add_argument("--time-limit", type=A.positive_float, default=None,
                   help="seconds per case; later cells are skipped")
    g.add_argument("--ops", type=A.csv(), default=None,
                   help="sweep, percall: comma-separated ops (ops.py); loss_scale: its series")
    g.add_argument("--impls", type=A.csv(), default=None, help="comma-separated implementations / columns")
    g.add_argument("--max-n", type=A.positive_int, default=None, help="only the sizes with N <= this")
    g.add_argument("--min-n", type=A.positive_int, default=None, help="only the sizes with N >= this")
    g.add_argument("--no-plots", action="store_true")
    g = p.add_argument_group("sweep")
    g.add_argument("--modes", type=A.csv(), default=None, help="forward+backward, forward, backward")
    g.add_argument("--order", default="depth", choices=("depth", "breadth"),
                   help="depth: mode, op, then its sizes; breadth: every op's smallest size first, so a "
                        "--time-limit cuts large sizes, not ops")
    g.add_argument("--huge", action="store_true", help="also fast_rerank_topk at 100k x 500k (one call)")
    g.add_argument("--case-limit", type=A.positive_float, default=None,
                   help="skip a cell predicted to take longer (s)")
    g.add_argument("--repeat-budget", type=A.nonnegative_float, default=None,
                   help="seconds of timed repeats per cell")
    g.add_argument("--min-repeats", type=A.positive_int, default=None)
    g.add_argument("--max-repeats", type=A.positive_int, default=None)
    g.add_argument("--mem-fraction", type=A.fraction, default=0.5,
                   help="of the free memory, per cell (default 0.5)")
    g.add_argument("--mem-budget-gb", type=A.positive_float, default=None, help="hard cap on one cell's memory")
    g.add_argument("--no-floors", action="store_true", help="do not measure the ceilings")
    g.add_argument("--directions", type=A.csv(choices=("i2t", "t2i", "both")), default=None,
                   help="i2t, t2i, both: each op that takes a direction once per direction given, the rows side "
                        "by side with t2i / i2t (default: both, as one call)")
    g.add_argument("--topk", type=A.positive_int, default=None, metavar="K",
                   help="the graded ops that take a fastrank.TopKRelevance (smooth_ndcg, kendall) get one of K "
                        "random columns a row with random gains instead of the dense relevance")
    g = p.add_argument_group("percall")
    g.add_argument("--samples", type=A.positive_int, default=None, help="samples per cell (default 25)")
    g.add_argument("--sample-time", type=A.positive_float, default=None,
                   help="seconds per sample of k calls (default 0.02)")
    g.add_argument("--case-time", type=A.positive_float, default=None,
                   help="seconds of sampling per cell (default 5)")
    g.add_argument("--before", type=A.existing_dir, default=None, metavar="DIR",
                   help="percall, isa: also time the native step of the fastrank checkout DIR (built in place) "
                        "beside this one")
    g.add_argument("--sweep-sizes", action="store_true",
                   help="percall: at the sweep case's sizes for the device instead of the training batches "
                        "(with --before: the sweep's before / after, a step at a time)")
    g = p.add_argument_group("metrics")
    g.add_argument("--n-images", type=A.positive_int, default=None, help="images (captions: 5x); default 5000")
    g = p.add_argument_group("scale")
    g.add_argument("--chunk", type=A.positive_int, default=None,
                   help="gradient-caching chunk (default: 128 text, 256 image)")
    g.add_argument("--towers", type=A.csv(), default=None, help="text, image (default: both; --quick: image)")
    g.add_argument("--sizes", type=A.csv(A.positive_int), default=None,
                   help="scale: batch sizes (default: 256..8192 image, 256, 1024, 4096, 8192 text); "
                        "loss_scale: n (default 1024..32768); sweep: N = M instead of each op's sizes "
                        "(the ops of N x N sizes)")
    g = p.add_argument_group("quality")
    g.add_argument("--full", action="store_true",
                   help="the full setting (5 splits, K = 3, 6, 12, 25, the hyper-parameter search: ~4 h on 2 cores)")
    g.add_argument("--splits", type=A.positive_int, default=None, help="splits (default: 2; --full: 5)")
    g.add_argument("--steps", type=A.positive_int, default=None, help="bi-encoder training steps per loss (default: 20)")
    g.add_argument("--lengths", type=A.csv(A.integer(2, 25)), default=None,
                   help="Lee documents per bi-encoder step, 2 to 25 (its train half), e.g. 3,6,12,25 "
                        "(default: 6,25; --full: 3,6,12,25)")
    g.add_argument("--workers", type=A.positive_int, default=None, help="worker processes of one thread each (default 2)")
    g.add_argument("--resume", action="store_true",
                   help="reuse the finished jobs of a cut run of the same setting and tag (its job log in --out)")
    g = p.add_argument_group("cpu_kernels")
    g.add_argument("--kernel-src", type=A.existing_dir, default=None, metavar="CSRC",
                   help="A/B: also build the kernels of this csrc/ folder (e.g. of a git worktree at REV)")
    return p


#: pairs of options where the first may not exceed the second
_ORDERED = (("min_n", "max_n"), ("min_repeats", "max_repeats"))


def check(args, cases) -> List[str]:
    """The cases to run, after what parsing cannot check: their names, the names each case
    takes in --ops / --impls / ... (``Case.choices``) and the bounds given in pairs
    (UsageError, before anything is measured)."""
    unknown = A.unknown(args.cases, list(cases))
    if unknown:
        raise A.UsageError(f"argument CASE: {unknown} (--list says what each measures)")
    names = args.cases or list(cases)
    for name in names:
        for dest, allowed in cases[name].choices.items():
            values = getattr(args, dest)
            why = A.unknown(values, allowed) if values is not None else None
            if why:
                raise A.UsageError(f"argument --{dest.replace('_', '-')}: {why} (for the {name} case)")
    for low, high in _ORDERED:
        lo, hi = getattr(args, low), getattr(args, high)
        if lo is not None and hi is not None and lo > hi:
            raise A.UsageError(f"argument --{low.replace('_', '-')}: {lo} is above --{high.replace('_', '-')} {hi}")
    return names


def _case_names() -> List[str]:
    from .cases import CASES
    return list(CASES)


@A.command
def main(argv: Optional[List[str]] = None, launcher: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        from . import report
        return report.main(argv[1:])
    if argv[:1] == ["cuda_resources"]:
        from .cuda import resources
        return resources.main(argv[1:])
    if argv[:1] == ["gpu_tests"]:
        from . import gpu_tests
        return gpu_tests.main(argv[1:])
    # every option's type and range, before torch and fastrank load (--help lists the cases)
    args = parser(_case_names() if {"-h", "--help"} & set(argv) else ()).parse_args(argv)
    if args.threads:   # before torch and fastrank load their OpenMP runtimes
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.list:
        from .cases import CASES
        width = max(len(n) for n in CASES)
        for name, case in CASES.items():
            print(f"{name:<{width}}  {case.source}\n{'':<{width}}  {case.about}")
        return 0
    with A.usage_errors(PROG):
        A.check_cuda(args.device)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    from . import subject   # before the cases import fastrank: the one measured has its native module
    measured = subject.choose(device.type)
    from .cases import CASES
    subject.confirm(device.type)
    from . import results
    args.out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    tag = args.tag if args.tag is not None else ("quick" if args.quick else "")
    stems = {}
    with A.usage_errors(PROG):
        names = check(args, CASES)
        lacks = CASES[names[0]].lacks() if len(names) == 1 else None
        if lacks:
            raise A.UsageError(f"{names[0]} needs {lacks}")
        for name in names:   # a committed result is never replaced unnoticed
            stems[name] = results.stem(device, name, tag)
            target = args.out / (stems[name] + ".json")
            if not args.force and results.committed(target):
                raise A.UsageError(f"{target} is a committed result of that name; give --tag NAME to write beside "
                                   f"it, or --force to replace it")
    case = CASES[names[0]]
    wants = case.cpu_threads if device.type == "cpu" and args.threads is None else None
    if len(names) == 1 and not wants:   # this process measures (run_each's children say it themselves)
        print(f"benchmarks: {measured}", flush=True)
        return run_case(case, args, device, stems[case.name])
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
        lacks = cases[name].lacks()
        if lacks:   # an optional dependency not installed: not a failure of the run
            print(f"=== {name}: skipped, it needs {lacks}", flush=True)
            continue
        t = time.monotonic()
        rc = subprocess.run(launcher + [name] + rest + extra).returncode
        print(f"=== {name}: exit {rc} after {time.monotonic() - t:.1f} s", flush=True)
        status = status or rc
    print(f"\n{len(names)} case(s) in {time.monotonic() - t0:.1f} s", flush=True)
    return status


def run_case(case, args, device, stem: str) -> int:
    """Run one case in this process and write its files: ``<out>/<stem>.json`` (and its
    .md, .png) when the run measured something and is complete. What the case saves along
    the way goes to ``<stem>.partial.json`` (``complete: false``), removed once the result is
    written; a run that measured nothing writes nothing and exits with status 1."""
    import faulthandler
    import gc

    from . import report, results

    faulthandler.enable()  # a crash in a kernel prints the Python stack of the cell
    path = args.out / (stem + ".json")
    partial = results.partial_path(path)

    def save(payload):
        if results.measured(payload):
            results.write_json(partial, {**payload, "complete": False})

    with A.usage_errors(f"{PROG} {case.name}", errors=()):   # a case's own checks, before it measures
        payload = case.run(args, device, save)
    gc.unfreeze()
    if not results.measured(payload):
        partial.unlink(missing_ok=True)
        print(f"{case.name}: measured nothing ({results.why_nothing(payload)}); no result file written",
              file=sys.stderr, flush=True)
        return 1
    if not payload.get("complete", True):
        save(payload)
        print(f"{case.name}: the run is incomplete; kept {partial} (not a result)", file=sys.stderr, flush=True)
        return 1
    results.write_json(path, payload)
    partial.unlink(missing_ok=True)
    written = [path] + report.render_result(path, plot=not args.no_plots)
    print("\n" + report.result_markdown(path))
    print("wrote: " + ", ".join(str(p) for p in written), flush=True)
    return 0
