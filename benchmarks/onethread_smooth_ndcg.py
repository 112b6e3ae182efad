"""One-thread CPU speed of smooth_ndcg_loss (issue 12, CPU half): native vs the eager
reference and vs the CPU floor (the measured one-core vector exp rate).

    OMP_NUM_THREADS=1 python benchmarks/onethread_smooth_ndcg.py [--sizes 128,512] [--no-reference]

Forward+backward, float32, direction="both", reduction="mean", tau=0.01. The floor is
2 passes x (N*M*(M-1)/2 + M*N*(N-1)/2) exps (each unordered pair once per pass) over the
one-thread exp rate of benchmarks/floors.py (numpy's or torch's vector exp). Best of
--repeat runs, in thread CPU time (robust on a shared machine).
"""
if __package__ in (None, ""):
    import pathlib
    import sys
    sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))

import argparse
import time

import torch

import fastrank

def best(fn, repeat):
    """Least CPU time of the calling thread over `repeat` calls (one thread: CPU time is
    what the call costs, without the scheduler's waits on a loaded machine)."""
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        ts.append(time.thread_time() - t0)
    return min(ts)


def exp_rate():
    """One-thread vector exp rate: the faster of numpy.exp and torch.exp on a
    cache-resident float32 array (as benchmarks/floors.py), timed in thread CPU time."""
    import numpy as np
    x = torch.rand(1 << 16) * -10
    out = torch.empty_like(x)
    xn, outn = x.numpy(), out.numpy()
    t_torch = best(lambda: [torch.exp(x, out=out) for _ in range(20)], 30) / 20
    t_numpy = best(lambda: [np.exp(xn, out=outn) for _ in range(20)], 30) / 20
    t, which = min((t_torch, "torch.exp"), (t_numpy, "numpy.exp"))
    return x.numel() / t, which


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,512")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--mask", type=float, default=None, help="also time with a random mask keeping this fraction")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rate, which = exp_rate()
    print(f"one-thread exp rate: {rate / 1e9:.2f} G/s ({which}); torch threads {torch.get_num_threads()}, "
          f"fastrank OpenMP threads {fastrank.backends().get('cpu_openmp_threads')}")
    for n in (int(s) for s in args.sizes.split(",")):
        g = torch.Generator().manual_seed(n)
        sim = torch.randn(n, n, generator=g).requires_grad_(True)
        rel = torch.rand(n, n, generator=g)
        floor = 2 * (n * n * (n - 1) / 2) * 2 / rate
        nat = best(lambda: fastrank.smooth_ndcg_loss(sim, rel, 0.01, impl="native").backward(), args.repeat)
        line = f"N = {n:5d}: native {nat * 1e3:9.2f} ms = {nat / floor:5.2f}x floor ({floor * 1e3:.2f} ms)"
        if args.mask is not None:
            mask = torch.rand(n, n, generator=g) < args.mask
            nm = best(lambda: fastrank.smooth_ndcg_loss(sim, rel, 0.01, impl="native", mask=mask).backward(),
                      args.repeat)
            line += f"; mask {args.mask:.2f} kept: {nm * 1e3:.2f} ms"
        if not args.no_reference:
            ref = best(lambda: fastrank.smooth_ndcg_loss(sim, rel, 0.01, impl="reference").backward(),
                       max(1, args.repeat // 2) if n <= 256 else 1)
            line += f"; reference {ref * 1e3:9.2f} ms = {ref / nat:6.1f}x native"
        print(line, flush=True)


if __name__ == "__main__":
    main()
