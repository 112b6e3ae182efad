"""metrics: the retrieval metrics (fastrank.metrics) on a COCO-5K-sized gallery, CPU.

    python -m benchmarks metrics                    # 5000 images x 25000 captions, float32
    python -m benchmarks metrics --n-images 1000     # smaller
    python -m benchmarks metrics --quick             # 500 x 2500

Input: ``sim`` and ``relevance`` uniform random (seeded) float32 (n_images, 5 n_images)
matrices, caption j belonging to image j // 5 (COCO's 5 captions per image),
``cs_k=(100,)``. Each call runs once untimed (thread pools, first-call allocations), then
``--max-repeats`` times (default 1): wall time, CPU time of the process (all threads: with
2 busy cores it approaches twice the wall time) and peak extra memory. For comparison,
kendall_tau is also computed as a user would without fastrank: ``scipy.stats.kendalltau``
row by row and column by column (one timed call, no warm-up).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..case import Case, payload
from ..harness import Config, bench_ops
from ..memory import PeakMemory
from ..ops import Op
from ..results import machine_info

CS_K = 100


def metric_inputs(size, device, dtype, requires_grad):
    g = torch.Generator().manual_seed(0)
    n, m = size["n"], size["m"]
    return {"sim": torch.rand(n, m, generator=g), "relevance": torch.rand(n, m, generator=g),
            "caption_to_image": torch.arange(m) // (m // n)}


def scipy_kendall_tau(sim, relevance, caption_to_image):
    """tau-b per query with scipy, i2t rows then t2i columns, averaged per direction."""
    from scipy.stats import kendalltau
    s, r = sim.numpy(), relevance.numpy()
    i2t = [kendalltau(s[i], r[i])[0] for i in range(s.shape[0])]
    t2i = [kendalltau(s[:, j], r[:, j])[0] for j in range(s.shape[1])]
    return {"i2t": float(np.nanmean(i2t)), "t2i": float(np.nanmean(t2i))}


PROBE = {"n": 100, "m": 500}   # the size of harness.py's first, untimed "does it run" call


def _metric(name, about, call) -> Op:
    return Op(name=name, about=about, impls={"fastrank": lambda: call},
              inputs=metric_inputs, sizes={"quick": [PROBE]},
              work=lambda s: s["n"] * s["m"],
              est_bytes=lambda impl, mode, s, itemsize: 16 * s["n"] * s["m"] * 4,
              modes=("forward",), baseline="fastrank")


def metric_ops(cs_k: int):
    import fastrank.metrics as M
    return [
        _metric("recall_at_k", "R@1, 5, 10, rsum", lambda sim, relevance, caption_to_image:
                M.recall_at_k(sim, caption_to_image)),
        _metric("evaluate without relevance", "R@K, medr, meanr, mAP@R, R-P",
                lambda sim, relevance, caption_to_image: M.evaluate(sim, caption_to_image, cs_k=(cs_k,))),
        _metric("ndcg", "NDCG, both directions", lambda sim, relevance, caption_to_image: M.ndcg(sim, relevance)),
        _metric("kendall_tau", "tau-b per query, both directions",
                lambda sim, relevance, caption_to_image: M.kendall_tau(sim, relevance)),
        _metric(f"coherent_score(k={cs_k})", "CS@K",
                lambda sim, relevance, caption_to_image: M.coherent_score(sim, relevance, k=cs_k)),
        _metric("evaluate with relevance", "all of the above, one sort shared",
                lambda sim, relevance, caption_to_image: M.evaluate(sim, caption_to_image, relevance=relevance,
                                                                    cs_k=(cs_k,))),
        _metric("coco_5fold_1k with relevance", "five folds of 1000 images",
                lambda sim, relevance, caption_to_image: M.coco_5fold_1k(sim, caption_to_image,
                                                                         relevance=relevance, cs_k=(cs_k,))),
    ]


def run(args, device, save):
    t0 = time.monotonic()
    device = torch.device("cpu")     # the metrics are timed on the CPU (their GPU path is plain torch)
    machine = machine_info(device)
    n = 500 if args.quick else (args.n_images or 5000)
    size = {"n": n, "m": 5 * n}
    cs_k = min(CS_K, n)
    ops = metric_ops(cs_k)
    cfg = Config(device=device, min_repeats=1, max_repeats=args.max_repeats or 1, repeat_budget_s=0.0,
                 case_limit_s=1e9, max_warmup=1)
    log = lambda s: print(s, flush=True)  # noqa: E731
    records = bench_ops(ops, ["fastrank"], ["forward"], cfg, lambda op: [size], log=log)
    tau = Op(name="kendall_tau", about="", impls={"scipy": lambda: scipy_kendall_tau}, inputs=metric_inputs,
             sizes={"quick": [PROBE]}, work=lambda s: s["n"] * s["m"],
             est_bytes=lambda impl, mode, s, itemsize: 4 * s["n"] * s["m"] * 4, modes=("forward",))
    if not args.impls or "scipy" in args.impls:
        scfg = Config(device=device, min_repeats=1, max_repeats=1, case_limit_s=1e9, no_warmup=True)
        records += bench_ops([tau], ["scipy"], ["forward"], scfg, lambda op: [size], log=log)
    report = {"baselines": {"kendall_tau": "scipy"}, "ratios": ["scipy/fastrank"],
              "method": [f"{n} x {5 * n} float32 sim and relevance, cs_k=({cs_k},), CPU; one untimed call, "
                         f"then the median of {cfg.max_repeats} (scipy: one call, no warm-up); peak extra "
                         f"memory: {PeakMemory(device).method}",
                         "scipy = scipy.stats.kendalltau row by row and column by column"]}
    conf = {"quick": args.quick, "n_images": n, "cs_k": cs_k, "threads": args.threads,
            "max_repeats": cfg.max_repeats}
    return payload("metrics", device, conf, records, report, machine, t0)


CASE = Case("metrics", "the retrieval metrics on a COCO-5K-sized gallery (5000 x 25000), CPU: wall and CPU "
                       "time, peak memory; kendall_tau also against scipy row by row", run,
            choices={"impls": ("fastrank", "scipy")})
