"""fast_rerank and fast_rerank_topk against PyTorch (SPEC section 3).

    python benchmarks/bench_rerank.py                  # fast_rerank N x 5N, fast_rerank_topk
    python benchmarks/bench_rerank.py --huge           # + fast_rerank_topk at 100k x 500k, 64-d

fast_rerank(sim) -> (i2t, t2i): each column (i2t) / row (t2i) normalised by a
logsumexp. Implementations: native, reference (eager, ``impl="reference"``), compiled
(torch.compile of the reference), chunked (columns / rows in blocks under checkpoint,
written here from the SPEC formula, since the reference is not per-query).
Floor: memory-bound. The op must read sim once and write the two (N, M) outputs
(3 N*M elements; backward: read the two output gradients and sim, write the gradient);
2 N*M exponentials per pass. Bandwidth reached = floor bytes / time, compared with the
measured copy bandwidth (goal on an H100: >= 70% at 5000 x 25000).

fast_rerank_topk(img_emb, txt_emb, k) -> top-k per query from embeddings, in blocks.
Implementations: native (fastrank's function, ``impl="native"`` when it takes impl),
reference (``impl="reference"``, when it takes impl), dense (what a user writes: the whole
img @ txt.T, normalised with torch.logsumexp, then torch.topk; skipped where the matrix
does not fit). Forward only. Floor: the similarity matmul twice (the column
normalisers need every row before any top-k can be chosen): 4 N*M*d flops.
"""
if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    import pathlib
    import sys
    _here = pathlib.Path(__file__).resolve()
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _here.parent]
    sys.path.append(str(_here.parents[1]))  # after site-packages: an installed fastrank wins

import inspect

import torch
from torch.utils.checkpoint import checkpoint

import fastrank
from benchmarks import baselines
from benchmarks.harness import OpBench, Skip

GAMMA, LAM = (25.0, 25.0), (20.0, 20.0)
D, K = 64, 10


# ---------------------------------------------------------------- fast_rerank

def rerank_inputs(size, device, dtype, requires_grad):
    sim = (torch.rand(size["n"], size["m"], device=device) * 2 - 1).to(dtype)
    return {"sim": sim.requires_grad_(requires_grad)}


def _col_norm(s):   # i2t: each column normalised over the images
    return GAMMA[1] * s - torch.logsumexp(GAMMA[0] * s, dim=0, keepdim=True)


def _row_norm(s):   # t2i: each row normalised over the captions
    return LAM[1] * s - torch.logsumexp(LAM[0] * s, dim=1, keepdim=True)


def chunked_rerank(sim):
    """The SPEC formula in blocks of columns (i2t) and rows (t2i), each under checkpoint."""
    n, m = sim.shape
    cb = max(1, baselines.BLOCK_ELEMENTS // n)
    rb = max(1, baselines.BLOCK_ELEMENTS // m)
    i2t = torch.cat([checkpoint(_col_norm, sim[:, j:j + cb], use_reentrant=False)
                     for j in range(0, m, cb)], dim=1)
    t2i = torch.cat([checkpoint(_row_norm, sim[i:i + rb], use_reentrant=False)
                     for i in range(0, n, rb)], dim=0)
    return i2t, t2i


def rerank_work(size):
    return size["n"] * size["m"]


def rerank_est(impl, mode, size, itemsize):
    nm = size["n"] * size["m"] * itemsize
    units = {"native": {"forward": 2, "backward": 2, "forward+backward": 3},
             "chunked": {"forward": 4, "backward": 4, "forward+backward": 6}}.get(
        impl, {"forward": 5, "backward": 6, "forward+backward": 8})
    return units[mode] * nm + 8 * (size["n"] + size["m"]) * 4


def rerank_floor(mode, size, itemsize):
    nm = size["n"] * size["m"]
    elems = {"forward": 3, "backward": 4, "forward+backward": 7}[mode]
    exps = {"forward": 2, "backward": 2, "forward+backward": 4}[mode]
    return {"bytes": elems * nm * itemsize, "exp": exps * nm}


def _size_nm(s):
    return f"{s['n']} x {s['m']}"


FAST_RERANK = OpBench(
    name="fast_rerank",
    impls={
        "native": lambda: lambda sim: fastrank.fast_rerank(sim, GAMMA, LAM, impl="native"),
        "reference": lambda: baselines.reference(fastrank.fast_rerank, gamma=GAMMA, lam=LAM),
        "compiled": lambda: baselines.compiled(fastrank.fast_rerank, gamma=GAMMA, lam=LAM),
        "chunked": lambda: chunked_rerank,
    },
    sizes={
        "cpu": [{"n": n, "m": 5 * n} for n in (500, 1000, 2000, 5000)],
        "cuda": [{"n": n, "m": 5 * n} for n in (1000, 2000, 5000, 10000, 20000)],
        "quick": [{"n": n, "m": 5 * n} for n in (16, 64)],
    },
    make_inputs=rerank_inputs,
    work=rerank_work,
    est_bytes=rerank_est,
    floor_counts=rerank_floor,
    size_label=_size_nm,
    x_name="N (M = 5N)",
    out_bytes=lambda s, itemsize: s["n"] * s["m"] * itemsize,
    notes="gamma=(25, 25), lam=(20, 20); backward with all-ones output gradients; "
          "peak / one output: peak extra memory in (N, M) matrices (the op returns two)",
)


# ---------------------------------------------------------------- fast_rerank_topk

def topk_inputs(size, device, dtype, requires_grad):
    img = torch.nn.functional.normalize(torch.randn(size["n"], size["d"], device=device), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(size["m"], size["d"], device=device), dim=1)
    return {"img_emb": img.to(dtype), "txt_emb": txt.to(dtype)}


def _takes_impl(fn) -> bool:
    params = inspect.signature(fn).parameters.values()
    return any(p.name == "impl" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _topk_call(impl):
    def factory():
        fn = fastrank.fast_rerank_topk
        if not _takes_impl(fn):
            if impl == "reference":
                raise Skip("fast_rerank_topk takes no impl= argument")
            return lambda img_emb, txt_emb: fn(img_emb, txt_emb, K)
        return lambda img_emb, txt_emb: fn(img_emb, txt_emb, K, impl=impl)
    return factory


def dense_topk(img_emb, txt_emb):
    """Materialise the similarity matrix, normalise it (SPEC formula), take the top k."""
    sim = img_emb @ txt_emb.T
    i2t = _col_norm(sim).topk(K, dim=1)          # image queries rank the captions
    t2i = _row_norm(sim).topk(K, dim=0)          # caption queries rank the images
    return i2t, t2i


def topk_est(impl, mode, size, itemsize):
    n, m = size["n"], size["m"]
    if impl == "dense":
        return 5 * n * m * itemsize
    return (n + m) * (16 * K + 8) + min(n * m, 1 << 26) * itemsize


def topk_floor(mode, size, itemsize):
    n, m, d = size["n"], size["m"], size["d"]
    return {"bytes": (n + m) * d * itemsize + (n + m) * K * (8 + itemsize),
            "mm_flop": 4.0 * n * m * d, "exp": 2.0 * n * m}


def _topk_sizes(ns):
    return [{"n": n, "m": 5 * n, "d": D} for n in ns]


FAST_RERANK_TOPK = OpBench(
    name="fast_rerank_topk",
    impls={"native": _topk_call("native"), "reference": _topk_call("reference"),
           "dense": lambda: dense_topk},
    sizes={
        "cpu": _topk_sizes((1000, 5000, 10000)),
        "cuda": _topk_sizes((5000, 20000, 50000)),
        "quick": _topk_sizes((16, 64)),
        "huge": _topk_sizes((100000,)),
    },
    make_inputs=topk_inputs,
    work=lambda s: s["n"] * s["m"] * s["d"],
    est_bytes=topk_est,
    floor_counts=topk_floor,
    modes=("forward",),
    baseline="dense",
    size_label=lambda s: f"{s['n']} x {s['m']}, d={s['d']}",
    x_name="N (M = 5N, d = 64)",
    notes=f"k={K}; default gamma/lam of fast_rerank_topk; dense uses gamma=(25, 25), lam=(20, 20)",
)


if __name__ == "__main__":
    from benchmarks.runner import main
    raise SystemExit(main(default_ops=["fast_rerank", "fast_rerank_topk"], default_modes=["forward", "forward+backward"],
                          name_suffix="-rerank", description=__doc__.splitlines()[0]))
