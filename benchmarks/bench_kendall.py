"""kendall_loss and kendall_sw_loss: native kernels against the pure-PyTorch reference
(SPEC 2.2 and 2.3).

    python benchmarks/bench_kendall.py                 # both ops, forward+backward
    python benchmarks/bench_kendall.py --ops kendall_sw --modes forward

Implementations: native, reference (eager, ``impl="reference"``), compiled
(torch.compile of the reference), chunked (queries in blocks under checkpoint).
direction="both", reduction="mean", default hyper-parameters (alpha=0.1; SW: beta=0.05,
label_range=(0, 1), so M_w = 18 windows).

Floors. kendall: N*M*(M-1)/2 unordered pairs per direction (at most one of (j, k), (k, j)
is active, since r_j > r_k + alpha excludes the reverse), ~4 fp32 instructions each
(difference, compare, hinge, accumulate), one pass: the hinge's gradient is known during
the forward, so forward+backward needs no second pass over the pairs.
kendall_sw: bytes-bound: read sim and relevance once (~4 fp32 instructions per element
and direction with a one-pass window scan); the gradient is sparse but the dense
gradient matrix must be written.
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

WINDOWS = 18  # round((1 - 0 - 0.1) / 0.05) with the default label_range, alpha and beta


def make_inputs(size, device, dtype, requires_grad):
    n, m = size["n"], size["m"]
    sim = (torch.rand(n, m, device=device) * 2 - 1).to(dtype).requires_grad_(requires_grad)
    rel = torch.rand(n, m, device=device).to(dtype)
    if n == m:
        rel.fill_diagonal_(1.0)
    return {"sim": sim, "relevance": rel}


def work_cubic(size):
    return size["n"] * size["m"] * (size["n"] + size["m"])


def work_sw(size):
    return WINDOWS * size["n"] * size["m"]


def _rw_bytes(mode, n, m, itemsize):
    # read sim and relevance; the backward also writes the gradient
    return {"forward": 2, "backward": 3, "forward+backward": 3}[mode] * n * m * itemsize


def est_kendall(impl, mode, size, itemsize):
    n, m = size["n"], size["m"]
    cube = n * m * max(n, m) * itemsize
    units = {"forward": 3, "backward": 4, "forward+backward": 6}[mode]
    flat = 8 * n * m * 4
    if impl in ("reference", "compiled"):
        return units * cube + flat
    if impl == "chunked":
        return units * min(cube, baselines.BLOCK_ELEMENTS * itemsize) + 2 * flat
    return flat


def floor_kendall(mode, size, itemsize):
    n, m = size["n"], size["m"]
    pairs = n * m * (m - 1) / 2 + m * n * (n - 1) / 2
    passes = 0 if mode == "backward" else 1
    return {"bytes": _rw_bytes(mode, n, m, itemsize), "fp32": 4 * pairs * passes}


def est_sw(impl, mode, size, itemsize):
    n, m = size["n"], size["m"]
    flat = 8 * n * m * 4
    if impl in ("reference", "compiled", "chunked"):
        return 8 * WINDOWS * n * m * itemsize + flat
    return flat


def floor_sw(mode, size, itemsize):
    n, m = size["n"], size["m"]
    return {"bytes": _rw_bytes(mode, n, m, itemsize), "fp32": 2 * 4 * n * m}


def _native(name):
    # looked up at call time, so the bench follows whatever fastrank exports
    return lambda: lambda sim, relevance: getattr(fastrank, name)(sim, relevance, impl="native")


KENDALL = OpBench(
    name="kendall",
    impls={
        "native": _native("kendall_loss"),
        "reference": lambda: baselines.reference(fastrank.kendall_loss),
        "compiled": lambda: baselines.compiled(fastrank.kendall_loss),
        "chunked": lambda: baselines.chunked_per_query(fastrank.kendall_loss),
    },
    sizes={
        "cpu": [{"n": n, "m": n} for n in (64, 128, 256, 512, 1024, 2048)],
        "cuda": [{"n": n, "m": n} for n in (128, 256, 512, 1024, 2048, 4096, 8192)],
        "quick": [{"n": n, "m": n} for n in (16, 128)],
    },
    make_inputs=make_inputs,
    work=work_cubic,
    est_bytes=est_kendall,
    floor_counts=floor_kendall,
    notes="direction=both, reduction=mean, alpha=0.1; floor: N*M*(M-1)/2 pairs x 4 fp32 per direction",
)

KENDALL_SW = OpBench(
    name="kendall_sw",
    impls={
        "native": _native("kendall_sw_loss"),
        "reference": lambda: baselines.reference(fastrank.kendall_sw_loss),
        "compiled": lambda: baselines.compiled(fastrank.kendall_sw_loss),
        "chunked": lambda: baselines.chunked_per_query(fastrank.kendall_sw_loss,
                                                       pair_elements=lambda c: WINDOWS * c),
    },
    sizes={
        "cpu": [{"n": n, "m": n} for n in (64, 128, 256, 512, 1024, 2048, 4096)],
        "cuda": [{"n": n, "m": n} for n in (128, 256, 512, 1024, 2048, 4096, 8192, 16384)],
        "quick": [{"n": n, "m": n} for n in (16, 128)],
    },
    make_inputs=make_inputs,
    work=work_sw,
    est_bytes=est_sw,
    floor_counts=floor_sw,
    notes="direction=both, reduction=mean, alpha=0.1, beta=0.05, label_range=(0, 1): 18 windows",
)


if __name__ == "__main__":
    from benchmarks.runner import main
    raise SystemExit(main(default_ops=["kendall", "kendall_sw"], default_modes=["forward+backward"],
                          name_suffix="-kendall", description=__doc__.splitlines()[0]))
