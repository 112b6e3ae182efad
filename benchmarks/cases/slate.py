"""slate: allRank-shaped slates, fastrank.compat.approxNDCGLoss against allRank's approxNDCG.

    python -m benchmarks slate                     # batch 256 x list 128, batch 32 x list 1024
    python -m benchmarks slate --threads 1         # one thread (fairer on a loaded machine)
    python -m benchmarks slate --device cuda

Input as allRank feeds its losses: y_pred and y_true of shape (batch, slate_length),
slates of different lengths padded at the end to the longest, padded labels -1; each
slate's length is drawn uniformly from [0.4 L, L], so ~30% of the entries are padding;
labels 0..4 (MSLR-WEB30K grades), scores standard normal, alpha = 1, float32.

Implementations, forward+backward of the scalar loss (gradient to y_pred), run by
harness.py: ``fastrank`` (fastrank.compat.approxNDCGLoss: the smooth-NDCG kernel, one list
per slate, padding masked; allRank's signature and value), ``allrank`` (allRank's
approxNDCGLoss, eager: the original when the ``allrank`` package imports (it pins
torch <= 1.8), else :func:`allrank_approx_ndcg`, the same computation as its PyTorch
code), ``allrank-compiled`` (the same under torch.compile, static shapes). Before timing,
fastrank's value is checked against the baseline's (``max_abs_diff`` on its records).
"""
from __future__ import annotations

import time

import torch

import fastrank

from ..case import Case, payload
from ..harness import Config, bench_ops
from ..memory import PeakMemory
from ..ops import Op
from ..results import machine_info

SIZES = [(256, 128), (32, 1024)]
QUICK_SIZES = [(16, 32), (4, 128)]
PAD_FRAC = 0.3
QUICK_SKIP = "not run in --quick (torch.compile takes about a minute)"


def allrank_approx_ndcg(y_pred, y_true, eps=1e-10, padded_value_indicator=-1, alpha=1.0):
    """allRank's approxNDCGLoss as its PyTorch code computes it (allrank/models/losses/
    approxNDCG.py): padded entries set to -inf, the slate sorted by score, pairs with a
    padded item masked out of (batch, L, L) tensors, positions from clamped sigmoids,
    gains over the clamped ideal DCG, -mean over slates."""
    pad = y_true == padded_value_indicator
    scores = y_pred.masked_fill(pad, float("-inf"))
    labels = y_true.masked_fill(pad, float("-inf"))
    scores_sorted, order = scores.sort(dim=-1, descending=True)
    labels_ideal = labels.sort(dim=-1, descending=True).values
    labels_by_score = labels.gather(1, order)
    pair_ok = torch.isfinite(labels_by_score[:, :, None] - labels_by_score[:, None, :])
    pair_ok.diagonal(dim1=-2, dim2=-1).zero_()
    labels_by_score = labels_by_score.clamp(min=0.0)
    labels_ideal = labels_ideal.clamp(min=0.0)
    positions = torch.arange(1, y_pred.shape[1] + 1, device=y_pred.device).float()
    discount = torch.log2(1.0 + positions)[None, :]
    max_dcg = ((torch.pow(2, labels_ideal) - 1) / discount).sum(dim=-1).clamp(min=eps)
    gains = (torch.pow(2, labels_by_score) - 1) / max_dcg[:, None]
    diffs = (scores_sorted[:, :, None] - scores_sorted[:, None, :]).masked_fill(~pair_ok, 0.0)
    approx_pos = 1.0 + (pair_ok.float() * torch.sigmoid(-alpha * diffs).clamp(min=eps)).sum(dim=-1)
    return -(gains / torch.log2(1.0 + approx_pos)).sum(dim=-1).mean()


def allrank_baseline():
    """(callable, source): the original approxNDCGLoss when allRank imports, else ours."""
    try:
        from allrank.models.losses.approxNDCG import approxNDCGLoss  # type: ignore
        return approxNDCGLoss, "allRank package"
    except Exception:  # noqa: BLE001 - not installed, or broken by its torch <= 1.8 pin
        return allrank_approx_ndcg, "allRank's formula re-written in PyTorch (benchmarks/cases/slate.py)"


def make_slates(batch, length, device="cpu", seed=0, pad_frac=PAD_FRAC):
    g = torch.Generator().manual_seed(seed)
    y_pred = torch.randn(batch, length, generator=g)
    y_true = torch.randint(0, 5, (batch, length), generator=g).float()
    lo = max(1, round((1.0 - 2.0 * pad_frac) * length))       # uniform in [lo, L]: mean (lo+L)/2
    lengths = torch.randint(lo, length + 1, (batch,), generator=g)
    y_true[torch.arange(length)[None, :] >= lengths[:, None]] = -1.0
    return y_pred.to(device), y_true.to(device)


def slate_inputs(size, device, dtype, requires_grad):
    y_pred, y_true = make_slates(size["batch"], size["length"], device)
    return {"y_pred": y_pred.to(dtype).requires_grad_(requires_grad), "y_true": y_true.to(dtype)}


def _size(batch, length):
    _, y_true = make_slates(batch, length)
    return {"batch": batch, "length": length, "padding": float((y_true == -1).float().mean())}


def slate_op(quick: bool) -> Op:
    baseline, _ = allrank_baseline()
    sizes = [_size(b, n) for b, n in (QUICK_SIZES if quick else SIZES)]
    return Op(
        name="approx_ndcg",
        about="allRank's approxNDCG on padded slates",
        impls={"fastrank": lambda: fastrank.compat.approxNDCGLoss, "allrank": lambda: baseline,
               "allrank-compiled": lambda: torch.compile(baseline, dynamic=False)},
        inputs=slate_inputs,
        sizes={"cpu": sizes, "cuda": sizes, "quick": sizes},
        work=lambda s: s["batch"] * s["length"] ** 2,
        est_bytes=lambda impl, mode, s, itemsize: (8 * s["length"] if impl.startswith("allrank") else 8)
        * s["batch"] * s["length"] * 4,
        modes=("forward+backward",),
        baseline="allrank",
        size_label=lambda s: f"{s['batch']} x {s['length']} ({s['padding']:.0%})",
        x_of=lambda s: s["length"],
        x_name="slate length",
    )


def check_values(op: Op, records, device):
    """max |fastrank - baseline| of the loss value, on each fastrank record."""
    ours, theirs = op.impls["fastrank"](), op.impls["allrank"]()
    for size in op.sizes["cpu"]:
        inputs = op.inputs(size, device, torch.float32, False)
        with torch.no_grad():
            diff = float((ours(**inputs) - theirs(**inputs)).abs())
        for r in records:
            if r["impl"] == "fastrank" and r["size"] == size:
                r["max_abs_diff"] = diff


def run(args, device, save):
    t0 = time.monotonic()
    machine = machine_info(device)
    op = slate_op(args.quick)
    cfg = Config(device=device, min_repeats=3, max_repeats=args.max_repeats or 20,
                 repeat_budget_s=args.repeat_budget or 10.0, case_limit_s=args.case_limit or 300.0)
    if args.quick:
        cfg.max_repeats, cfg.repeat_budget_s, cfg.max_warmup = 3, 0.05, 1
    if args.time_limit:
        cfg.deadline = time.monotonic() + args.time_limit
    impls = args.impls or list(op.impls)
    records = bench_ops([op], impls, ["forward+backward"], cfg, lambda o: o.sizes["cpu"],
                        log=lambda s: print(s, flush=True),
                        skip={"allrank-compiled": QUICK_SKIP} if args.quick else None)
    check_values(op, records, device)
    _, source = allrank_baseline()
    report = {"baselines": {op.name: "allrank"}, "ratios": ["allrank/fastrank", "allrank-compiled/fastrank"],
              "x_names": {op.name: op.x_name},
              "method": [f"forward+backward, float32, alpha = 1, ~{PAD_FRAC:.0%} padding (labels -1); "
                         f"warm-up then up to {cfg.max_repeats} repeats or {cfg.repeat_budget_s:g} s; "
                         f"peak extra memory: {PeakMemory(device).method}", f"baseline: {source}"]}
    conf = {"quick": args.quick, "impls": impls, "threads": args.threads, "dtype": "float32",
            "max_repeats": cfg.max_repeats, "repeat_budget_s": cfg.repeat_budget_s}
    return payload("slate", device, conf, records, report, machine, t0, baseline_source=source)


CASE = Case("slate", "allRank-shaped padded slates: fastrank.compat.approxNDCGLoss against allRank's "
                     "approxNDCG, eager and compiled; time, peak memory, value agreement", run,
            choices={"impls": lambda: list(slate_op(False).impls)})
