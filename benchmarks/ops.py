"""Every op the benchmarks measure, described once: inputs, the calls that race (native
kernel, eager reference, torch.compile of it, ...), sizes, memory estimate and floor.

The ``sweep`` case runs every op of :data:`OPS` over its sizes; the ``percall`` case runs
the ops that have ``percall_sizes``. The ops follow the table of losses
(src/fastrank/ops/registry.py): every native op of it is measured, by :func:`native_loss`'s
default benchmark of its row (smooth_ndcg's), adjusted in :data:`TUNED` where an op needs
other sizes or baselines, or by a whole custom :class:`Op` (:data:`CUSTOM`: fast_rerank,
whose calls return two matrices; fast_rerank_topk, which takes embeddings). A new native op
needs nothing here. An op whose public function is not in fastrank (``requires``) is
recorded as skipped, with the reason, in every case.

Floor counts (``Op.floor(mode, size, itemsize)``) are what an op cannot avoid: ``bytes``
that must move (inputs read once, outputs written once), ``exp`` exponentials, ``fp32``
other float instructions, ``mm_flop`` matmul flops, ``cmp_select_add`` Kendall-like pair
work; each native op declares its own with its glue (src/fastrank/ops/_floor.py) and the
table carries it here; ceilings.py turns them into seconds with the device's measured rates.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
from torch.utils.checkpoint import checkpoint

import fastrank
from fastrank.ops.registry import LOSSES, NATIVE_OPS, Loss

from . import baselines
from .results import MODES


@dataclass
class Op:
    """One op as the cases see it.

    impls: name -> factory; the factory returns ``fn(**inputs)`` giving a scalar loss or
      a tuple of tensors (called once per run: a compiled function is reused across sizes).
    inputs(size, device, dtype, requires_grad) -> dict of tensors (``sim`` first).
    sizes: "cpu" / "cuda" / "quick" (and "huge" for a one-off size) -> list of size dicts.
    work(size) -> relative cost, to extrapolate time from one size to the next.
    est_bytes(impl, mode, size, itemsize) -> estimated peak extra bytes (the memory guard).
    floor(mode, size, itemsize) -> counts (module docstring), or None without a model.
    scalar(out) -> the scalar a training step backpropagates (per-call case).
    """
    name: str
    about: str
    impls: Dict[str, Callable[[], Callable]]
    inputs: Callable
    sizes: Dict[str, List[dict]]
    work: Callable[[dict], float]
    est_bytes: Callable[[str, str, dict, int], float]
    floor: Optional[Callable[[str, dict, int], dict]] = None
    modes: tuple = MODES
    baseline: str = "reference"
    size_label: Callable[[dict], str] = lambda s: f"{s['n']} x {s['m']}"
    x_of: Callable[[dict], float] = lambda s: s["n"]
    x_name: str = "N (= M)"
    group: str = ""                 # ops of one group share a plot row (the PyTorch losses)
    out_bytes: Optional[Callable[[dict, int], float]] = None   # one output matrix: "peak / one output"
    percall_sizes: tuple = ()       # the per-call case's sizes (training batches)
    percall_quick_sizes: tuple = ()
    scalar: Callable = lambda out: out
    requires: str = ""              # the fastrank function it needs; skipped while it is missing
    notes: str = ""

    def within(self, sizes, min_n: Optional[int] = None, max_n: Optional[int] = None) -> List[dict]:
        """The sizes whose x (N) is within [min_n, max_n] (a bound of None: none)."""
        return [s for s in sizes if (max_n is None or self.x_of(s) <= max_n)
                and (min_n is None or self.x_of(s) >= min_n)]

    def missing(self) -> Optional[str]:
        """Why the op cannot run at all in this fastrank, or None."""
        if self.requires and not hasattr(fastrank, self.requires):
            return f"fastrank has no {self.requires} yet"
        return None


# ------------------------------------------------------------------ shared pieces

def square(*ns) -> List[dict]:
    return [{"n": n, "m": n} for n in ns]


def graded_inputs(size, device, dtype, requires_grad):
    """sim uniform in [-1, 1) and relevance in [0, 1) (diagonal 1 when square)."""
    n, m = size["n"], size["m"]
    sim = (torch.rand(n, m, device=device) * 2 - 1).to(dtype).requires_grad_(requires_grad)
    rel = torch.rand(n, m, device=device).to(dtype)
    if n == m:
        rel.fill_diagonal_(1.0)
    return {"sim": sim, "relevance": rel}


def sim_inputs(size, device, dtype, requires_grad):
    """sim uniform in [-1, 1) alone (losses whose positives default to the diagonal)."""
    sim = (torch.rand(size["n"], size["m"], device=device) * 2 - 1).to(dtype)
    return {"sim": sim.requires_grad_(requires_grad)}


def random_topk(n, m, k, device, dtype) -> fastrank.TopKRelevance:
    """A TopKRelevance of n rows over m columns: min(k, m) distinct random columns a row, each
    with a random gain in [0, 1)."""
    idx = torch.argsort(torch.rand(n, m, device=device), dim=1)[:, :min(k, m)]
    return fastrank.TopKRelevance(idx, torch.rand(idx.shape, device=device).to(dtype), m)


def cubic_work(size):
    return size["n"] * size["m"] * (size["n"] + size["m"])


def cubic_est_bytes(impl, mode, size, itemsize):
    """The references hold (N, M, M) tensors; native O(N*M)."""
    n, m = size["n"], size["m"]
    cube = n * m * max(n, m) * itemsize
    units = {"forward": 3, "backward": 4, "forward+backward": 6}[mode]
    flat = 8 * n * m * 4
    if impl in ("reference", "compiled"):
        return units * cube + flat
    if impl == "chunked":
        return units * min(cube, baselines.BLOCK_ELEMENTS * itemsize) + 2 * flat
    return flat


def native_loss(row: Loss, name: str = "", about: str = "", floor=None, inputs=None, chunked: bool = True,
                pair_elements=lambda c: c * c, **kw) -> Op:
    """The benchmark of a loss of the table with native kernels, called as
    ``fastrank.<functional>(**inputs, impl=...)`` with hyper-parameters ``kw`` (none: its
    defaults): native, eager reference, torch.compile of the reference, and (``chunked``)
    the reference over blocks of queries under checkpoint. By default it is the row's name,
    the first line of the functional's docstring, the row's floor, graded inputs when the
    function takes ``relevance`` (else ``sim`` alone: the positives are the diagonal), the
    cubic ops' sizes. The function is looked up at call time, so the op follows what
    fastrank exports. Keywords that are Op fields (sizes, work, notes, ...) go to the Op,
    the others to the function."""
    fn = row.functional.__name__
    graded = "relevance" in inspect.signature(row.functional).parameters
    fields = {k: kw.pop(k) for k in list(kw) if k in Op.__dataclass_fields__}

    def public(impl):
        return functools.partial(getattr(fastrank, fn), impl=impl, **kw)

    impls = {"native": lambda: public("native"),
             "reference": lambda: public("reference"),
             "compiled": lambda: baselines.compiled(getattr(fastrank, fn), **kw)}
    if chunked:
        impls["chunked"] = lambda: baselines.chunked_per_query(getattr(fastrank, fn), pair_elements, **kw)
    hyper = ", ".join(f"{k}={v}" for k, v in kw.items()) or "default hyper-parameters"
    defaults = dict(
        sizes={"cpu": square(64, 128, 256, 512, 1024, 2048),
               "cuda": square(256, 512, 1024, 2048, 4096, 8192, 16384),
               "quick": square(16, 128)},
        work=cubic_work, est_bytes=cubic_est_bytes,
        percall_sizes=square(4, 8, 128, 512), percall_quick_sizes=square(4, 8),
        notes=f"direction=both, reduction=mean, {hyper}" + ("" if graded else ", positives = the diagonal"))
    return Op(name=name or row.name, about=about or " ".join(row.functional.__doc__.split("\n\n")[0].split()),
              impls=impls, inputs=inputs or (graded_inputs if graded else sim_inputs), floor=floor or row.floor,
              requires=fn, **{**defaults, **fields})


# ------------------------------------------------------------------ what an op changes from its default

SW_WINDOWS = 18   # round((1 - 0 - 0.1) / 0.05): default label_range, alpha and beta


def kendall_sw_est_bytes(impl, mode, size, itemsize):
    n, m = size["n"], size["m"]
    flat = 8 * n * m * 4
    if impl in ("reference", "compiled", "chunked"):
        return 8 * SW_WINDOWS * n * m * itemsize + flat
    return flat


# The losses whose benchmark differs from native_loss's default (every other native loss of
# the table, smooth_ndcg among them, is measured as the default says).
TUNED: Dict[str, dict] = {
    "kendall": dict(
        sizes={"cpu": square(64, 128, 256, 512, 1024, 2048), "cuda": square(128, 256, 512, 1024, 2048, 4096, 8192),
               "quick": square(16, 128)}),
    "kendall_sw": dict(
        pair_elements=lambda c: SW_WINDOWS * c,
        sizes={"cpu": square(64, 128, 256, 512, 1024, 2048, 4096),
               "cuda": square(128, 256, 512, 1024, 2048, 4096, 8192, 16384), "quick": square(16, 128)},
        work=lambda s: SW_WINDOWS * s["n"] * s["m"], est_bytes=kendall_sw_est_bytes,
        notes="direction=both, reduction=mean, alpha=0.1, beta=0.05, label_range=(0, 1): 18 windows"),
    "smooth_ap": dict(chunked=False),
    "recall_at_k": dict(chunked=False),
}


# ------------------------------------------------------------------ smooth_ap with classes

PER_CLASS = 4


def class_inputs(size, device, dtype, requires_grad):
    """sim uniform in [-1, 1) and the positives of classes of PER_CLASS consecutive items
    (square: each query's positives are its class, itself included)."""
    n, m = size["n"], size["m"]
    sim = (torch.rand(n, m, device=device) * 2 - 1).to(dtype)
    cls = torch.arange(max(n, m), device=device) // PER_CLASS
    return {"sim": sim.requires_grad_(requires_grad), "positives": cls[:n, None] == cls[None, :m]}


def smooth_rank_class_floor(mode, size, itemsize):
    """as Smooth-AP's floor with PER_CLASS positives a query: PER_CLASS x the exps."""
    counts = LOSSES["smooth_ap"].floor(mode, size, itemsize)
    return {**counts, "exp": PER_CLASS * counts["exp"]}


SMOOTH_AP_CLASSES = native_loss(
    LOSSES["smooth_ap"], "smooth_ap_classes", f"Smooth-AP (docs/spec.md §2.8), {PER_CLASS} positives a query (classes)",
    smooth_rank_class_floor, inputs=class_inputs, chunked=False, percall_sizes=(), percall_quick_sizes=(),
    notes=f"direction=both, reduction=mean, default tau, classes of {PER_CLASS} consecutive items")


# ------------------------------------------------------------------ fast_rerank

GAMMA, LAM = (25.0, 25.0), (20.0, 20.0)


def _col_norm(s):   # i2t: each column normalised over the images
    return GAMMA[1] * s - torch.logsumexp(GAMMA[0] * s, dim=0, keepdim=True)


def _row_norm(s):   # t2i: each row normalised over the captions
    return LAM[1] * s - torch.logsumexp(LAM[0] * s, dim=1, keepdim=True)


def chunked_rerank(sim):
    """The contract's formula (docs/spec.md) in blocks of columns (i2t) and rows (t2i), each under checkpoint."""
    n, m = sim.shape
    cb = max(1, baselines.BLOCK_ELEMENTS // n)
    rb = max(1, baselines.BLOCK_ELEMENTS // m)
    i2t = torch.cat([checkpoint(_col_norm, sim[:, j:j + cb], use_reentrant=False)
                     for j in range(0, m, cb)], dim=1)
    t2i = torch.cat([checkpoint(_row_norm, sim[i:i + rb], use_reentrant=False)
                     for i in range(0, n, rb)], dim=0)
    return i2t, t2i


def rerank_est_bytes(impl, mode, size, itemsize):
    nm = size["n"] * size["m"] * itemsize
    units = {"native": {"forward": 2, "backward": 2, "forward+backward": 3},
             "chunked": {"forward": 4, "backward": 4, "forward+backward": 6}}.get(
        impl, {"forward": 5, "backward": 6, "forward+backward": 8})
    return units[mode] * nm + 8 * (size["n"] + size["m"]) * 4


def _rerank(impl):
    return lambda: functools.partial(fastrank.fast_rerank, gamma=GAMMA, lam=LAM, impl=impl)


FAST_RERANK = Op(
    name="fast_rerank",
    about="LogSumExp re-ranking of sim (docs/spec.md §3), N x 5N: memory-bound",
    impls={"native": _rerank("native"), "reference": _rerank("reference"),
           "compiled": lambda: baselines.compiled(fastrank.fast_rerank, gamma=GAMMA, lam=LAM),
           "chunked": lambda: chunked_rerank},
    inputs=sim_inputs,
    sizes={"cpu": [{"n": n, "m": 5 * n} for n in (500, 1000, 2000, 5000)],
           "cuda": [{"n": n, "m": 5 * n} for n in (1000, 2000, 5000, 10000, 20000)],
           "quick": [{"n": n, "m": 5 * n} for n in (16, 64)]},
    work=lambda s: s["n"] * s["m"],
    est_bytes=rerank_est_bytes,
    floor=LOSSES["fast_rerank"].floor,
    x_name="N (M = 5N)",
    out_bytes=lambda s, itemsize: s["n"] * s["m"] * itemsize,
    percall_sizes=({"n": 100, "m": 500}, {"n": 1000, "m": 5000}),
    percall_quick_sizes=({"n": 100, "m": 500},),
    scalar=lambda out: out[0].sum() + out[1].sum(),
    notes="gamma=(25, 25), lam=(20, 20); backward with all-ones output gradients; "
          "peak / one output: peak extra memory in (N, M) matrices (the op returns two)",
)


# ------------------------------------------------------------------ fast_rerank_topk

TOPK_D, TOPK_K = 64, 10


def topk_inputs(size, device, dtype, requires_grad):
    img = torch.nn.functional.normalize(torch.randn(size["n"], size["d"], device=device), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(size["m"], size["d"], device=device), dim=1)
    return {"img_emb": img.to(dtype), "txt_emb": txt.to(dtype)}


def _topk(impl):
    def factory():
        fn = fastrank.fast_rerank_topk
        takes_impl = any(p.name == "impl" or p.kind is inspect.Parameter.VAR_KEYWORD
                         for p in inspect.signature(fn).parameters.values())
        if not takes_impl:
            if impl == "reference":
                raise NotImplementedError("fast_rerank_topk takes no impl= argument")
            return lambda img_emb, txt_emb: fn(img_emb, txt_emb, TOPK_K)
        return lambda img_emb, txt_emb: fn(img_emb, txt_emb, TOPK_K, impl=impl)
    return factory


def dense_topk(img_emb, txt_emb):
    """What a user writes: the whole similarity matrix, normalised, then the top k."""
    sim = img_emb @ txt_emb.T
    return _col_norm(sim).topk(TOPK_K, dim=1), _row_norm(sim).topk(TOPK_K, dim=0)


def topk_est_bytes(impl, mode, size, itemsize):
    n, m = size["n"], size["m"]
    if impl == "dense":
        return 5 * n * m * itemsize
    return (n + m) * (16 * TOPK_K + 8) + min(n * m, 1 << 26) * itemsize


def topk_floor(mode, size, itemsize):
    """the similarity matmul twice (the column normalisers need every row before any
    top-k can be chosen): 4 N*M*d flops; 2 N*M exps."""
    n, m, d = size["n"], size["m"], size["d"]
    return {"bytes": (n + m) * d * itemsize + (n + m) * TOPK_K * (8 + itemsize),
            "mm_flop": 4.0 * n * m * d, "exp": 2.0 * n * m}


def _topk_sizes(*ns):
    return [{"n": n, "m": 5 * n, "d": TOPK_D} for n in ns]


FAST_RERANK_TOPK = Op(
    name="fast_rerank_topk",
    about="top-k re-ranking from embeddings in blocks (docs/spec.md §3), N x 5N, d=64, k=10, forward",
    impls={"native": _topk("native"), "reference": _topk("reference"), "dense": lambda: dense_topk},
    inputs=topk_inputs,
    sizes={"cpu": _topk_sizes(1000, 5000, 10000), "cuda": _topk_sizes(5000, 20000, 50000),
           "quick": _topk_sizes(16, 64), "huge": _topk_sizes(100000)},
    work=lambda s: s["n"] * s["m"] * s["d"],
    est_bytes=topk_est_bytes,
    floor=topk_floor,
    modes=("forward",),
    baseline="dense",
    size_label=lambda s: f"{s['n']} x {s['m']}, d={s['d']}",
    x_name="N (M = 5N, d = 64)",
    notes="k=10; default gamma/lam of fast_rerank_topk; dense uses gamma=(25, 25), lam=(20, 20)",
)


# ------------------------------------------------------------------ the losses from the embeddings

EMB_D, EMB_K = 64, 8


def embedding_inputs(row_name):
    """q, d (n = m, d = 64, unit rows) and the loss's relevance: a TopKRelevance of 8 graded
    documents a query (smooth-NDCG) or the diagonal positives (None)."""
    def inputs(size, device, dtype, requires_grad):
        n, m = size["n"], size["m"]
        q = torch.nn.functional.normalize(torch.randn(n, EMB_D, device=device), dim=1).to(dtype)
        d = torch.nn.functional.normalize(torch.randn(m, EMB_D, device=device), dim=1).to(dtype)
        out = {"q": q.requires_grad_(requires_grad), "d": d.requires_grad_(requires_grad)}
        if row_name == "smooth_ndcg_from_embeddings":
            out["relevance"] = random_topk(n, m, EMB_K, device, dtype)
        return out
    return inputs


def _matrix_path(fn_name):
    """The loss's matrix path: the native loss of the table on q @ d.T (the (N, M) matrix held)."""
    matrix = getattr(fastrank, fn_name.replace("_from_embeddings", ""))

    def call(q, d, relevance=None, **kw):
        args = (q @ d.T,) if relevance is None else (q @ d.T, relevance)
        return matrix(*args, impl="native", **kw)
    return call


def embedding_loss(row: Loss) -> Op:
    """A loss from the embeddings: native (blocks) against its matrix path (``dense``: the native
    loss on q @ d.T) and the reference."""
    fn = row.functional.__name__

    def public(impl):
        return lambda: functools.partial(getattr(fastrank, fn), impl=impl)
    return Op(
        name=row.name, about=" ".join(row.functional.__doc__.split("\n\n")[0].split()),
        impls={"native": public("native"), "dense": lambda: _matrix_path(fn), "reference": public("reference")},
        inputs=embedding_inputs(row.name),
        sizes={"cpu": square(256, 1024, 4096), "cuda": square(1024, 4096, 16384), "quick": square(16, 64)},
        work=lambda s: s["n"] * s["m"] * (EMB_D + EMB_K),
        est_bytes=lambda impl, mode, s, itemsize: (8 * s["n"] * s["m"] * 4 if impl != "native"
                                                   else 4 * (s["n"] + s["m"]) * EMB_D * 4
                                                   + 12 * min(s["n"] * s["m"], 1 << 22)),
        modes=("forward+backward",), baseline="dense", requires=fn,
        notes=f"d = {EMB_D}; smooth-NDCG: {EMB_K} graded documents a query (TopKRelevance); Smooth-AP, "
              f"Recall@k: the diagonal positives; default hyper-parameters and blocks")


def contrastive_inputs(row_name):
    """img, txt (n = m, d = 64, unit rows; the diagonal positives) and the learnable logit scale
    (CLIP's initial 1 / 0.07), with SigLIP's initial bias -10; for the combined loss, the
    smooth-NDCG term's TopKRelevance of 8 graded captions an image."""
    def inputs(size, device, dtype, requires_grad):
        out = {name: torch.nn.functional.normalize(torch.randn(size[k], EMB_D, device=device), dim=1).to(dtype)
               for name, k in (("img", "n"), ("txt", "m"))}
        out["logit_scale"] = torch.tensor(1 / 0.07, device=device)
        if row_name == "siglip_from_embeddings":
            out["logit_bias"] = torch.tensor(-10.0, device=device)
        out = {k: v.requires_grad_(requires_grad) for k, v in out.items()}
        if row_name == "contrastive_smooth_ndcg_from_embeddings":
            out["relevance"] = random_topk(size["n"], size["m"], EMB_K, device, dtype)
        return out
    return inputs


def contrastive_loss(row: Loss) -> Op:
    """A contrastive loss from the embeddings (InfoNCE, SigLIP): native (blocks) against the
    reference (the (N, M) logits in plain PyTorch, open_clip's way)."""
    fn = row.functional.__name__

    def public(impl):
        return lambda: functools.partial(getattr(fastrank, fn), impl=impl)
    return Op(
        name=row.name, about=" ".join(row.functional.__doc__.split("\n\n")[0].split()),
        impls={"native": public("native"), "reference": public("reference")},
        inputs=contrastive_inputs(row.name),
        sizes={"cpu": square(1024, 4096, 8192), "cuda": square(4096, 16384, 32768), "quick": square(16, 64)},
        work=lambda s: s["n"] * s["m"] * EMB_D,
        est_bytes=lambda impl, mode, s, itemsize: (6 * s["n"] * s["m"] * 4 if impl != "native"
                                                   else 4 * (s["n"] + s["m"]) * EMB_D * 4
                                                   + 6 * 4 * min(s["n"] * s["m"], 1 << 22)),
        modes=("forward+backward",), baseline="reference", requires=fn,
        notes=f"d = {EMB_D}; the diagonal positives; logit scale 1 / 0.07 (and bias -10), learnable; "
              f"default blocks")


# ------------------------------------------------------------------ the PyTorch losses

def pytorch_loss(name: str, about: str, call: Callable) -> Op:
    """A pure-PyTorch loss (no kernels), eager and under torch.compile: the price a
    listwise loss is compared against."""
    def compiled():
        baselines.raise_recompile_limit()
        return torch.compile(call, dynamic=True)
    return Op(
        name=name, about=about, impls={"eager": lambda: call, "compiled": compiled},
        inputs=graded_inputs,
        sizes={"cpu": square(128, 512, 2048), "cuda": square(512, 2048, 8192), "quick": square(32)},
        work=lambda s: s["n"] * s["m"],
        est_bytes=lambda impl, mode, s, itemsize: 16 * s["n"] * s["m"] * max(itemsize, 4),
        modes=("forward+backward", "forward"), baseline="eager", group="losses",
        notes="pure PyTorch; default hyper-parameters, direction=both, reduction=mean")


def _triplet(mining):
    return lambda sim, relevance: fastrank.triplet_loss(sim, mining=mining)


# Ops whose benchmark is not a loss call of the default shape (their whole Op above).
CUSTOM: Dict[str, Op] = {op.name: op for op in (
    FAST_RERANK, FAST_RERANK_TOPK, SMOOTH_AP_CLASSES,
    *(contrastive_loss(LOSSES[name]) for name in ("info_nce_from_embeddings", "siglip_from_embeddings",
                                                  "contrastive_smooth_ndcg_from_embeddings")))}

# With a time limit, what comes first is what gets measured: these first, then every other
# native op of the table in its order, then the PyTorch losses.
PRIORITY = ("smooth_ndcg", "kendall_sw", "fast_rerank", "kendall", "fast_rerank_topk", "smooth_ap",
            "smooth_ap_classes", "recall_at_k")


def _native_ops() -> Dict[str, Op]:
    """The benchmark of every native op of the table: its custom Op, or native_loss's default
    adjusted by TUNED."""
    ops = {name: CUSTOM.get(name) or (embedding_loss(row) if name.endswith("_from_embeddings") else
                                      native_loss(row, **TUNED.get(name, {})))
           for name, row in NATIVE_OPS.items()}
    ops.update((name, op) for name, op in CUSTOM.items() if name not in ops)
    return {name: ops[name] for name in (*[p for p in PRIORITY if p in ops], *ops)}


OPS: Dict[str, Op] = {**_native_ops(), **{op.name: op for op in (
    pytorch_loss("triplet_hardest", "VSE++ triplet, hardest negative (docs/spec.md §2.4)", _triplet("hardest")),
    pytorch_loss("triplet_soft", "triplet, LogSumExp-softened negatives (docs/spec.md §2.4)", _triplet("soft")),
    pytorch_loss("triplet_all", "triplet over all negatives (docs/spec.md §2.4)", _triplet("all")),
    pytorch_loss("ladder", "ladder loss, hard rungs (docs/spec.md §2.5)", lambda sim, relevance: fastrank.ladder_loss(sim, relevance)),
    pytorch_loss("topk", "top-k negatives triplet (docs/spec.md §2.6)", lambda sim, relevance: fastrank.topk_loss(sim)),
)}}


# ------------------------------------------------------------------ one direction, top-k relevance (the sweep's options)

DIRECTIONS = ("i2t", "t2i", "both")


def _function(op: Op):
    return getattr(fastrank, op.requires, None) if op.requires else None


def takes_direction(op: Op) -> bool:
    """Whether every call of the op takes ``direction=`` (its fastrank function does)."""
    fn = _function(op)
    return fn is not None and "direction" in inspect.signature(fn).parameters


def takes_topk(op: Op) -> bool:
    """Whether the op's relevance is the dense graded matrix (graded_inputs) and its fastrank
    function takes a TopKRelevance in its place."""
    fn = _function(op)
    param = inspect.signature(fn).parameters.get("relevance") if fn is not None else None
    return op.inputs is graded_inputs and param is not None and "TopKRelevance" in str(param.annotation)


def variant_sizes(sizes: List[dict], directions: Optional[List[str]] = None,
                  topk: Optional[int] = None) -> List[dict]:
    """Each size once per direction (in the order given; each size's directions side by side)
    where ``directions`` is given, with ``topk`` where it is: the keys :func:`variant` reads."""
    extra = {"topk": topk} if topk else {}
    return [{**s, **({"direction": d} if d else {}), **extra} for s in sizes for d in (directions or [None])]


def variant(op: Op, directions: Optional[List[str]] = None, topk: Optional[int] = None) -> Op:
    """The op as the sweep calls it with ``--directions`` and ``--topk`` (its sizes:
    :func:`variant_sizes`): a size's ``direction`` goes to every call as ``direction=``; a
    size's ``topk`` replaces the dense relevance by :func:`random_topk`'s TopKRelevance of
    that many entries a row. Both show in the size's label and in the op's notes. A size
    with either has no floor (the op's model counts the dense work of both directions). A
    size without them is the op as it is."""
    def inputs(size, device, dtype, requires_grad):
        out = op.inputs(size, device, dtype, requires_grad)
        if size.get("topk"):
            out["relevance"] = random_topk(size["n"], size["m"], size["topk"], device, dtype)
        if size.get("direction"):
            out["direction"] = size["direction"]
        return out

    def size_label(size):
        extra = ([size["direction"]] if size.get("direction") else []) + (
            [f"top-{size['topk']}"] if size.get("topk") else [])
        return ", ".join([op.size_label(size), *extra])

    def floor(mode, size, itemsize):
        plain = size.get("direction", "both") == "both" and not size.get("topk")
        return op.floor(mode, size, itemsize) if plain and op.floor else None

    notes = op.notes
    if directions:
        called = f"direction={' / '.join(directions)} (a row each)"
        notes = notes.replace("direction=both", called) if "direction=both" in notes else f"{called}, {notes}"
    if topk:
        notes += f"; relevance: a TopKRelevance of {topk} random columns a row, random gains in [0, 1)"
    return dataclasses.replace(op, inputs=inputs, size_label=size_label, floor=floor, notes=notes)
