"""cpu_kernels: the smooth-NDCG and kendall_sw CPU kernels without Python, for kernel-only
times and A/B of a kernel change (benchmarks/cpu_driver.cpp).

    python -m benchmarks cpu_kernels                           # this tree, one thread
    git worktree add /tmp/old REV                              # then, A/B in one run:
    python -m benchmarks cpu_kernels --kernel-src /tmp/old/csrc

The case builds cpu_driver.cpp with the CPU module's flags (ceilings.py) and -g against
``csrc/`` (and, with ``--kernel-src``, a second driver against that source tree), then
times each kernel call in rounds, the builds alternating, and reports the median per
call over the rounds. It stays a case of its own because the Python path cannot resolve
what it does: a public call adds ~0.1-0.3 ms of fixed cost with its own spread (autograd,
allocation, validation), the size of kendall_sw's whole backward kernel at N = 512
(~0.12 ms), so a kernel change of a few per cent there is lost in it (NOTES.md). The same
binary serves ``perf record`` with source lines. Skipped (recorded) without a C++ compiler.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from ..case import Case, payload
from ..ceilings import CPU_FLAGS
from ..results import machine_info
from ..timing import summarize

DRIVER = Path(__file__).resolve().parents[1] / "cpu_driver.cpp"
CSRC = Path(__file__).resolve().parents[2] / "csrc"
SOURCES = ("cpu/smooth_ndcg.cpp", "cpu/kendall.cpp", "cpu/kendall_sw.cpp")
OPS = ("smooth_ndcg", "kendall_sw")
PUBLIC = "public call"


def passes_of(op):
    return ["forward"] + (["backward"] if op == "kendall_sw" else [])


def build(csrc: Path, out: Path) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise OSError("no C++ compiler (c++, g++ or $CXX)")
    cmd = [cxx, *CPU_FLAGS, "-g", f"-I{csrc / 'include'}", str(DRIVER), *(str(csrc / s) for s in SOURCES),
           "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise OSError(f"building the driver failed: {proc.stderr.strip()[-300:]}")
    return out


def run_driver(exe: Path, op: str, n: int, reps, rounds: int, threads: int) -> dict:
    """pass -> seconds per call in each round (reps calls per round; None: the driver's
    choice, about 0.4 s of smooth_ndcg per round at any N)."""
    reps = reps or max(1, 200 * 128 ** 3 // n ** 3)
    out = subprocess.run([str(exe), op, str(n), str(reps), str(rounds)], check=True, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": str(threads)}).stdout
    return {line.split()[1]: [float(x) / 1e3 for x in line.split()[3:]]
            for line in out.splitlines() if line.startswith(op)}


def public_call(op: str, n: int, p: str):
    """(setup, call) of the public function doing what the driver's pass does, native,
    same input: smooth_ndcg forward+backward (the kernel's forward includes the gradient
    pass), kendall_sw forward without grad, or its backward after an untimed forward."""
    import fastrank
    g = torch.Generator().manual_seed(0)
    sim = torch.randn(n, n, generator=g).requires_grad_(True)
    rel = torch.rand(n, n, generator=g)
    state = {}
    if op == "smooth_ndcg":
        def call():
            sim.grad = None
            fastrank.smooth_ndcg_loss(sim, rel, 0.01, impl="native").backward()
        return (lambda: None), call
    if p == "forward":
        def call():
            with torch.no_grad():
                fastrank.kendall_sw_loss(sim, rel, impl="native")
        return (lambda: None), call

    def setup():
        sim.grad = None
        state["loss"] = fastrank.kendall_sw_loss(sim, rel, impl="native")
    return setup, lambda: state.pop("loss").backward()


def time_public(op, n, p, reps, rounds) -> list:
    """seconds per call in each round of reps calls (setups untimed)."""
    setup, call = public_call(op, n, p)
    setup()
    call()
    out = []
    for _ in range(rounds):
        total = 0.0
        for _ in range(reps):
            setup()
            t = time.perf_counter()
            call()
            total += time.perf_counter() - t
        out.append(total / reps)
    return out


def run(args, device, save):
    t0 = time.monotonic()
    device = torch.device("cpu")
    machine = machine_info(device)
    threads = args.threads or 1
    sizes = [32] if args.quick else [n for n in (128, 512) if args.max_n is None or n <= args.max_n]
    reps, blocks, rounds = (2, 1, 3) if args.quick else (None, 3, 3)
    trees = {"kernel": CSRC}
    if args.kernel_src:
        trees[f"kernel ({Path(args.kernel_src).resolve().parent.name})"] = Path(args.kernel_src).resolve()
    ops = [op for op in OPS if not args.ops or op in args.ops]
    records, exes, why = [], {}, None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for i, (name, src) in enumerate(trees.items()):
                exes[name] = build(src, Path(tmp) / f"driver{i}")
        except (OSError, subprocess.SubprocessError) as e:
            why = str(e)
        for op in ops:
            for n in sizes:
                times = {}
                for _ in range(blocks):     # the builds and the public call alternate: one load
                    for name, exe in ({} if why else exes).items():   # no driver without a compiler
                        for p, ts in run_driver(exe, op, n, reps, rounds, threads).items():
                            times.setdefault((name, p), []).extend(ts)
                    for p in passes_of(op):
                        r = reps or max(1, 200 * 128 ** 3 // n ** 3)
                        times.setdefault((PUBLIC, p), []).extend(time_public(op, n, p, r, rounds))
                for name in list(trees) + [PUBLIC]:
                    for p in passes_of(op):
                        rec = {"op": op, "impl": name, "mode": p, "size": {"n": n, "m": n}, "size_label": f"{n} x {n}",
                               "x": n, "dtype": "float32", "device": "cpu", "status": "ok", "reason": None,
                               "time": None, "source": str(trees.get(name, "the fastrank module in use"))}
                        if why and name != PUBLIC:
                            rec["status"], rec["reason"] = "skipped", why
                        else:
                            rec["time"] = summarize(times[(name, p)])
                            print(f"{op} {p} {n} x {n} {name}: {rec['time']['median_s'] * 1e3:.4g} ms", flush=True)
                        records.append(rec)
    report = {"baselines": {op: "kernel" for op in ops},
              "ratios": [f"{b}/kernel" for b in list(trees)[1:]] + [f"{PUBLIC}/kernel"],
              "method": [f"the kernels called from C++ (cpu_driver.cpp, CPU module flags and -g), {threads} "
                         f"thread(s); median per call over {blocks * rounds} rounds of back-to-back calls, the "
                         "builds and the public call alternating; smooth_ndcg's forward includes its gradient pass",
                         f"{PUBLIC}: the public function, impl='native', doing the same from Python (smooth_ndcg: "
                         "forward+backward; kendall_sw: forward without grad, backward after an untimed forward)"]}
    conf = {"quick": args.quick, "threads": threads, "trees": {k: str(v) for k, v in trees.items()}}
    return payload("cpu_kernels", device, conf, records, report, machine, t0)


CASE = Case("cpu_kernels", "the smooth_ndcg and kendall_sw CPU kernels called from C++, without Python: "
                           "kernel-only times, A/B against another source tree (--kernel-src)", run, cpu_threads=1,
            choices={"ops": OPS})
