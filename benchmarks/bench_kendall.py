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
the forward, so forward+backward needs no second pass over the pairs. On the CPU the
pair's work is also counted as one compare+select+add (floors.py measures that rate on
one core), which is the binding one there.
kendall_sw: bytes-bound: read sim and relevance once (~4 fp32 instructions per element
and direction with a one-pass window scan; on the CPU one compare+select+add per element
and direction); the gradient is sparse but the dense gradient matrix must be written.
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

WINDOWS = 18  # round((1 - 0 - 0.1) / 0.05) with the default label_range, alpha and beta


def work_sw(size):
    return WINDOWS * size["n"] * size["m"]


def floor_kendall(mode, size, itemsize):
    n, m = size["n"], size["m"]
    pairs = pair_count(n, m)
    passes = 0 if mode == "backward" else 1
    return {"bytes": rw_bytes(mode, n, m, itemsize), "fp32": 4 * pairs * passes,
            "cmp_select_add": pairs * passes}


def est_sw(impl, mode, size, itemsize):
    n, m = size["n"], size["m"]
    flat = 8 * n * m * 4
    if impl in ("reference", "compiled", "chunked"):
        return 8 * WINDOWS * n * m * itemsize + flat
    return flat


def floor_sw(mode, size, itemsize):
    n, m = size["n"], size["m"]
    scans = 0 if mode == "backward" else 2 * n * m   # one window placement per element and direction
    return {"bytes": rw_bytes(mode, n, m, itemsize), "fp32": 2 * 4 * n * m, "cmp_select_add": scans}


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
    work=cubic_work,
    est_bytes=cubic_est_bytes,
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
