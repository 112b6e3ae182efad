"""percall: what ONE training step of a loss costs at the batch sizes people train with,
where fixed costs (validation, dispatch, launches, host syncs, Python) dominate the work.

    python -m benchmarks percall                    # CPU: one thread unless --threads N
    python -m benchmarks percall --impls native,reference,trivial --samples 9
    python -m benchmarks percall --device cuda      # adds the CUDA-graph column

One step is ``sim.grad = None; loss(sim, relevance).backward()``, float32,
direction="both", reduction="mean", for every op of ops.py with ``percall_sizes``
(smooth_ndcg, kendall, kendall_sw at N = M = 4, 8, 128, 512; fast_rerank at 100 x 500 and
1000 x 5000, its scalar ``i2t.sum() + t2i.sum()``); with ``--sweep-sizes`` at the sweep case's
sizes instead (``--sweep-sizes --before DIR``: the sweep's before / after). Columns:

- ``native``: the public function, ``impl="native"``, eager;
- ``reference``: ``impl="reference"``, eager PyTorch;
- ``compiled``: ``torch.compile`` of the whole reference step (default mode, static shapes:
  one compilation per size, as with a fixed batch; ``fullgraph=True``, or where that fails
  graph breaks allowed and the failure noted); the compiling first call is not in the time;
- ``trivial``: ``(sim * relevance).mean()`` on the same tensors (an op without relevance:
  a random tensor of sim's shape): the cheapest autograd step, the yardstick of fixed costs;
- ``cuda_graph`` (CUDA only): the native step captured once in a CUDA graph (torch's
  whole-network recipe: three warm-up steps on a side stream, grads set to None, capture);
  ``graph.replay()`` is timed; a capture failure is the result;
- ``before`` and ``after`` (with ``--before DIR``): the native step of another fastrank, the
  checkout DIR with its native module built in place (``python setup.py build_ext --inplace``
  there), and of this one, each in a fresh child process per cell, on the same inputs with the
  same timing: a change's before and after in one run on one machine (``before/after`` > 1:
  the change made the call faster). Both are children, since a fresh process times a call
  a few microseconds apart from this long-lived one. Each cell is CHILD_ROUNDS children and
  keeps the one with the lowest median (its record lists every child's median): on a shared
  machine one child now and then runs 1.5 to 2x slow throughout, which a median over its
  own samples cannot remove.

Timing: timing.autorange (samples of k back-to-back calls; median per call over the
samples). The cheap columns of every size run first, breadth-first, and the compilations
last, so a ``--time-limit`` cuts compilations first. On the CPU this case runs on one
thread unless ``--threads`` says otherwise (torch and fastrank's OpenMP): it measures a
core's fixed costs.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

import fastrank

from .. import baselines
from ..case import Case, payload
from ..cli_args import A
from ..harness import record_error
from ..memory import available_bytes
from ..ops import OPS, Op
from ..results import loadavg, machine_info
from ..tables import fmt_bytes, fmt_time
from ..timing import autorange, sync

COLUMNS = ("native", "reference", "compiled", "trivial", "cuda_graph", "before", "after")
RATIOS = ["native/trivial", "reference/native", "compiled/native", "native/cuda_graph", "before/after"]
CHILD_COLUMNS = ("before", "after")
ROOT = Path(__file__).resolve().parents[2]
THIS_TREE = Path(fastrank.__file__).resolve().parent.parent   # where the after column imports fastrank from
QUICK_SKIP = "not run in --quick (torch.compile takes about a minute)"


class _Skip(Exception):
    """A case not run, with the reason recorded."""


class _Failed(Exception):
    """A case that ran and failed in a way that is its result (a CUDA-graph capture)."""


@dataclass
class Settings:
    sample_s: float = 0.02        # one sample: k calls taking about this long
    samples: int = 25             # samples per case (at most)
    min_samples: int = 3
    case_s: float = 5.0           # stop sampling after this long (once min_samples are in)
    mem_fraction: float = 0.5
    deadline: Optional[float] = None


# ------------------------------------------------------------------ the columns

def _step(loss, inputs):
    """One forward + backward, the gradients of the last one cleared (every input that takes
    one: ``sim``, or ``q`` and ``d`` of a loss from the embeddings)."""
    leaves = [t for t in inputs.values() if isinstance(t, torch.Tensor) and t.requires_grad]

    def step():
        for t in leaves:
            t.grad = None
        loss(**inputs).backward()
    return step


def _scalar(op: Op, fn):
    return lambda **inputs: op.scalar(fn(**inputs))


def _trivial_inputs(inputs):
    sim = inputs["sim"]
    weight = inputs.get("relevance")
    return {"sim": sim, "weight": weight if weight is not None and weight.shape == sim.shape
            else torch.rand_like(sim, requires_grad=False)}


def _trivial(sim, weight):
    return (sim * weight).mean()


def _graph_step(loss, inputs, device):
    """torch's whole-network CUDA-graph recipe around loss(**inputs).backward()."""
    sim = inputs["sim"]
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            sim.grad = None
            loss(**inputs).backward()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    sim.grad = None            # backward() allocates .grad from the graph's private pool
    try:
        with torch.cuda.graph(graph):
            static_loss = loss(**inputs)
            static_loss.backward()
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - a capture failure is the result
        try:
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001
            pass
        raise _Failed("capture failed: " + f"{type(e).__name__}: {e}".splitlines()[0][:240]) from e

    def step():
        graph.replay()
    step.keep = (graph, static_loss)   # the graph's output stays alive with the step
    return step


# The child of the before / after columns: the step of the op's native call (the function and
# keywords of its native partial) on the parent's inputs, fastrank imported from one checkout.
BEFORE_CHILD = r"""
import json, sys, torch
args = json.loads(sys.argv[1])
sys.path[:0] = [args["fastrank_path"], args["root"]]
import fastrank
from benchmarks.timing import autorange
call = torch.load(args["call"], weights_only=False)
fn, kw, inputs = getattr(fastrank, call["fn"]), call["kwargs"], call["inputs"]
def scalar(out):
    return out if isinstance(out, torch.Tensor) else sum(t.sum() for t in out[:2])
def step():
    inputs["sim"].grad = None
    scalar(fn(**inputs, **kw)).backward()
rec = autorange(step, torch.device("cpu"), *args["timing"])
rec["fastrank_file"] = fastrank.__file__
print(json.dumps(rec))
"""


def before_path(tree: Path) -> Path:
    """The folder to import the other checkout's fastrank from: src/ or the root."""
    for path in (tree / "src", tree):
        if (path / "fastrank" / "__init__.py").is_file():
            return path
    raise A.UsageError(f"argument --before: no fastrank package in {tree} (or its src/)")


def before_tree_info(tree: Path) -> dict:
    """The other checkout as the result file records it: its path and commit."""
    head = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%H %s"], capture_output=True, text=True)
    return {"path": str(tree), "commit": head.stdout.strip() or None}


CHILD_ROUNDS = 3   # children per before / after cell (module docstring)


def _in_child(op: Op, inputs, st: "Settings", tree: Path) -> dict:
    """The native step of the fastrank in `tree` on these inputs, timed in CHILD_ROUNDS child
    processes: the record of the child with the lowest median, with every child's median."""
    recs = [_one_child(op, inputs, st, tree) for _ in range(CHILD_ROUNDS)]
    best = min(recs, key=lambda r: r["time"]["median_s"])
    best["time"]["child_medians_s"] = [r["time"]["median_s"] for r in recs]
    return best


def _one_child(op: Op, inputs, st: "Settings", tree: Path) -> dict:
    """The native step of the fastrank in `tree` on these inputs, timed in one child process."""
    native = op.impls["native"]()
    with tempfile.TemporaryDirectory() as tmp:
        call = Path(tmp) / "call.pt"
        torch.save({"fn": native.func.__name__, "kwargs": native.keywords, "inputs": inputs}, call)
        return run_child(BEFORE_CHILD, tree, {"call": str(call), "timing": [st.sample_s, st.samples,
                                                                            st.min_samples, st.case_s]})


def run_child(code: str, tree: Path, args: dict, env: Optional[Dict[str, str]] = None, timeout: float = 600) -> dict:
    """Run ``code`` in a fresh Python process that imports fastrank from the checkout `tree`
    (``args["fastrank_path"]``, with this repository's root as ``args["root"]`` for
    ``benchmarks``): its last line of output is a JSON record with ``fastrank_file`` (checked
    to lie in `tree`, then dropped). ``env``: variables set for the child (threads)."""
    args = {"fastrank_path": str(before_path(tree)), "root": str(ROOT), **args}
    env = {**os.environ, "PYTHONPATH": "", **(env or {})}
    res = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True,
                         text=True, env=env, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"the step of the fastrank in {tree} failed: " + res.stderr.strip().splitlines()[-1][:300])
    rec = json.loads(res.stdout.strip().splitlines()[-1])
    if not Path(rec.pop("fastrank_file")).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the child imported a fastrank outside {tree}")
    return rec


class _Compiled:
    """torch.compile of the reference step, fullgraph when the op allows it."""

    def __init__(self):
        baselines.raise_recompile_limit()
        self.fullgraph_failed: Dict[str, str] = {}
        self.longest_compile_s = 0.0

    def step(self, op: Op, inputs, rec):
        """(step, seconds of its compiling first call, or None when the first call is
        measure()'s): fullgraph=True first; where that fails, graph breaks allowed."""
        ref = op.impls["reference"]()
        if op.name not in self.fullgraph_failed:
            step = _step(torch.compile(_scalar(op, ref), fullgraph=True, dynamic=False), inputs)
            try:
                t0 = time.perf_counter()
                step()
                sync(inputs["sim"].device)
                return step, time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001
                self.fullgraph_failed[op.name] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        rec["note"] = "fullgraph=True failed (" + self.fullgraph_failed[op.name] + "); graph breaks allowed"
        return _step(torch.compile(_scalar(op, ref), fullgraph=False, dynamic=False), inputs), None


# ------------------------------------------------------------------ one cell

def run_one(op: Op, impl: str, size: dict, device, dtype, st: Settings, compiled: _Compiled,
            before: Optional[Path] = None) -> dict:
    rec = {"op": op.name, "impl": impl, "mode": "forward+backward", "size": dict(size),
           "size_label": op.size_label(size), "x": op.x_of(size), "device": str(device),
           "dtype": str(dtype).replace("torch.", ""), "status": "ok", "reason": None, "note": None,
           "time": None, "first_call_s": None, "loadavg": loadavg()}
    wall0 = time.perf_counter()
    inputs = None
    try:
        if op.missing():
            raise _Skip(op.missing())
        if impl == "cuda_graph" and device.type != "cuda":
            raise _Skip("CUDA only")
        if impl in CHILD_COLUMNS and (before is None or device.type != "cpu"):
            raise _Skip("needs --before DIR (CPU)")
        now = time.monotonic()
        if st.deadline is not None and now > st.deadline:
            raise _Skip("run time limit reached")
        if impl == "compiled" and st.deadline is not None and st.deadline - now < compiled.longest_compile_s:
            raise _Skip(f"run time limit reached (under {compiled.longest_compile_s:.0f} s left for a compilation)")
        if impl in ("reference", "compiled"):
            itemsize = torch.empty((), dtype=dtype).element_size()
            need = op.est_bytes(impl, "forward+backward", size, itemsize)
            budget = st.mem_fraction * available_bytes(device)
            if need > budget:
                raise _Skip(f"would not fit: needs ~{fmt_bytes(need)}, budget {fmt_bytes(budget)}")
        torch.manual_seed(0)
        inputs = op.inputs(size, device, dtype, True)
        compile_s = None
        if impl in ("native", "reference"):
            step = _step(_scalar(op, op.impls[impl]()), inputs)
        elif impl == "trivial":
            inputs = _trivial_inputs(inputs)
            step = _step(_trivial, inputs)
        elif impl == "cuda_graph":
            step = _graph_step(_scalar(op, op.impls["native"]()), inputs, device)
        elif impl in CHILD_COLUMNS:
            step = None
            rec.update(_in_child(op, inputs, st, before if impl == "before" else THIS_TREE))
        else:
            step, compile_s = compiled.step(op, inputs, rec)
        if step is not None:
            rec.update(autorange(step, device, st.sample_s, st.samples, st.min_samples, st.case_s))
        if impl == "compiled":
            if compile_s is not None:     # the compiling call ran before autorange()
                rec["first_call_s"] = compile_s
            compiled.longest_compile_s = max(compiled.longest_compile_s, rec["first_call_s"])
    except _Skip as s:
        rec["status"], rec["reason"] = "skipped", str(s)
    except _Failed as f:
        rec["status"], rec["reason"] = "error", str(f)
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        record_error(rec, e)
    finally:
        inputs = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        rec["wall_s"] = time.perf_counter() - wall0
    return rec


def plan(ops: List[Op], columns, quick: bool, max_n: Optional[int] = None, min_n: Optional[int] = None,
         sweep_sizes: Optional[str] = None):
    """(op, impl, size): breadth-first (every op's smallest size first), the cheap columns
    of every size before any torch.compile (a time limit cuts compilations first). With
    ``sweep_sizes`` (a device type) at the sweep case's sizes for it, not the training batches."""
    def candidates(op):
        if sweep_sizes:
            return op.sizes["quick" if quick else sweep_sizes]
        return op.percall_quick_sizes if quick else op.percall_sizes

    sizes = {op.name: op.within(candidates(op), min_n, max_n) for op in ops}
    rounds = max((len(v) for v in sizes.values()), default=0)
    out = []
    for phase in (("native", "before", "after", "trivial", "cuda_graph", "reference"), ("compiled",)):
        for i in range(rounds):
            for op in ops:
                if i < len(sizes[op.name]):
                    out += [(op, c, sizes[op.name][i]) for c in phase if c in columns]
    return out


def _line(r: dict) -> str:
    head = f"percall {r['op']:<12} {r['size_label']:>12} {r['impl']:<10}"
    if r["status"] != "ok":
        return f"{head} {r['status']}: {r['reason']}"
    t = r["time"]
    return (f"{head} {fmt_time(t['median_s']):>9}  [{fmt_time(t['p25_s'])}, {fmt_time(t['p75_s'])}]  "
            f"{t['repeats']} x {t['calls_per_sample']} calls; first call {fmt_time(r['first_call_s'])}")


def run(args, device, save):
    t0 = time.monotonic()
    ops = [op for op in OPS.values() if op.percall_sizes]
    if args.ops:
        ops = [op for op in ops if op.name in args.ops]
    before = Path(args.before) if args.before else None
    columns = args.impls or [c for c in COLUMNS if c not in CHILD_COLUMNS or before is not None]
    if any(c in columns for c in CHILD_COLUMNS) and (before is None or device.type != "cpu"):
        raise A.UsageError("the before and after columns need --before DIR and --device cpu")
    if before is not None:
        before_path(before)   # DIR holds a fastrank package
        columns += [c for c in CHILD_COLUMNS if c not in columns]
    if device.type != "cuda":
        columns = [c for c in columns if c != "cuda_graph"]
    elif device.index is not None:      # "cuda" alone is the current device already
        torch.cuda.set_device(device)   # events, streams and graphs on this device
    dtype = getattr(torch, args.dtype)
    st = Settings(mem_fraction=args.mem_fraction)
    if args.quick:
        st.sample_s, st.samples, st.case_s = 0.002, 5, 0.2
    st.sample_s = args.sample_time or st.sample_s
    st.samples = args.samples or st.samples
    st.case_s = args.case_time or st.case_s
    compiled = _Compiled()
    if args.time_limit:
        st.deadline = time.monotonic() + args.time_limit
        compiled.longest_compile_s = min(30.0, 0.2 * args.time_limit)   # a guess, before one is measured
    run_columns = [c for c in columns if not (args.quick and c == "compiled")]
    cases = plan(ops, run_columns, args.quick, args.max_n, args.min_n,
                 sweep_sizes=device.type if args.sweep_sizes else None)

    machine = machine_info(device)
    threads = {"torch": torch.get_num_threads(), "fastrank_openmp": fastrank.backends().get("cpu_openmp_threads")}
    print(f"percall on {device}: torch threads {threads['torch']}, fastrank OpenMP threads "
          f"{threads['fastrank_openmp']}", flush=True)
    records: List[dict] = []
    if args.quick and "compiled" in columns:
        for op, _, size in plan(ops, ["native"], True, args.max_n, args.min_n):
            records.append({"op": op.name, "impl": "compiled", "mode": "forward+backward", "size": dict(size),
                            "size_label": op.size_label(size), "x": op.x_of(size), "device": str(device),
                            "dtype": args.dtype, "status": "skipped", "reason": QUICK_SKIP, "note": None,
                            "time": None, "first_call_s": None})
    conf = {"quick": args.quick, "ops": [op.name for op in ops], "columns": columns, "dtype": args.dtype,
            "threads": threads, "sample_s": st.sample_s, "samples": st.samples, "min_samples": st.min_samples,
            "case_s": st.case_s, "time_limit_s": args.time_limit, "max_n": args.max_n, "min_n": args.min_n,
            "direction": "both", "reduction": "mean", "sweep_sizes": args.sweep_sizes,
            "before": before_tree_info(before) if before is not None else None,
            "compile": "torch.compile(reference step, fullgraph=True, dynamic=False), default mode"}
    report = {"baselines": {op.name: "reference" for op in ops}, "ratios": RATIOS,
              "x_names": {op.name: op.x_name for op in ops},
              "method": ["one call = `sim.grad = None; loss(sim, relevance).backward()`, direction=both, "
                         "reduction=mean; fast_rerank: `(i2t.sum() + t2i.sum()).backward()`; "
                         "trivial = `(sim * relevance).mean().backward()`",
                         f"cells: median per call over up to {st.samples} samples of k back-to-back calls "
                         f"(~{st.sample_s * 1e3:g} ms each); peak memory is not measured here",
                         f"compiled: {conf['compile']}; its first call (compilation) is not in the time; "
                         f"CPU threads: torch {threads['torch']}, fastrank OpenMP {threads['fastrank_openmp']}"]}
    if before is not None:
        info = conf["before"]
        report["method"].append(f"before: the native step of the fastrank in {info['path']} "
                                f"({info['commit'] or 'not a git checkout'}); after: of this one; each "
                                f"on the same inputs, timed in {CHILD_ROUNDS} fresh child processes per "
                                f"cell, keeping the child with the lowest median")

    def current(done):
        order = {c: i for i, c in enumerate(COLUMNS)}
        recs = sorted(records, key=lambda r: ([op.name for op in ops].index(r["op"]), r["x"],
                                              r["size"].get("m", 0), order.get(r["impl"], 99)))
        return payload("percall", device, conf, recs, report, machine, t0, complete=done,
                       compile_fullgraph_failures=compiled.fullgraph_failed)

    gc.freeze()
    for op, impl, size in cases:
        rec = run_one(op, impl, size, device, dtype, st, compiled, before)
        records.append(rec)
        print(_line(rec), flush=True)
        save(current(False))
    return current(True)


CASE = Case("percall", "one training step (forward+backward) at N = 4..512 against the trivial op, the eager "
                       "reference, torch.compile(reference) and (CUDA) a CUDA graph", run, cpu_threads=1,
            choices={"ops": [op.name for op in OPS.values() if op.percall_sizes], "impls": COLUMNS})
