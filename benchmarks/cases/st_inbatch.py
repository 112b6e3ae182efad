"""st_inbatch: the sentence-transformers in-batch loss alone, before and after a change, in one run.

    python -m benchmarks st_inbatch --before DIR     # B = 128 .. 1024, D = 8, 1 and 2 threads
    python -m benchmarks st_inbatch --before DIR --sizes 512 --threads 1
    python -m benchmarks st_inbatch --before DIR --sizes 512 --ops teacher   # with a teacher only

A step is the loss's forward and backward on fixed embeddings, the encoder left out:
``fastrank.compat.sentence_transformers.SmoothNDCGLoss(model, tau=0.01).compute_loss_from_embeddings(
[q, d_1, ..., d_D], labels).backward()`` with the defaults (``in_batch=True``, i2t, tau 0.01):
each of the B queries ranks all D * B documents of the batch by cosine similarity, its own
D documents graded (``labels`` (B, D), uniform in [0, 1]), every other document at 0.
Inputs: float32 embeddings of 384 dimensions (all-MiniLM-L6-v2's), Gaussian, seeded by B,
D = 8 documents a query; the same tensors for both sides.

``--ops``: ``labels`` (the step above) and ``teacher``: the relevance from a frozen teacher
instead of labels, ``loss._loss(q, [d_1, ..., d_D], _Batch(B, D, None, teacher))``, the step
``forward`` takes once the teacher has scored the batch (the teacher's encoding left out, as
the encoder is): ``teacher`` is the (B, D * B) RSC relevance ``(1 + cos) / 2`` of Gaussian
teacher embeddings (384 dimensions, every entry nonzero), doc_1 relevance 1. Each side keeps its
own defaults (after: the teacher's top ``teacher_topk`` other documents a query; before, up to
the commit that made it: the whole matrix), so the teacher's loss values are recorded, not
compared. Default: both.

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
from fastrank.compat.sentence_transformers import SmoothNDCGLoss, _Batch
from benchmarks.timing import autorange
loss = SmoothNDCGLoss(torch.nn.Identity(), tau=0.01)   # pinned: the same loss in a before tree
out = {}
for b, path in args["inputs"].items():
    data = torch.load(path)
    emb = [e.requires_grad_() for e in data["embeddings"]]
    if data.get("teacher") is None:
        def value():
            return loss.compute_loss_from_embeddings(emb, data["labels"])
    else:
        def value():
            return loss._loss(emb[0], emb[1:], _Batch(emb[0].shape[0], len(emb) - 1, None, data["teacher"]))
    def step():
        for e in emb:
            e.grad = None
        value().backward()
    rec = autorange(step, torch.device("cpu"), *args["timing"])
    rec["value"] = float(value())
    out[b] = rec
print(json.dumps({"fastrank_file": fastrank.__file__, "cells": out, "threads": {
    "torch": torch.get_num_threads(), "fastrank_openmp": fastrank.backends().get("cpu_openmp_threads")}}))
"""


RELEVANCE = ("labels", "teacher")


def make_inputs(b: int, relevance: str = "labels") -> dict:
    g = torch.Generator().manual_seed(b)
    data = {"embeddings": [torch.randn(b, DIM, generator=g) for _ in range(D + 1)],
            "labels": torch.rand(b, D, generator=g)}
    if relevance == "teacher":
        t = torch.nn.functional.normalize(torch.randn(b + D * b, DIM, generator=g), dim=1)
        data["teacher"] = ((1 + t[:b] @ t[b:].T) / 2).clamp(0, 1)   # RSC of the teacher's embeddings
    return data


def op_name(threads: int, relevance: str = "labels") -> str:
    teacher = " with a teacher" if relevance == "teacher" else ""
    return f"SmoothNDCGLoss in-batch{teacher}, {threads} thread{'s' if threads != 1 else ''}"


def _record(threads: int, b: int, side: str, relevance: str = "labels") -> dict:
    return {"op": op_name(threads, relevance), "impl": side, "mode": "forward+backward", "size": {"b": b, "d": D},
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

    kinds = [k for k in RELEVANCE if not args.ops or k in args.ops]
    cells = [(t, k, b) for t in threads for k in kinds for b in sizes]
    records: Dict[tuple, dict] = {}
    for t, k, b in cells:
        for side in SIDES:
            records[(t, k, b, side)] = _record(t, b, side, k)
            if side not in sides:
                records[(t, k, b, side)].update(status="skipped", reason="needs --before DIR")
    ops = [op_name(t, k) for t in threads for k in kinds]
    conf = {"quick": args.quick, "sizes": sizes, "d": D, "dim": DIM, "threads": threads, "rounds": rounds,
            "timing": timing, "slow_s": SLOW_S, "before": before_tree_info(before) if before else None,
            "relevance": kinds, "loss": "SmoothNDCGLoss(model), in_batch=True, direction='i2t', tau=0.01"}
    report = {"baselines": {op: "before" for op in ops}, "ratios": ["before/after"],
              "x_names": {op: f"B (queries; {D} * B documents each)" for op in ops},
              "method": ["one call = `loss.compute_loss_from_embeddings([q, d_1..d_8], labels).backward()`, "
                         f"SmoothNDCGLoss defaults (in-batch, i2t, tau 0.01); float32 embeddings of {DIM} "
                         f"dimensions, D = {D}, labels uniform in [0, 1]",
                         f"cells: median per call over up to {timing['samples']} samples; each (side, thread "
                         f"count) in fresh child processes, {rounds} round(s), the child with the lowest median "
                         f"kept (a call over {SLOW_S:g} s: one child)"]}
    if "teacher" in kinds:
        report["method"].insert(1, "with a teacher: `loss._loss(q, [d_1..d_8], _Batch(B, D, None, teacher)).backward()`, "
                                   f"teacher = the (B, {D} * B) RSC relevance (1 + cos) / 2 of Gaussian teacher "
                                   f"embeddings ({DIM} dimensions: every entry nonzero), no labels (doc_1: 1); each "
                                   "side's defaults (its values recorded, not compared)")
    if before is not None:
        info = conf["before"]
        report["method"].append(f"before: the fastrank in {info['path']} ({info['commit'] or 'not a git checkout'}); "
                                f"after: this one; the same inputs, the loss values compared (labels)")

    def current(done):
        return payload("st_inbatch", device, conf, [records[c + (s,)] for c in cells for s in SIDES], report,
                       machine_info(device), t0, complete=done)

    print(f"st_inbatch: B = {sizes}, D = {D}, relevance {kinds}, threads {threads}, {rounds} round(s), "
          f"sides {sides}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        inputs = {}   # "relevance:B" -> its file
        for k in kinds:
            for b in sizes:
                inputs[f"{k}:{b}"] = str(Path(tmp) / f"{k}-b{b}.pt")
                torch.save(make_inputs(b, k), inputs[f"{k}:{b}"])

        def rec_of(t, key, side):
            k, b = key.split(":")
            return records[(t, k, int(b), side)]
        for r in range(rounds):
            for t in threads:
                for side in sides:
                    todo = {key: p for key, p in inputs.items() if rec_of(t, key, side)["status"] == "ok"
                            and (r == 0 or rec_of(t, key, side)["time"]["median_s"] <= SLOW_S)}
                    if deadline is not None and time.monotonic() > deadline:
                        for key in todo:
                            if rec_of(t, key, side)["time"] is None:
                                rec_of(t, key, side).update(status="skipped", reason="run time limit reached")
                        continue
                    if not todo:
                        continue
                    _child(trees[side], t, todo, timing, {key: rec_of(t, key, side) for key in todo})
                    save(current(False))
    _compare_values(records, [c for c in cells if c[1] == "labels"])
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


def _compare_values(records: Dict[tuple, dict], cells: List[tuple]) -> None:
    """The two sides compute the same loss (with labels): their values agree to float32 rounding."""
    for cell in cells:
        got = [records[cell + (s,)] for s in SIDES]
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
                          "B = 128..1024, D = 8, with labels and with a teacher, 1 and 2 threads, before "
                          "(--before DIR) and after a change", run, choices={"ops": RELEVANCE})
