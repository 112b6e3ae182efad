"""st_inbatch: the sentence-transformers in-batch loss alone, before and after a change, in one run.

    python -m benchmarks st_inbatch --before DIR     # B = 128 .. 1024, D = 8, 1 and 2 threads
    python -m benchmarks st_inbatch --before DIR --sizes 512 --threads 1

A step is the loss's forward and backward on fixed embeddings, the encoder left out:
``fastrank.compat.sentence_transformers.SmoothNDCGLoss(model, tau=0.01).compute_loss_from_embeddings(
[q, d_1, ..., d_D], labels).backward()`` with the defaults (``in_batch=True``, i2t, tau 0.01):
each of the B queries ranks all D * B documents of the batch by cosine similarity, its own
D documents graded (``labels`` (B, D), uniform in [0, 1]), every other document at 0.
Inputs: float32 embeddings of 384 dimensions (all-MiniLM-L6-v2's), Gaussian, seeded by B,
D = 8 documents a query; the same tensors for both sides.

Columns: ``before``, the fastrank of the checkout DIR (its native module built in place:
``python setup.py build_ext --inplace`` there), and ``after``, this one. Every cell runs in
fresh child processes (percall's mechanism, cases/percall.py: a child imports fastrank from
one checkout; OMP_NUM_THREADS and torch's threads set to the cell's thread count), one child
a (side, thread count) timing every size, the sides alternating; CHILD_ROUNDS such rounds,
and each cell keeps the child with the lowest median (its record lists every child's
median). A size whose call took over SLOW_S seconds is not run again in later rounds (one
child). The loss values of the two sides are compared (they must agree: the same loss).
Without ``--before`` only ``after`` runs. ``--quick``: B = 16, one thread, one round.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch

from ..case import Case, payload
from ..cli_args import A
from ..harness import record_error
from ..results import loadavg, machine_info
from ..tables import fmt_time
from .percall import CHILD_ROUNDS, THIS_TREE, before_path, before_tree_info, run_child

SIZES = (128, 256, 512, 1024)
QUICK_SIZES = (16,)
THREADS = (1, 2)
D, DIM = 8, 384
SLOW_S = 30.0              # a call this slow is timed by one child only
SIDES = ("before", "after")
TIMING = {"sample_s": 0.05, "samples": 9, "min_samples": 3, "case_s": 3.0}
QUICK_TIMING = {"sample_s": 0.002, "samples": 3, "min_samples": 2, "case_s": 0.1}

# One child: the loss of one checkout at every size given, on the parent's inputs.
CHILD = r"""
import json, sys, torch
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
sys.path[:0] = [args["fastrank_path"], args["root"]]
import fastrank
from fastrank.compat.sentence_transformers import SmoothNDCGLoss
from benchmarks.timing import autorange
loss = SmoothNDCGLoss(torch.nn.Identity(), tau=0.01)   # pinned: the same loss in a before tree
out = {}
for b, path in args["inputs"].items():
    data = torch.load(path)
    emb = [e.requires_grad_() for e in data["embeddings"]]
    def step():
        for e in emb:
            e.grad = None
        loss.compute_loss_from_embeddings(emb, data["labels"]).backward()
    rec = autorange(step, torch.device("cpu"), *args["timing"])
    rec["value"] = float(loss.compute_loss_from_embeddings(emb, data["labels"]))
    out[b] = rec
print(json.dumps({"fastrank_file": fastrank.__file__, "cells": out, "threads": {
    "torch": torch.get_num_threads(), "fastrank_openmp": fastrank.backends().get("cpu_openmp_threads")}}))
"""


def make_inputs(b: int) -> dict:
    g = torch.Generator().manual_seed(b)
    return {"embeddings": [torch.randn(b, DIM, generator=g) for _ in range(D + 1)],
            "labels": torch.rand(b, D, generator=g)}


def op_name(threads: int) -> str:
    return f"SmoothNDCGLoss in-batch, {threads} thread{'s' if threads != 1 else ''}"


def _record(threads: int, b: int, side: str) -> dict:
    return {"op": op_name(threads), "impl": side, "mode": "forward+backward", "size": {"b": b, "d": D},
            "size_label": f"B = {b}, D = {D}", "x": b, "device": "cpu", "dtype": "float32", "status": "ok",
            "reason": None, "note": None, "time": None, "first_call_s": None, "loadavg": loadavg(),
            "child_medians_s": [], "values": []}


def _keep(rec: dict, cell: dict) -> None:
    """Fold one child's measurement of a cell into its record: the lowest median wins."""
    rec["child_medians_s"].append(cell["time"]["median_s"])
    rec["values"].append(cell["value"])
    if rec["time"] is None or cell["time"]["median_s"] < rec["time"]["median_s"]:
        rec["time"], rec["first_call_s"] = cell["time"], cell["first_call_s"]


def run(args, device, save):
    t0 = time.monotonic()
    if device.type != "cpu":
        raise A.UsageError("st_inbatch measures the CPU loss: --device cpu")
    before = Path(args.before) if args.before else None
    if before is not None:
        before_path(before)   # DIR holds a fastrank package
    sizes = list(args.sizes or (QUICK_SIZES if args.quick else SIZES))
    threads = [args.threads] if args.threads else [1] if args.quick else list(THREADS)
    rounds = 1 if args.quick else CHILD_ROUNDS
    timing = dict(QUICK_TIMING if args.quick else TIMING)
    timing["sample_s"] = args.sample_time or timing["sample_s"]
    timing["samples"] = args.samples or timing["samples"]
    timing["case_s"] = args.case_time or timing["case_s"]
    deadline = t0 + args.time_limit if args.time_limit else None
    sides = [s for s in SIDES if s == "after" or before is not None]
    trees = {"before": before, "after": THIS_TREE}

    records: Dict[tuple, dict] = {}
    for t in threads:
        for b in sizes:
            for side in SIDES:
                records[(t, b, side)] = _record(t, b, side)
                if side not in sides:
                    records[(t, b, side)].update(status="skipped", reason="needs --before DIR")
    conf = {"quick": args.quick, "sizes": sizes, "d": D, "dim": DIM, "threads": threads, "rounds": rounds,
            "timing": timing, "slow_s": SLOW_S, "before": before_tree_info(before) if before else None,
            "loss": "SmoothNDCGLoss(model), in_batch=True, direction='i2t', tau=0.01"}
    report = {"baselines": {op_name(t): "before" for t in threads}, "ratios": ["before/after"],
              "x_names": {op_name(t): f"B (queries; {D} * B documents each)" for t in threads},
              "method": ["one call = `loss.compute_loss_from_embeddings([q, d_1..d_8], labels).backward()`, "
                         f"SmoothNDCGLoss defaults (in-batch, i2t, tau 0.01); float32 embeddings of {DIM} "
                         f"dimensions, D = {D}, labels uniform in [0, 1]",
                         f"cells: median per call over up to {timing['samples']} samples; each (side, thread "
                         f"count) in fresh child processes, {rounds} round(s), the child with the lowest median "
                         f"kept (a call over {SLOW_S:g} s: one child)"]}
    if before is not None:
        info = conf["before"]
        report["method"].append(f"before: the fastrank in {info['path']} ({info['commit'] or 'not a git checkout'}); "
                                f"after: this one; the same inputs, the loss values compared")

    def current(done):
        order = [(t, b, s) for t in threads for b in sizes for s in SIDES]
        return payload("st_inbatch", device, conf, [records[k] for k in order], report, machine_info(device), t0,
                       complete=done)

    print(f"st_inbatch: B = {sizes}, D = {D}, threads {threads}, {rounds} round(s), sides {sides}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        inputs = {}
        for b in sizes:
            inputs[str(b)] = str(Path(tmp) / f"b{b}.pt")
            torch.save(make_inputs(b), inputs[str(b)])
        for r in range(rounds):
            for t in threads:
                for side in sides:
                    todo = {b: p for b, p in inputs.items() if records[(t, int(b), side)]["status"] == "ok"
                            and (r == 0 or records[(t, int(b), side)]["time"]["median_s"] <= SLOW_S)}
                    if deadline is not None and time.monotonic() > deadline:
                        for b in todo:
                            if records[(t, int(b), side)]["time"] is None:
                                records[(t, int(b), side)].update(status="skipped", reason="run time limit reached")
                        continue
                    if not todo:
                        continue
                    _child(trees[side], t, todo, timing, {b: records[(t, int(b), side)] for b in todo})
                    save(current(False))
    _compare_values(records, threads, sizes)
    return current(True)


def _child(tree: Path, threads: int, inputs: Dict[str, str], timing: dict, recs: Dict[str, dict]) -> None:
    """One child of the checkout `tree` on `threads` threads, timing every size of `inputs`."""
    try:
        out = run_child(CHILD, tree, {"threads": threads, "inputs": inputs,
                                      "timing": [timing[k] for k in ("sample_s", "samples", "min_samples", "case_s")]},
                        env={"OMP_NUM_THREADS": str(threads)}, timeout=3600)
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        for rec in recs.values():
            if rec["time"] is None:
                record_error(rec, e)
        return
    for b, cell in out["cells"].items():
        rec = recs[b]
        _keep(rec, cell)
        rec["threads"] = out["threads"]
        print(f"st_inbatch {rec['op']:<34} {rec['size_label']:>14} {rec['impl']:<6} "
              f"{fmt_time(cell['time']['median_s']):>9}  (best {fmt_time(rec['time']['median_s'])})", flush=True)


def _compare_values(records: Dict[tuple, dict], threads: List[int], sizes: List[int]) -> None:
    """The two sides compute the same loss: their values agree to float32 rounding."""
    for t in threads:
        for b in sizes:
            got = [records[(t, b, s)] for s in SIDES]
            values = [v for r in got if r["status"] == "ok" for v in r["values"]]
            if len({r["status"] for r in got}) == 1 and got[0]["status"] == "ok" and values:
                spread = max(values) - min(values)
                note = f"loss values of both sides within {spread:.1e}"
                if spread > 1e-5 * max(1.0, abs(values[0])):
                    for r in got:
                        r.update(status="error", reason=f"the sides' loss values differ by {spread:.2e}")
                for r in got:
                    r["note"] = note


CASE = Case("st_inbatch", "the sentence-transformers in-batch SmoothNDCGLoss alone (forward + backward), "
                          "B = 128..1024, D = 8, 1 and 2 threads, before (--before DIR) and after a change", run)
