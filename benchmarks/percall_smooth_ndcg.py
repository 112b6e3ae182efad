"""Per-call host cost of smooth_ndcg_loss at a tiny size (issue 11), one CPU thread.

    OMP_NUM_THREADS=1 python benchmarks/percall_smooth_ndcg.py [--n 4] [--repeat 7]

Forward+backward of: the trivial autograd op ``(sim * relevance).mean()`` (the yardstick:
the target is <= 3x it), the public call (eager path = autograd.Function), the same
kernels through the torch.library custom op (the torch.compile path, called eagerly),
and the pure-PyTorch reference. The cases are interleaved, --repeat rounds of --number
calls each, and the least thread CPU time per call is kept (robust on a shared machine).
"""
if __package__ in (None, ""):
    import pathlib
    import sys
    sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))

import argparse
import time

import torch

import fastrank
from fastrank.ops.smooth_ndcg import smooth_ndcg_op


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--number", type=int, default=500)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    sim = torch.randn(args.n, args.n, generator=g).requires_grad_(True)
    rel = torch.rand(args.n, args.n, generator=g)

    cases = {
        "(sim * relevance).mean().backward()": lambda: (sim * rel).mean().backward(),
        "smooth_ndcg_loss (autograd.Function)": lambda: fastrank.smooth_ndcg_loss(sim, rel).backward(),
        "smooth_ndcg_loss, mask=all True": (
            lambda m=torch.ones(args.n, args.n, dtype=torch.bool):
            fastrank.smooth_ndcg_loss(sim, rel, mask=m).backward()),
        "custom op fastrank::smooth_ndcg": lambda: smooth_ndcg_op(sim, rel, None, 0.01, 3, 1)[0].backward(),
        "reference (impl='reference')": lambda: fastrank.smooth_ndcg_loss(sim, rel, impl="reference").backward(),
    }
    best = {name: float("inf") for name in cases}
    for fn in cases.values():
        fn()
    for _ in range(args.repeat):
        for name, fn in cases.items():
            t0 = time.thread_time()
            for _ in range(args.number):
                fn()
            best[name] = min(best[name], (time.thread_time() - t0) / args.number)
    print(f"N = M = {args.n}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    base = best[next(iter(cases))]
    for name, t in best.items():
        print(f"{name:40s} {t * 1e6:8.1f} us  ({t / base:4.2f}x)")

if __name__ == "__main__":
    main()
