"""smooth_ndcg_loss: native kernels against the pure-PyTorch reference (SPEC 2.1).

    python benchmarks/bench_smooth_ndcg.py            # N = M in 64 .. 2048, forward+backward
    python benchmarks/bench_smooth_ndcg.py --modes forward,backward,forward+backward

Implementations: native (fused C++/CUDA), reference (eager; builds (N, M, M) tensors),
compiled (torch.compile of the reference), chunked (queries in blocks under
torch.utils.checkpoint). direction="both", reduction="mean", tau=0.01.

Work: per direction and pass, N*M*(M-1)/2 sigmoid pairs (one exp each, using
sigma(-x) = 1 - sigma(x)); the forward is one pass (smooth ranks), the backward one more
(it needs the DCG weights of the finished forward). The reference keeps about six
(N, M, M) tensors alive in forward+backward; the native path O(N*M).
"""
if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    import pathlib
    import sys
    _here = pathlib.Path(__file__).resolve()
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _here.parent]
    sys.path.append(str(_here.parents[1]))  # after site-packages: an installed fastrank wins

import torch

import fastrank
from benchmarks import baselines
from benchmarks.harness import OpBench

TAU = 0.01


def make_inputs(size, device, dtype, requires_grad):
    n, m = size["n"], size["m"]
    sim = (torch.rand(n, m, device=device) * 2 - 1).to(dtype).requires_grad_(requires_grad)
    rel = torch.rand(n, m, device=device).to(dtype)
    if n == m:
        rel.fill_diagonal_(1.0)
    return {"sim": sim, "relevance": rel}


def pairs_per_pass(n, m):
    """sigmoid pairs of both directions: N*M*(M-1)/2 + M*N*(N-1)/2."""
    return n * m * (m - 1) / 2 + m * n * (n - 1) / 2


def work(size):
    return size["n"] * size["m"] * (size["n"] + size["m"])


def est_bytes(impl, mode, size, itemsize):
    n, m = size["n"], size["m"]
    cube = n * m * max(n, m) * itemsize          # one (N, M, M) tensor
    units = {"forward": 3, "backward": 4, "forward+backward": 6}[mode]
    flat = 8 * n * m * 4
    if impl in ("reference", "compiled"):
        return units * cube + flat
    if impl == "chunked":
        return units * min(cube, baselines.BLOCK_ELEMENTS * itemsize) + 2 * flat
    return flat


def floor_counts(mode, size, itemsize):
    n, m = size["n"], size["m"]
    passes = {"forward": 1, "backward": 1, "forward+backward": 2}[mode]
    # bytes that must move: read sim and relevance; the backward also writes the gradient
    nbytes = {"forward": 2, "backward": 3, "forward+backward": 3}[mode] * n * m * itemsize
    return {"bytes": nbytes, "exp": passes * pairs_per_pass(n, m)}


SMOOTH_NDCG = OpBench(
    name="smooth_ndcg",
    impls={
        "native": lambda: lambda sim, relevance: fastrank.smooth_ndcg_loss(sim, relevance, TAU, impl="native"),
        "reference": lambda: baselines.reference(fastrank.smooth_ndcg_loss, tau=TAU),
        "compiled": lambda: baselines.compiled(fastrank.smooth_ndcg_loss, tau=TAU),
        "chunked": lambda: baselines.chunked_per_query(fastrank.smooth_ndcg_loss, tau=TAU),
    },
    sizes={
        "cpu": [{"n": n, "m": n} for n in (64, 128, 256, 512, 1024, 2048)],
        "cuda": [{"n": n, "m": n} for n in (256, 512, 1024, 2048, 4096, 8192, 16384)],
        "quick": [{"n": n, "m": n} for n in (16, 128)],
    },
    make_inputs=make_inputs,
    work=work,
    est_bytes=est_bytes,
    floor_counts=floor_counts,
    notes="direction=both, reduction=mean, tau=0.01; floor: N*M*(M-1)/2 exps per direction per pass",
)


if __name__ == "__main__":
    from benchmarks.runner import main
    raise SystemExit(main(default_ops=["smooth_ndcg"], default_modes=["forward+backward"],
                          name_suffix="-smooth_ndcg", description=__doc__.splitlines()[0]))
