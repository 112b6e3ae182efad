"""loss_scale: a graded loss alone against the batch size: every pair, the sparse path, and from
the embeddings; the contrastive losses, and a contrastive loss plus smooth-NDCG, at contrastive
batch sizes.

    python -m benchmarks loss_scale                          # n = m = 1024 .. 32768 (CPU), k = 8 and 32
    python -m benchmarks loss_scale --sizes 4096 --tag 4096  # one size: dense against sparse at n = 4096
    python -m benchmarks loss_scale --quick                  # n = 64, 128 (seconds)
    python -m benchmarks loss_scale --ops info_nce,siglip,info_nce+smooth_ndcg --case-limit 3600
                                                             # the contrastive series alone, to 65,536

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

The contrastive losses (docs/spec.md §2.12; ``info_nce`` and ``siglip``), forward and backward
on n image and n text embeddings (unit rows of 512 dimensions, the diagonal positives, the
learnable scale 1 / 0.07 and SigLIP's bias -10), every time from the embeddings (the matmul
included):

- ``embeddings``: ``info_nce_loss_from_embeddings`` / ``siglip_loss_from_embeddings``, block by
  block: no (n, n) logits;
- ``matrix``: the same functions with ``impl="reference"``: the (n, n) logits in plain PyTorch;
- ``open_clip``: open_clip's own ``ClipLoss`` / ``SigLipLoss`` (skipped when open_clip_torch is
  not installed).

InfoNCE plus smooth-NDCG (``info_nce+smooth_ndcg k=8``; docs/spec.md §2.13), forward and backward
on the same embeddings with the smooth-NDCG inputs above (k = 8, tau = 0.05, weight 1):

- ``embeddings``: ``contrastive_smooth_ndcg_loss_from_embeddings``: both terms from each block of
  similarities, no (n, n) matrix;
- ``open_clip``: what a recipe writes today: open_clip's ``ClipLoss`` plus
  ``smooth_ndcg_loss(img @ txt.T, TopKRelevance)`` on the matrix.

The contrastive series run to n = 65,536 on the CPU (``CONTRASTIVE_SIZES``), the smooth-NDCG ones
to 32,768; ``--ops`` picks series by name (smooth_ndcg, info_nce, siglip, info_nce+smooth_ndcg).

Time: the first call, or the median of 2 more when it took under 5 s. Peak extra memory of the
first call (benchmarks/memory.py: the RSS high-water mark on the CPU). A point predicted (from the
previous size of the same row, as n^3 for dense and n^2 for the others) to take longer than
``--case-limit`` (default 600 s) is skipped with the prediction; one whose memory (the matrix
paths: about 6 (n, m) float32 matrices, the matrix path of InfoNCE plus smooth-NDCG 10; dense and
sparse hold the relevance matrix too) would exceed ``--mem-fraction`` of the free memory is
skipped, recorded as "OOM predicted: X GB": the matrix path's out-of-memory point on this
machine, found without running it.
"""
from __future__ import annotations

import functools
import time
from typing import Callable, Dict, List

import torch

from ..case import Case, payload
from ..memory import PeakMemory, available_bytes
from ..results import loadavg, machine_info
from ..timing import first_call_and_repeats

SIZES = {"cpu": (1024, 2048, 4096, 8192, 16384, 32768), "cuda": (4096, 16384, 32768, 65536)}
CONTRASTIVE_SIZES = {"cpu": SIZES["cpu"] + (65536,), "cuda": SIZES["cuda"] + (131072,)}
QUICK_SIZES = (64, 128)
KS = (8, 32)
IMPLS = ("dense", "sparse", "topk", "embeddings")
CONTRASTIVE = ("info_nce", "siglip")
CONTRASTIVE_IMPLS = ("embeddings", "matrix", "open_clip")
COMBINED, COMBINED_K = "info_nce+smooth_ndcg", 8
COMBINED_IMPLS = ("embeddings", "open_clip")
SERIES = ("smooth_ndcg",) + CONTRASTIVE + (COMBINED,)
DIM, TAU = 256, 0.05
CONTRASTIVE_DIM = 512
REPEAT_UNDER_S = 5.0
GROWTH = {"dense": 3.0, "sparse": 2.0, "topk": 2.0, "embeddings": 2.0, "matrix": 2.0, "open_clip": 2.0}
#: (n, m) float32 matrices a call holds at once: sim and its gradient, the workspace (G of two
#: directions), the relevance matrix (dense, sparse); the contrastive matrix paths: the logits
#: (open_clip: both directions'), their softmax and gradients; embeddings: blocks only
MATRICES = {"dense": 6, "sparse": 6, "topk": 5, "embeddings": 0, "matrix": 6, "open_clip": 6}
#: the matrix path of InfoNCE plus smooth-NDCG: open_clip's logits, softmax and gradients, the
#: similarity, its gradient and smooth-NDCG's workspace (171 MB measured at n = 2048: ~10)
COMBINED_MATRICES = {"open_clip": 10, "embeddings": 0}


def inputs(n: int, k: int, device: torch.device, seed: int = 0, dim: int = DIM):
    """q, d (n x dim, unit rows) and the TopKRelevance of k documents a query."""
    import fastrank
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1).to(device)
    d = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1).to(device)
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


def contrastive_step(op: str, impl: str, img, txt) -> Callable[[], None]:
    """One forward + backward of the contrastive loss ``op`` by ``impl`` (the scale and bias learnable)."""
    import fastrank
    from fastrank.compat.open_clip import original_loss_module
    scale0, bias0 = torch.tensor(1 / 0.07, device=img.device), torch.tensor(-10.0, device=img.device)
    if impl == "open_clip":
        original = original_loss_module()
        loss = original.ClipLoss() if op == "info_nce" else original.SigLipLoss()
    else:
        ours = fastrank.info_nce_loss_from_embeddings if op == "info_nce" else fastrank.siglip_loss_from_embeddings
        loss = functools.partial(ours, impl="reference" if impl == "matrix" else "auto")

    def run():
        a, b = img.detach().requires_grad_(), txt.detach().requires_grad_()
        s, c = scale0.detach().requires_grad_(), bias0.detach().requires_grad_()
        (loss(a, b, s) if op == "info_nce" else loss(a, b, s, c)).backward()
    return run


def combined_step(impl: str, img, txt, rel) -> Callable[[], None]:
    """One forward + backward of InfoNCE plus smooth-NDCG by ``impl`` (the scale learnable)."""
    import fastrank
    from fastrank.compat.open_clip import original_loss_module
    scale0 = torch.tensor(1 / 0.07, device=img.device)
    if impl == "open_clip":
        clip = original_loss_module().ClipLoss()

        def loss(a, b, s):
            return clip(a, b, s) + fastrank.smooth_ndcg_loss(a @ b.t(), rel, tau=TAU)
    else:
        def loss(a, b, s):
            return fastrank.contrastive_smooth_ndcg_loss_from_embeddings(a, b, rel, s, tau=TAU)

    def run():
        a, b, s = img.detach().requires_grad_(), txt.detach().requires_grad_(), scale0.detach().requires_grad_()
        loss(a, b, s).backward()
    return run


def _unavailable(impl: str):
    """Why ``impl`` cannot run here, or None."""
    if impl == "open_clip":
        from fastrank.compat.open_clip import original_loss_module
        if original_loss_module() is None:
            return "open_clip_torch is not installed (pip install --no-deps open_clip_torch)"
    return None


def _record(impl: str, n: int, k: int, device: torch.device, op: str = "", dim: int = DIM) -> dict:
    size = {"n": n, "m": n, "k": k, "dim": dim} if k else {"n": n, "m": n, "dim": dim}
    return {"op": op or f"smooth_ndcg k={k}", "group": "loss_scale", "impl": impl, "mode": "forward+backward",
            "size": size, "size_label": f"{n} x {n}", "x": n, "dtype": "float32",
            "device": str(device), "status": "ok", "reason": None, "time": None, "memory": None}


def _guard(prev: Dict[str, dict], impl: str, n: int, limit_s: float, mem_fraction: float,
           device: torch.device, matrices: Dict[str, int] = MATRICES):
    """Why (impl, n) is skipped, or None: out of memory, or predicted over the time limit."""
    need = matrices[impl] * n * n * 4
    free = available_bytes(device)
    if need > mem_fraction * free:
        return (f"OOM predicted: {need / 1e9:.1f} GB; the matrix path holds ~{matrices[impl]} (n, n) float32 "
                f"matrices at n = {n}, over {mem_fraction:g} of the {free / 1e9:.1f} GB free")
    r = prev.get(impl)
    if r is None or r["status"] != "ok":
        return None
    t = r["time"]["median_s"] * (n / r["x"]) ** GROWTH[impl]
    if t > limit_s:
        return f"time ~{t:.0f} s predicted from n = {r['x']} (as n^{GROWTH[impl]:g}), over the limit of {limit_s:.0f} s"
    return None


def _ndcg_cell(impl: str, n: int, device: torch.device, k: int):
    """The record and the step of smooth-NDCG with k graded documents a query."""
    return _record(impl, n, k, device), lambda: step(impl, *inputs(n, k, device))


def _contrastive_cell(impl: str, n: int, device: torch.device, op: str):
    """The record and the step of the contrastive loss ``op``."""
    def make():
        q, d, _ = inputs(n, 1, device, dim=CONTRASTIVE_DIM)
        return contrastive_step(op, impl, q, d)
    return _record(impl, n, 0, device, op=op, dim=CONTRASTIVE_DIM), make


def _combined_cell(impl: str, n: int, device: torch.device):
    """The record and the step of InfoNCE plus smooth-NDCG."""
    def make():
        q, d, rel = inputs(n, COMBINED_K, device, dim=CONTRASTIVE_DIM)
        return combined_step(impl, q, d, rel)
    rec = _record(impl, n, COMBINED_K, device, op=f"{COMBINED} k={COMBINED_K}", dim=CONTRASTIVE_DIM)
    return rec, make


def measure(cell: Callable, impl: str, n: int, device: torch.device, mem: PeakMemory) -> dict:
    rec, make = cell(impl, n, device)
    run = make()
    rec["loadavg"] = loadavg()
    rec.update(first_call_and_repeats(run, device, mem, REPEAT_UNDER_S))
    return rec


def run(args, device, save):
    t0 = time.monotonic()
    machine = machine_info(device)
    def sizes_of(default):
        return [n for n in (QUICK_SIZES if args.quick else args.sizes or default[device.type])
                if args.max_n is None or n <= args.max_n]
    sizes = sizes_of(SIZES)
    ks = KS[:1] if args.quick else KS
    chosen = [i for i in IMPLS + CONTRASTIVE_IMPLS if not args.impls or i in args.impls]
    picked = [name for name in SERIES if not args.ops or name in args.ops]
    limit = args.case_limit or (30.0 if args.quick else 600.0)
    mem = PeakMemory(device)
    records: List[dict] = []
    # (op, its implementations, cell(impl, n, device) -> (record, make the step), sizes, memory model)
    series = [(f"smooth_ndcg k={k}", [i for i in IMPLS if i in chosen], functools.partial(_ndcg_cell, k=k),
               sizes, MATRICES) for k in ks if "smooth_ndcg" in picked]
    # the combined loss before the contrastive losses alone: a --time-limit cuts those first
    series += [(f"{COMBINED} k={COMBINED_K}", [i for i in COMBINED_IMPLS if i in chosen], _combined_cell,
                sizes_of(CONTRASTIVE_SIZES), COMBINED_MATRICES) for _ in (1,) if COMBINED in picked]
    series += [(op, [i for i in CONTRASTIVE_IMPLS if i in chosen], functools.partial(_contrastive_cell, op=op),
                sizes_of(CONTRASTIVE_SIZES), MATRICES) for op in CONTRASTIVE if op in picked]
    every_size = sorted({n for *_, op_sizes, _ in series for n in op_sizes})
    for _, impls, cell, _, _ in series:   # untimed: imports, thread pools, first allocations
        for impl in impls:
            if _unavailable(impl) is None:
                cell(impl, 32, device)[1]()()
    for op, impls, cell, op_sizes, matrices in series:
        prev: Dict[str, dict] = {}
        for n in op_sizes:
            for impl in impls:
                why = _unavailable(impl) or _guard(prev, impl, n, limit, args.mem_fraction, device, matrices)
                if why is None and args.time_limit and impl in prev:
                    left = args.time_limit - (time.monotonic() - t0)
                    r = prev[impl]
                    guess = r["time"]["median_s"] * (n / r["x"]) ** GROWTH[impl]
                    if guess > left:
                        why = f"predicted ~{guess:.0f} s: past the run's --time-limit ({max(left, 0):.0f} s left)"
                if why is None:
                    rec = measure(cell, impl, n, device, mem)
                    prev[impl] = rec
                else:
                    rec = cell(impl, n, device)[0]
                    rec.update(status="skipped", reason=why)
                records.append(rec)
                t = rec["time"]
                print(f"{op:14s} n={n:6d} {impl:11s}: " + (
                    f"{t['median_s']:.3g} s, peak {rec['memory']['peak_bytes'] / 1e6:.0f} MB"
                    if rec["status"] == "ok" else f"skipped: {rec['reason']}"), flush=True)
                save(_payload(args, device, records, machine, t0, every_size, ks, complete=False))
    return _payload(args, device, records, machine, t0, every_size, ks)


def _payload(args, device, records, machine, t0, sizes, ks, complete=True):
    ops = list(dict.fromkeys(r["op"] for r in records))
    baselines = {op: "matrix" if op in CONTRASTIVE else "open_clip" if op.startswith(COMBINED) else "dense"
                 for op in ops}
    report = {"layout": "times", "baselines": baselines,
              "ratios": ["dense/sparse", "dense/topk", "dense/embeddings", "matrix/embeddings",
                         "open_clip/embeddings"],
              "x_names": {op: "n (= m)" for op in ops},
              "slopes": {"n^3": 3.0, "n^2": 2.0},
              "method": [f"smooth-NDCG forward + backward, both directions, mean, tau = {TAU}, on n = m unit "
                         f"embeddings of {DIM} dimensions with k graded documents a query; dense: every pair "
                         "(kernel_variant(pair_pass='dense')); sparse: the same call, the sparse path; topk: a TopKRelevance; "
                         "embeddings: smooth_ndcg_loss_from_embeddings (its time includes the matmuls)",
                         f"info_nce, siglip: forward + backward on n image and n text unit embeddings of "
                         f"{CONTRASTIVE_DIM} dimensions, the diagonal positives, learnable scale 1 / 0.07 (and "
                         "bias -10); embeddings: info_nce_loss_from_embeddings / siglip_loss_from_embeddings "
                         "(blocks); matrix: the same with impl='reference' (the (n, n) logits); open_clip: its "
                         "ClipLoss / SigLipLoss; each time includes the matmuls",
                         f"{COMBINED} k={COMBINED_K}: InfoNCE plus smooth-NDCG (weight 1, tau = {TAU}, k = "
                         f"{COMBINED_K} graded captions an image) on the same embeddings; embeddings: "
                         "contrastive_smooth_ndcg_loss_from_embeddings (both terms from each block, no (n, n) "
                         "matrix); open_clip: ClipLoss + smooth_ndcg_loss(img @ txt.T, TopKRelevance)",
                         f"time: the first call, or the median of 2 more when it took under {REPEAT_UNDER_S:g} s; "
                         f"peak extra memory of the first call: {PeakMemory(device).method}"]}
    conf = {"quick": args.quick, "sizes": list(sizes), "ks": list(ks), "threads": args.threads,
            "case_limit_s": args.case_limit, "time_limit_s": args.time_limit}
    return payload("loss_scale", device, conf, records, report, machine, t0, complete=complete)


CASE = Case("loss_scale", "a graded loss alone against the batch size (n = m up to 32768, k = 8 and 32): smooth-NDCG "
                          "with every pair, its sparse path, a TopKRelevance, and straight from the embeddings; "
                          "InfoNCE, SigLIP and InfoNCE + smooth-NDCG (k = 8) from the embeddings against their "
                          "matrix paths and open_clip's, to n = 65536; time and peak memory, the matrix path's "
                          "out-of-memory point",
            run, choices={"impls": IMPLS + CONTRASTIVE_IMPLS, "ops": SERIES})
