"""The issue-time model of the CUDA pair kernels: their H100 time from counted instructions.

For one forward+backward call of an op at N x N (both directions, float32), each kernel pass
of the call takes

    t_pass = max(I / issue rate, U / MUFU rate, B / copy bandwidth)

where I = sum over its pair loops of (SASS instructions a pair x pairs), U likewise with the
MUFU operations a pair (counted in the cubin: benchmarks/cuda/sass.py), and B the bytes the pass
must move to and from DRAM; the call's time is the sum over its passes. The rates are the
H100's measured ceilings (results/cuda-2026-11-26-floors.json): the issue rate is the fp32
FMA rate (one warp instruction per scheduler and clock, 128 thread-instructions per SM and
clock, the FMA pipe's width), the MUFU rate the rate of ``__expf`` chains (16 special-function
results per SM and clock), the bandwidth the copy rate (read + write).

``raw`` is that arithmetic, every unit kept busy all the time. ``predicted`` divides it by one
efficiency (the fraction of issue slots a pair kernel keeps busy), fitted on one point: the v0
smooth-NDCG kernels (cd1d973) at N = 4096, 505 ms on the H100 (``FIT``). The other measured
point, the smooth-rank engine v1 at N = 8192 (7.0 ms), is a check the fit never saw.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[2]
FLOORS = ROOT / "benchmarks" / "results" / "cuda-2026-11-26-floors.json"
F32 = 4  # bytes of a float32 element (sim, the accumulation type)


@dataclasses.dataclass(frozen=True)
class Ceilings:
    issue: float       # thread-instructions / s
    mufu: float        # MUFU operations / s
    bandwidth: float   # bytes / s (read + write)

    @classmethod
    def measured(cls, path: Path = FLOORS) -> "Ceilings":
        c = json.loads(path.read_text())["ceilings"]
        return cls(issue=c["fp32_per_s"], mufu=c["exp_per_s"], bandwidth=c["copy_bytes_per_s"])


# (source file of the loop, loop name) -> (SASS instructions a pair, MUFU a pair), float32
Counts = Dict[Tuple[str, str], Tuple[float, float]]

# The v0 kernels' counts (cd1d973, float32, sm_90, nvcc 13.0), as
# `python -m benchmarks cuda_resources --rev cd1d973` prints them: recorded here so that the
# model needs no git history (CI clones may be shallow).
V0_COUNTS: Counts = {
    ("smooth_ndcg.cu", "smooth_ndcg.cu:113"): (53.0, 2.0),   # forward_tiles: ranks + ideal-rank count
    ("smooth_ndcg.cu", "smooth_ndcg.cu:252"): (37.0, 2.0),   # backward_tiles
}


@dataclasses.dataclass(frozen=True)
class Pass:
    """One kernel pass of a call: its pair loops ((file, loop name), pairs as a function of N)
    and the DRAM bytes it must move."""
    name: str
    loops: Tuple[Tuple[Tuple[str, str], Callable[[int], float]], ...]
    bytes: Callable[[int], float]


@dataclasses.dataclass(frozen=True)
class Workload:
    op: str
    version: str
    counts_from: str    # "this tree", or the commit whose recorded counts it uses
    passes: Tuple[Pass, ...]


# ---- pair counts of one N x N call, both directions ----------------------------------------------

def ordered(n: int) -> float:
    """v0 / v1 smooth-NDCG: each element against every candidate of each of its two lists."""
    return 2.0 * n * n * n


def v2_tile_pairs(n: int) -> float:
    """v2 smooth-NDCG: the pairs the 32 x 32 tile pairs evaluate, 2n lists of n items."""
    t = (n + 31) // 32
    return 2.0 * n * 1024 * t * (t - 1) / 2


def v2_diagonal_pairs(n: int) -> float:
    """v2 smooth-NDCG: the diagonal tiles' 32 lanes x 16 steps each, 2n lists."""
    return 2.0 * n * 512 * ((n + 31) // 32)


def one_positive(n: int) -> float:
    """The smooth-rank engine, one positive a query (the benchmark's diagonal): 2n queries x n."""
    return 2.0 * n * n


# ---- bytes ------------------------------------------------------------------------------------

def nm_bytes(per_element: float) -> Callable[[int], float]:
    return lambda n: per_element * n * n


WORKLOADS: List[Workload] = [
    # v0 / v1: the forward reads sim and relevance for both directions and writes a (n m each);
    # the backward reads sim and both a's and writes grad
    Workload("smooth_ndcg", "v0", "cd1d973", (
        Pass("forward", ((("smooth_ndcg.cu", "smooth_ndcg.cu:113"), ordered),), nm_bytes(4 * F32)),
        Pass("backward", ((("smooth_ndcg.cu", "smooth_ndcg.cu:252"), ordered),), nm_bytes(4 * F32)),
    )),
    Workload("smooth_ndcg", "v1", "this tree", (
        Pass("forward", ((("smooth_ndcg_v1.cu", "v1 forward ranks"), ordered),), nm_bytes(4 * F32)),
        Pass("backward", ((("smooth_ndcg_v1.cu", "v1 backward sums"), ordered),), nm_bytes(4 * F32)),
    )),
    # v2: one forward kernel runs both pair passes (reads sim and relevance per direction, writes
    # G per direction); the backward is elementwise (reads both G, writes grad)
    Workload("smooth_ndcg", "v2", "this tree", (
        Pass("forward: rank pass", ((("smooth_ndcg.cu", "v2 ranks, tile pairs"), v2_tile_pairs),
                                    (("smooth_ndcg.cu", "v2 ranks, diagonal tiles"), v2_diagonal_pairs)),
             nm_bytes(4 * F32)),
        Pass("forward: gradient pass", ((("smooth_ndcg.cu", "v2 gradient, tile pairs"), v2_tile_pairs),
                                        (("smooth_ndcg.cu", "v2 gradient, diagonal tiles"), v2_diagonal_pairs)),
             nm_bytes(2 * F32)),
        Pass("backward", (), nm_bytes(3 * F32)),
    )),
    # engine v1: per direction the forward reads sim and the positives, writes G; the t2i
    # lists are transposed first (sim, positives: read and written); partials and the
    # per-query passes' rereads are L2 traffic, not counted; the backward reads both G, writes grad
    Workload("smooth_ap", "v1", "this tree", (
        Pass("forward", ((("smooth_rank.cuh", "engine ranks"), one_positive),
                         (("smooth_rank.cuh", "engine v1 gradient row"), one_positive)),
             nm_bytes(2 * (F32 + 1 + 4) + 2 * (F32 + 1))),
        Pass("backward", (), nm_bytes(2 * 4 + F32)),
    )),
    # engine v2: the same passes and bytes, a warp a query (no barrier): what v1 lost to
    # latency and barriers is outside the model, so the model predicts both alike
    Workload("smooth_ap", "v2", "this tree", (
        Pass("forward", ((("smooth_rank.cuh", "engine ranks"), one_positive),
                         (("smooth_rank.cuh", "engine v2 gradient row"), one_positive)),
             nm_bytes(2 * (F32 + 1 + 4) + 2 * (F32 + 1))),
        Pass("backward", (), nm_bytes(2 * 4 + F32)),
    )),
]

# (op, version, N, seconds) measured on the H100 (docs/benchmarks.md, "GPU (H100)"); the first
# is the fitted point.
MEASURED = [("smooth_ndcg", "v0", 4096, 0.505), ("smooth_ap", "v1", 8192, 7.0e-3)]
FIT = MEASURED[0]
# the sizes the table predicts
SIZES = {"smooth_ndcg": (2048, 4096), "smooth_ap": (4096, 8192)}


@dataclasses.dataclass
class Prediction:
    workload: Workload
    n: int
    issue_s: float
    mufu_s: float
    bytes_s: float
    raw_s: float          # sum over passes of the max of the three
    bound: str            # what binds the longest pass


def predict(w: Workload, counts: Counts, n: int, ceil: Ceilings) -> Prediction:
    issue = mufu = byt = raw = 0.0
    bound, worst = "", -1.0
    for p in w.passes:
        i = sum(counts[key][0] * pairs(n) for key, pairs in p.loops)
        u = sum(counts[key][1] * pairs(n) for key, pairs in p.loops)
        terms = {"issue": i / ceil.issue, "MUFU": u / ceil.mufu, "bytes": p.bytes(n) / ceil.bandwidth}
        t = max(terms.values())
        issue, mufu, byt, raw = issue + terms["issue"], mufu + terms["MUFU"], byt + terms["bytes"], raw + t
        if t > worst:
            worst, bound = t, max(terms, key=terms.get)
    return Prediction(w, n, issue, mufu, byt, raw, bound)


def counts_for(w: Workload, tree: Counts) -> Counts:
    return tree if w.counts_from == "this tree" else V0_COUNTS


def predictions(tree: Counts, ceil: Ceilings) -> Tuple[float, List[Prediction]]:
    """(the fitted efficiency, every workload's prediction at its sizes)."""
    by_key = {(w.op, w.version): w for w in WORKLOADS}
    op, version, n, seconds = FIT
    fit = by_key[(op, version)]
    eta = predict(fit, counts_for(fit, tree), n, ceil).raw_s / seconds
    rows = [predict(w, counts_for(w, tree), size, ceil) for w in WORKLOADS for size in SIZES[w.op]]
    return eta, rows


def table(rows: Sequence[Prediction], eta: float) -> str:
    measured = {(op, v, n): s for op, v, n, s in MEASURED}
    out = ["| op | version | N | issue | MUFU | bytes | bound by | raw | predicted (raw / %.2f) | measured (H100) |"
           % eta, "|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        m = measured.get((r.workload.op, r.workload.version, r.n))
        out.append(f"| {r.workload.op} | {r.workload.version} | {r.n} | {_ms(r.issue_s)} | {_ms(r.mufu_s)} | "
                   f"{_ms(r.bytes_s)} | {r.bound} | {_ms(r.raw_s)} | {_ms(r.raw_s / eta)} | "
                   f"{_ms(m) if m else 'not run'} |")
    return "\n".join(out)


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"
