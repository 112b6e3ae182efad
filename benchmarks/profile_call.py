"""One native call of an op under a profiler's capture range, for Nsight Compute:

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \\
        python benchmarks/profile_call.py smooth_ap 4096 --direction t2i --dtype float32

The op's inputs are the benchmark's (ops.py) at N x N; a warm-up call runs first (lazy
initialisation, first-call allocations), then one forward+backward between
cudaProfilerStart and cudaProfilerStop, so that ncu sees only that call's kernels.
gpu_check.sh runs it for the kernels whose timings were furthest from their floors.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the benchmarks package next to an installed fastrank
    sys.path.append(str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import fastrank  # noqa: E402
from benchmarks.cli_args import A  # noqa: E402
from benchmarks.ops import OPS, takes_direction  # noqa: E402


def losses():
    """The ops of ops.py that are fastrank losses with a direction."""
    return [name for name, op in OPS.items() if takes_direction(op)]


def parser() -> A.Parser:
    ap = A.Parser(prog="python benchmarks/profile_call.py", description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=losses())
    ap.add_argument("n", type=A.positive_int)
    ap.add_argument("--direction", default="both", choices=("i2t", "t2i", "both"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16", "float64"))
    ap.add_argument("--device", default="cuda", type=A.device, help="cuda (cpu: the same call, no capture range)")
    return ap


@A.command
def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    with A.usage_errors(ap.prog):
        A.check_cuda(args.device)
    op = OPS[args.op]
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    inputs = op.inputs({"n": args.n, "m": args.n}, device, getattr(torch, args.dtype), True)
    fn = functools.partial(op.impls["native"](), direction=args.direction)

    def call():
        inputs["sim"].grad = None
        fn(**inputs).backward()

    call()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    call()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(f"{args.op} N={args.n} direction={args.direction} dtype={args.dtype}: profiled one call of "
          f"fastrank {fastrank.__version__}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
