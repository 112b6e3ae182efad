"""loss_scale: a graded loss alone against the batch size: every pair, the sparse path, and from
the embeddings.

    python -m benchmarks loss_scale                          # n = m = 1024 .. 32768 (CPU), k = 8 and 32
    python -m benchmarks loss_scale --sizes 4096 --tag 4096  # one size: dense against sparse at n = 4096
    python -m benchmarks loss_scale --quick                  # n = 64, 128 (seconds)

Smooth-NDCG (docs/spec.md §2.1, 2.1b, 2.11; both directions, mean, tau = 0.05), forward and
backward, on n queries and m = n documents (unit embeddings of 256 dimensions, sim = q @ d.T),
each query with k graded documents (relevance uniform in (0, 1], every other document 0; the
t2i lists are the columns of the same matrix):

- ``dense``: ``smooth_ndcg_loss(sim, relevance matrix)`` with every pair of every list
  (``fastrank.kernel_variant(pair_pass="dense")``): what the kernels did before the sparse path,
  O(n^3);
- ``sparse``: the same call, each list taking the cheaper pass (the sparse one: O(n^2 k));
- ``topk``: ``smooth_ndcg_loss(sim, TopKRelevance)``: no (n, m) relevance either;
- ``embeddings``: ``smooth_ndcg_loss_from_embeddings(q, d, TopKRelevance)``: no (n, m) matrix
  at all (its time includes the similarity matmuls, the others' does not: sim is an input).

Time: the first call, or the median of 2 more when it took under 5 s. Peak extra memory of the
first call (benchmarks/memory.py: the RSS high-water mark on the CPU). A point predicted (from the
previous size of the same row, as n^3 for dense and n^2 for the others) to take longer than
``--case-limit`` (default 600 s) is skipped with the prediction; one whose memory (the matrix
paths: about 6 (n, m) float32 matrices; dense and sparse hold the relevance matrix too) would
exceed ``--mem-fraction`` of the free memory is skipped as out of memory: the matrix path's
out-of-memory point on this machine.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List

import torch

from ..case import Case, payload
from ..memory import PeakMemory, available_bytes
from ..results import loadavg, machine_info
from ..timing import first_call_and_repeats

SIZES = {"cpu": (1024, 2048, 4096, 8192, 16384, 32768), "cuda": (4096, 16384, 32768, 65536)}
QUICK_SIZES = (64, 128)
KS = (8, 32)
IMPLS = ("dense", "sparse", "topk", "embeddings")
DIM, TAU = 256, 0.05
REPEAT_UNDER_S = 5.0
GROWTH = {"dense": 3.0, "sparse": 2.0, "topk": 2.0, "embeddings": 2.0}
#: (n, m) float32 matrices a call holds at once: sim and its gradient, the workspace (G of two
#: directions), the relevance matrix (dense, sparse); embeddings: blocks only
MATRICES = {"dense": 6, "sparse": 6, "topk": 5, "embeddings": 0}


def inputs(n: int, k: int, device: torch.device, seed: int = 0):
    """q, d (n x 256, unit rows) and the TopKRelevance of k documents a query."""
    import fastrank
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(n, DIM, generator=g), dim=1).to(device)
    d = torch.nn.functional.normalize(torch.randn(n, DIM, generator=g), dim=1).to(device)
    k = min(k, n)
    # k distinct documents a query, evenly spaced from a random one (about k a column too)
    idx = (torch.randint(0, n, (n, 1), generator=g) + torch.arange(k) * (n // k)) % n
    values = 1.0 - torch.rand(n, k, generator=g)   # in (0, 1]
    return q, d, fastrank.TopKRelevance(idx.to(device), values.to(device), n)


def step(impl: str, q, d, rel) -> Callable[[], None]:
    """One forward + backward of ``impl`` (its inputs made before, outside the timing)."""
    import fastrank
    if impl == "embeddings":
        def run():
            a, b = q.detach().requires_grad_(), d.detach().requires_grad_()
            fastrank.smooth_ndcg_loss_from_embeddings(a, b, rel, tau=TAU).backward()
        return run
    sim0 = q @ d.t()
    relevance = rel if impl == "topk" else rel.to_dense()

    def run():
        sim = sim0.detach().requires_grad_()
        with fastrank.kernel_variant(pair_pass="dense" if impl == "dense" else "auto"):
            fastrank.smooth_ndcg_loss(sim, relevance, tau=TAU).backward()
    return run


def _record(impl: str, n: int, k: int, device: torch.device) -> dict:
    return {"op": f"smooth_ndcg k={k}", "group": "loss_scale", "impl": impl, "mode": "forward+backward",
            "size": {"n": n, "m": n, "k": k, "dim": DIM}, "size_label": f"{n} x {n}", "x": n, "dtype": "float32",
            "device": str(device), "status": "ok", "reason": None, "time": None, "memory": None}


def _guard(prev: Dict[str, dict], impl: str, n: int, limit_s: float, mem_fraction: float,
           device: torch.device):
    """Why (impl, n) is skipped, or None: out of memory, or predicted over the time limit."""
    need = MATRICES[impl] * n * n * 4
    free = available_bytes(device)
    if need > mem_fraction * free:
        return (f"out of memory: the matrix path holds ~{need / 1e9:.1f} GB at n = {n}, over "
                f"{mem_fraction:g} of the {free / 1e9:.1f} GB free")
    r = prev.get(impl)
    if r is None or r["status"] != "ok":
        return None
    t = r["time"]["median_s"] * (n / r["x"]) ** GROWTH[impl]
    if t > limit_s:
        return f"time ~{t:.0f} s predicted from n = {r['x']} (as n^{GROWTH[impl]:g}), over the limit of {limit_s:.0f} s"
    return None


def measure(impl: str, n: int, k: int, device: torch.device, mem: PeakMemory) -> dict:
    rec = _record(impl, n, k, device)
    q, d, rel = inputs(n, k, device)
    run = step(impl, q, d, rel)
    rec["loadavg"] = loadavg()
    rec.update(first_call_and_repeats(run, device, mem, REPEAT_UNDER_S))
    return rec


def run(args, device, save):
    t0 = time.monotonic()
    machine = machine_info(device)
    sizes = [n for n in (QUICK_SIZES if args.quick else args.sizes or SIZES[device.type])
             if args.max_n is None or n <= args.max_n]
    ks = KS[:1] if args.quick else KS
    impls = [i for i in IMPLS if not args.impls or i in args.impls]
    limit = args.case_limit or (30.0 if args.quick else 600.0)
    mem = PeakMemory(device)
    records: List[dict] = []
    for impl in impls:   # untimed: imports, thread pools, first allocations
        step(impl, *inputs(32, 4, device))()
    for k in ks:
        prev: Dict[str, dict] = {}
        for n in sizes:
            for impl in impls:
                why = _guard(prev, impl, n, limit, args.mem_fraction, device)
                if why is None and args.time_limit and impl in prev:
                    left = args.time_limit - (time.monotonic() - t0)
                    r = prev[impl]
                    guess = r["time"]["median_s"] * (n / r["x"]) ** GROWTH[impl]
                    if guess > left:
                        why = f"predicted ~{guess:.0f} s: past the run's --time-limit ({max(left, 0):.0f} s left)"
                if why is None:
                    rec = measure(impl, n, k, device, mem)
                    prev[impl] = rec
                else:
                    rec = _record(impl, n, k, device)
                    rec.update(status="skipped", reason=why)
                records.append(rec)
                t = rec["time"]
                print(f"k={k:3d} n={n:6d} {impl:11s}: " + (
                    f"{t['median_s']:.3g} s, peak {rec['memory']['peak_bytes'] / 1e6:.0f} MB"
                    if rec["status"] == "ok" else f"skipped: {rec['reason']}"), flush=True)
                save(_payload(args, device, records, machine, t0, sizes, ks, complete=False))
    return _payload(args, device, records, machine, t0, sizes, ks)


def _payload(args, device, records, machine, t0, sizes, ks, complete=True):
    ops = list(dict.fromkeys(r["op"] for r in records))
    report = {"layout": "times", "baselines": {op: "dense" for op in ops},
              "ratios": ["dense/sparse", "dense/topk", "dense/embeddings"],
              "x_names": {op: "n (= m)" for op in ops},
              "slopes": {"n^3": 3.0, "n^2": 2.0},
              "method": [f"smooth-NDCG forward + backward, both directions, mean, tau = {TAU}, on n = m unit "
                         f"embeddings of {DIM} dimensions with k graded documents a query; dense: every pair "
                         "(kernel_variant(pair_pass='dense')); sparse: the same call, the sparse path; topk: a TopKRelevance; "
                         "embeddings: smooth_ndcg_loss_from_embeddings (its time includes the matmuls)",
                         f"time: the first call, or the median of 2 more when it took under {REPEAT_UNDER_S:g} s; "
                         f"peak extra memory of the first call: {PeakMemory(device).method}"]}
    conf = {"quick": args.quick, "sizes": list(sizes), "ks": list(ks), "threads": args.threads,
            "case_limit_s": args.case_limit, "time_limit_s": args.time_limit}
    return payload("loss_scale", device, conf, records, report, machine, t0, complete=complete)


CASE = Case("loss_scale", "a graded loss alone against the batch size (n = m up to 32768, k = 8 and 32): smooth-NDCG "
                          "with every pair, its sparse path, a TopKRelevance, and straight from the embeddings; time "
                          "and peak memory, the matrix path's out-of-memory point",
            run, choices={"impls": IMPLS})
