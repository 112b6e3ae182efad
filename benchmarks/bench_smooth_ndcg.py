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


import fastrank
from benchmarks import baselines
from benchmarks.harness import OpBench
from benchmarks.pairwise import cubic_est_bytes, cubic_work, make_inputs, pair_count, rw_bytes

TAU = 0.01


def floor_counts(mode, size, itemsize):
    n, m = size["n"], size["m"]
    passes = {"forward": 1, "backward": 1, "forward+backward": 2}[mode]
    return {"bytes": rw_bytes(mode, n, m, itemsize), "exp": passes * pair_count(n, m)}


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
    work=cubic_work,
    est_bytes=cubic_est_bytes,
    floor_counts=floor_counts,
    notes="direction=both, reduction=mean, tau=0.01; floor: N*M*(M-1)/2 exps per direction per pass",
)


if __name__ == "__main__":
    from benchmarks.runner import main
    raise SystemExit(main(default_ops=["smooth_ndcg"], default_modes=["forward+backward"],
                          name_suffix="-smooth_ndcg", description=__doc__.splitlines()[0]))
