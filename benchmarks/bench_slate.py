"""Slates (allRank-shaped input): fastrank.compat.approxNDCGLoss against allRank's approxNDCG.

    python benchmarks/bench_slate.py                   # CPU: batch 256 x list 128, batch 32 x list 1024
    python benchmarks/bench_slate.py --device cuda     # the same on a GPU
    python benchmarks/bench_slate.py --quick           # tiny sizes, seconds (smoke run)
    OMP_NUM_THREADS=1 python benchmarks/bench_slate.py --threads 1   # one thread (a loaded machine)

Input as allRank feeds its losses: y_pred and y_true of shape (batch, slate_length),
slates of different lengths padded at the end to the longest, padded labels -1; here each
slate's length is drawn uniformly from [0.4 L, L], so ~30% of the entries are padding;
labels 0..4 (MSLR-WEB30K grades), scores standard normal. alpha = 1, float32.

Implementations, forward+backward of the scalar loss (gradient to y_pred):
- fastrank: ``fastrank.compat.approxNDCGLoss`` (the smooth-NDCG kernel, one list per slate,
  padding masked; same signature and value as allRank's);
- allrank: allRank's approxNDCGLoss, eager: the original when the ``allrank`` package
  imports (it pins torch <= 1.8), else :func:`allrank_approx_ndcg` below, the same
  computation as allRank's PyTorch code (sort by score, (batch, L, L) pairwise tensors);
- allrank-compiled: the same under ``torch.compile``.

Each case checks first that fastrank's value equals the baseline's (``max_abs_diff``), then
times: warm-up calls, then repeats until --repeats or --budget seconds; median and
quartiles. Peak extra memory of one call (RSS high-water mark on CPU, allocator peak on
CUDA). Output: ``<out>/slate-<device>-<date>.json`` and ``.md`` (speed-up = allRank's
median / fastrank's median).
"""
if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    import pathlib
    import sys
    _here = pathlib.Path(__file__).resolve()
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _here.parent]
    sys.path.append(str(_here.parents[1]))  # after site-packages: an installed fastrank wins

import argparse
import datetime as _dt
import json
import os
import time
from pathlib import Path

import torch

import fastrank
from benchmarks.harness import fmt_bytes, summarize, time_call
from benchmarks.memory import PeakMemory
from benchmarks.report import machine_info

SIZES = [(256, 128), (32, 1024)]
QUICK_SIZES = [(16, 32), (4, 128)]
PAD_FRAC = 0.3
IMPLS = ("fastrank", "allrank", "allrank-compiled")


# ----------------------------------------------------------------------------- baseline
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
        return allrank_approx_ndcg, "allRank's formula re-written in PyTorch (benchmarks/bench_slate.py)"


# ----------------------------------------------------------------------------- inputs
def make_slates(batch, length, device, seed=0, pad_frac=PAD_FRAC):
    g = torch.Generator().manual_seed(seed)
    y_pred = torch.randn(batch, length, generator=g)
    y_true = torch.randint(0, 5, (batch, length), generator=g).float()
    lo = max(1, round((1.0 - 2.0 * pad_frac) * length))       # uniform in [lo, L]: mean (lo+L)/2
    lengths = torch.randint(lo, length + 1, (batch,), generator=g)
    y_true[torch.arange(length)[None, :] >= lengths[:, None]] = -1.0
    return y_pred.to(device), y_true.to(device)


# ----------------------------------------------------------------------------- timing
def bench_case(fn, y_pred, y_true, device, repeats, budget_s, warmup):
    x = y_pred.clone().requires_grad_()

    def call():
        x.grad = None
        fn(x, y_true).backward()

    meter = PeakMemory(device)
    t0 = time.perf_counter()
    for _ in range(max(0, warmup - 1)):
        call()
    with meter.measure() as m:
        time_call(call, device)
    first_s = time.perf_counter() - t0
    times = []
    start = time.perf_counter()
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < budget_s):
        times.append(time_call(call, device))
    return {"time": summarize(times), "warmup_s": first_s,
            "memory": {"peak_bytes": m.peak_bytes, "method": meter.method}}


def fmt_time(s):
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def markdown(payload):
    info = payload["machine"]
    lines = [f"# Slate benchmark ({payload['device']}, {payload['created']})", "",
             f"fastrank.compat.approxNDCGLoss vs allRank's approxNDCG, forward+backward, float32, "
             f"alpha = 1, ~{int(PAD_FRAC * 100)}% padding (labels -1), median of repeats "
             f"(peak extra memory). Baseline: {payload['baseline']}.", "",
             f"Machine: {info.get('cpu_model')}, {info.get('cpu_count')} CPUs, torch {info.get('torch')}"
             f", {info.get('torch_threads')} threads, load average at start {info.get('loadavg_start')}"
             + (f"; GPU {info['gpu']['name']}" if "gpu" in info else "") + ".", "",
             "| batch x list | padding | fastrank | allRank (eager) | allRank (compiled) "
             "| speed-up vs eager | vs compiled | max abs diff |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in payload["cases"]:
        cells = []
        for impl in IMPLS:
            r = c["results"].get(impl)
            if r is None or "error" in r:
                cells.append("error: " + (r or {}).get("error", "not run")[:60])
            else:
                mem = r["memory"]["peak_bytes"]
                cells.append(fmt_time(r["time"]["median_s"]) + (f" · {fmt_bytes(mem)}" if mem is not None else ""))
        sp = [f"**{c['speedup'][k]:.1f}x**" if c["speedup"].get(k) else "" for k in ("allrank", "allrank-compiled")]
        diff = c.get("max_abs_diff")
        lines.append(f"| {c['batch']} x {c['length']} | {c['padding']:.0%} | " + " | ".join(cells)
                     + f" | {sp[0]} | {sp[1]} | " + ("" if diff is None else f"{diff:.1e}") + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, a few repeats (smoke run)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per case (default 20, quick 3)")
    ap.add_argument("--budget", type=float, default=10.0, help="seconds of timed repeats per case at most")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (set OMP_NUM_THREADS to the same for fastrank's OpenMP kernels)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    impls = [i for i in args.impls.split(",") if i]
    bad = sorted(set(impls) - set(IMPLS))
    if bad:
        ap.error(f"--impls: unknown {bad}, choose from {IMPLS}")
    repeats = args.repeats or (3 if args.quick else 20)
    baseline, source = allrank_baseline()
    fns = {"fastrank": fastrank.compat.approxNDCGLoss, "allrank": baseline,
           "allrank-compiled": torch.compile(baseline, dynamic=False)}

    payload = {"benchmark": "slate", "device": str(device), "created": _dt.datetime.now().isoformat(timespec="seconds"),
               "baseline": source, "machine": machine_info(device), "quick": args.quick, "cases": []}
    for batch, length in (QUICK_SIZES if args.quick else SIZES):
        y_pred, y_true = make_slates(batch, length, device)
        case = {"batch": batch, "length": length, "padding": float((y_true == -1).float().mean()),
                "results": {}, "speedup": {}}
        try:
            with torch.no_grad():
                ours = fastrank.compat.approxNDCGLoss(y_pred, y_true)
                theirs = baseline(y_pred, y_true)
            case["max_abs_diff"] = float((ours - theirs).abs())
            case["loss"] = float(ours)
        except Exception as e:  # noqa: BLE001 - recorded; the timings below record it too
            case["max_abs_diff"], case["check_error"] = None, f"{type(e).__name__}: {e}"
        for impl in impls:
            try:
                case["results"][impl] = bench_case(fns[impl], y_pred, y_true, device, repeats, args.budget,
                                                   warmup=3 if impl == "allrank-compiled" else 2)
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                case["results"][impl] = {"error": f"{type(e).__name__}: {e}"}
            r = case["results"][impl]
            print(f"{batch:>5} x {length:<5} {impl:<17} "
                  + (r["error"] if "error" in r else f"{fmt_time(r['time']['median_s']):>10}"), flush=True)
        ours_t = case["results"].get("fastrank", {}).get("time")
        for impl in ("allrank", "allrank-compiled"):
            t = case["results"].get(impl, {}).get("time")
            if ours_t and t:
                case["speedup"][impl] = t["median_s"] / ours_t["median_s"]
        payload["cases"].append(case)
    payload["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None

    md = markdown(payload)
    print(md)
    if not args.no_write:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = (f"slate-{device.type}-{_dt.date.today().isoformat()}" + ("-quick" if args.quick else "")
                + (f"-{args.threads}thread" if args.threads else ""))
        (out / f"{stem}.json").write_text(json.dumps(payload, indent=1, default=str))
        (out / f"{stem}.md").write_text(md)
        print(f"wrote {out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
