"""The per-call case (issue 11): what ONE loss call costs the user, forward + backward.

    python -m benchmarks --case percall                 # CPU (one thread) or CUDA: auto
    python -m benchmarks --case percall --device cuda
    python -m benchmarks --case percall --quick         # N = 4, 8 and 100 x 500: seconds
    python benchmarks/bench_percall.py [flags]          # the same

At a training batch (N = 4 .. 512) a ranking-loss call is dominated by fixed costs
(validation, launches, host synchronisation, Python), not by its O(N^3) work. This case
times one user-visible step, ``sim.grad = None; loss(sim, relevance).backward()``, with
direction="both", reduction="mean", float32, for smooth_ndcg_loss, kendall_loss and
kendall_sw_loss at N = M = 4, 8, 128, 512, and fast_rerank at 100 x 500 and 1000 x 5000
(its "loss" is ``i2t.sum() + t2i.sum()``, the same in every column). Columns:

- ``native``: the public function, ``impl="native"`` (eager);
- ``reference``: ``impl="reference"`` (eager PyTorch);
- ``compiled``: ``torch.compile`` of the whole reference call (default mode, static
  shapes: one compilation per size, as a user with a fixed batch gets;
  ``fullgraph=True``, or, where that fails, graph breaks allowed and the failure noted);
- ``trivial``: ``(sim * relevance).mean()`` on the same tensors (fast_rerank: a relevance
  tensor of sim's shape): the cheapest autograd step, the yardstick for fixed costs;
- ``cuda_graph`` (CUDA only): the native forward + backward captured once in a CUDA graph
  with static inputs (torch's whole-network capture recipe: three warm-up steps on a side
  stream, grads set to None, capture, then ``graph.replay()`` is what is timed).

Timing (timeit style): a first call (recorded as ``first_call_s``; for ``compiled`` it
includes the compilation), then the number of calls k per sample is grown (at least
doubled each time) until one sample of k calls takes ``--sample-time`` seconds; then up
to ``--samples`` samples of k calls (at least 3, stopping after ``--case-time`` seconds);
per-call time = sample / k;
reported: median over the samples, quartiles, min, max. The garbage collector is off
while timing. CPU: ``perf_counter``; CUDA: events around each sample (so host-bound and
device-bound calls are both measured as the user sees them).

CPU runs single-threaded unless ``--threads N`` says otherwise: torch.set_num_threads(1)
and fastrank's OpenMP threads (OMP_NUM_THREADS=1 before its module loads); the output
says how many threads each ran with.

Per native case the record also holds the ratios native / trivial, reference / native,
compiled / native and native / cuda_graph. Output: ``<out>/percall-<device>-<date>.json``
and ``.md``.
"""
if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    import pathlib
    import sys
    _here = pathlib.Path(__file__).resolve()
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _here.parent]
    sys.path.append(str(_here.parents[1]))  # after site-packages: an installed fastrank wins

import functools
import gc
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

import fastrank
from benchmarks import baselines, report
from benchmarks.bench_kendall import KENDALL, KENDALL_SW
from benchmarks.bench_rerank import FAST_RERANK, rerank_inputs
from benchmarks.bench_smooth_ndcg import SMOOTH_NDCG
from benchmarks.harness import fmt_bytes, record_error
from benchmarks.memory import available_bytes
from benchmarks.pairwise import make_inputs as pair_inputs

COLUMNS = ("native", "reference", "compiled", "trivial", "cuda_graph")
RATIOS = (("native_over_trivial", "native", "trivial"),
          ("reference_over_native", "reference", "native"),
          ("compiled_over_native", "compiled", "native"),
          ("native_over_cuda_graph", "native", "cuda_graph"))


class _Skip(Exception):
    """A case not run, with the reason recorded."""


class _Failed(Exception):
    """A case that ran and failed in a way that is its result (a CUDA-graph capture)."""


@dataclass
class PerCallOp:
    name: str
    loss: Callable[..., torch.Tensor]      # loss(impl, sim, relevance) -> scalar
    sizes: List[dict]
    quick_sizes: List[dict]
    make_inputs: Callable                  # (size, device, dtype) -> {"sim" (leaf), "relevance"}
    est_bytes: Callable                    # the sweep's estimate: (impl, mode, size, itemsize)
    label: Callable[[dict], str] = lambda s: f"{s['n']} x {s['m']}"


def _pair_inputs(size, device, dtype):
    return pair_inputs(size, device, dtype, True)


def _rerank_inputs(size, device, dtype):
    inputs = rerank_inputs(size, device, dtype, True)
    inputs["relevance"] = torch.rand(size["n"], size["m"], device=device).to(dtype)
    return inputs


def _smooth_ndcg(impl, sim, relevance):
    return fastrank.smooth_ndcg_loss(sim, relevance, direction="both", reduction="mean", impl=impl)


def _kendall(impl, sim, relevance):
    return fastrank.kendall_loss(sim, relevance, direction="both", reduction="mean", impl=impl)


def _kendall_sw(impl, sim, relevance):
    return fastrank.kendall_sw_loss(sim, relevance, direction="both", reduction="mean", impl=impl)


def _fast_rerank(impl, sim, relevance):
    i2t, t2i = fastrank.fast_rerank(sim, impl=impl)
    return i2t.sum() + t2i.sum()


def _square(*ns):
    return [{"n": n, "m": n} for n in ns]


PERCALL_OPS = {
    "smooth_ndcg": PerCallOp("smooth_ndcg", _smooth_ndcg, _square(4, 8, 128, 512), _square(4, 8),
                             _pair_inputs, SMOOTH_NDCG.est_bytes),
    "kendall": PerCallOp("kendall", _kendall, _square(4, 8, 128, 512), _square(4, 8),
                         _pair_inputs, KENDALL.est_bytes),
    "kendall_sw": PerCallOp("kendall_sw", _kendall_sw, _square(4, 8, 128, 512), _square(4, 8),
                            _pair_inputs, KENDALL_SW.est_bytes),
    "fast_rerank": PerCallOp("fast_rerank", _fast_rerank, [{"n": 100, "m": 500}, {"n": 1000, "m": 5000}],
                             [{"n": 100, "m": 500}], _rerank_inputs, FAST_RERANK.est_bytes),
}


@dataclass
class PerCallConfig:
    device: torch.device
    dtype: torch.dtype = torch.float32
    sample_s: float = 0.02        # one sample: k calls taking about this long
    samples: int = 25             # samples per case (at most)
    min_samples: int = 3
    case_s: float = 5.0           # stop sampling after this long (once min_samples are in)
    mem_fraction: float = 0.5
    deadline: Optional[float] = None
    max_calls_per_sample: int = 100000


# ------------------------------------------------------------------ timing

def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _batch_seconds(step: Callable[[], None], k: int, device: torch.device) -> float:
    """Seconds for k back-to-back steps (CUDA: events around them, after a sync)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(k):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for _ in range(k):
        step()
    return time.perf_counter() - t0


def measure(step: Callable[[], None], cfg: PerCallConfig) -> dict:
    """First call, autorange (k at least doubled until a batch of k calls takes
    cfg.sample_s), then samples of k calls; per-call statistics over the samples."""
    t0 = time.perf_counter()
    step()
    _sync(cfg.device)
    first = time.perf_counter() - t0
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        k, per_sample = 1, []
        while True:
            t = _batch_seconds(step, k, cfg.device)
            if t >= cfg.sample_s or k >= cfg.max_calls_per_sample:
                break
            k = min(cfg.max_calls_per_sample, max(2 * k, int(k * cfg.sample_s / max(t, 1e-9) * 0.6) or 1))
        if k == 1 and t >= cfg.sample_s:   # a slow call: this batch of one is a sample already
            per_sample.append(t)
        start = time.perf_counter()
        while len(per_sample) < cfg.samples:
            if len(per_sample) >= cfg.min_samples and time.perf_counter() - start >= cfg.case_s:
                break
            per_sample.append(_batch_seconds(step, k, cfg.device) / k)
    finally:
        if was_enabled:
            gc.enable()
    ts = sorted(per_sample)
    q = statistics.quantiles(ts, n=4, method="inclusive") if len(ts) >= 2 else [ts[0], ts[0], ts[0]]
    return {"first_call_s": first,
            "time": {"median_s": statistics.median(ts), "p25_s": q[0], "p75_s": q[2],
                     "min_s": ts[0], "max_s": ts[-1], "repeats": len(ts), "calls_per_sample": k}}


# ------------------------------------------------------------------ the columns

def _eager_step(fn, inputs):
    sim = inputs["sim"]

    def step():
        sim.grad = None
        fn(**inputs).backward()
    return step


def _trivial(sim, relevance):
    return (sim * relevance).mean()


def _graph_step(fn, inputs, device):
    """torch's whole-network CUDA-graph recipe around fn(**inputs).backward()."""
    sim = inputs["sim"]
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            sim.grad = None
            fn(**inputs).backward()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    sim.grad = None            # backward() allocates .grad from the graph's private pool
    try:
        with torch.cuda.graph(graph):
            static_loss = fn(**inputs)
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


class _Compiled:
    """torch.compile of the reference call, fullgraph when the op allows it."""

    def __init__(self):
        baselines._raise_recompile_limit()
        self.fullgraph_failed: Dict[str, str] = {}
        self.longest_compile_s = 0.0

    def fn(self, op: PerCallOp, fullgraph: bool):
        return torch.compile(functools.partial(op.loss, "reference"), fullgraph=fullgraph, dynamic=False)


def _ratios(records: List[dict]) -> None:
    """ratios on each native record (and a per-op-and-size summary)."""
    med = {}
    for r in records:
        if r["status"] == "ok":
            med[(r["op"], r["size_label"], r["impl"])] = r["time"]["median_s"]
    for r in records:
        if r["impl"] != "native":
            continue
        r["ratios"] = {}
        for name, num, den in RATIOS:
            a, b = med.get((r["op"], r["size_label"], num)), med.get((r["op"], r["size_label"], den))
            r["ratios"][name] = a / b if a and b else None


def run_one(op: PerCallOp, impl: str, size: dict, cfg: PerCallConfig, compiled: _Compiled) -> dict:
    rec = {"case": "percall", "op": op.name, "impl": impl, "mode": "forward+backward", "size": dict(size),
           "size_label": op.label(size), "x": size["n"], "device": str(cfg.device),
           "dtype": str(cfg.dtype).replace("torch.", ""), "status": "ok", "reason": None, "note": None,
           "time": None, "first_call_s": None,
           "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    wall0 = time.perf_counter()
    inputs = None
    try:
        if impl == "cuda_graph" and cfg.device.type != "cuda":
            raise _Skip("CUDA only")
        now = time.monotonic()
        if cfg.deadline is not None and now > cfg.deadline:
            raise _Skip("run time limit reached")
        if impl == "compiled" and cfg.deadline is not None and cfg.deadline - now < compiled.longest_compile_s:
            raise _Skip(f"run time limit reached (under {compiled.longest_compile_s:.0f} s left for a compilation)")
        if impl in ("reference", "compiled"):
            itemsize = torch.empty((), dtype=cfg.dtype).element_size()
            need = op.est_bytes(impl, "forward+backward", size, itemsize)
            budget = cfg.mem_fraction * available_bytes(cfg.device)
            if need > budget:
                raise _Skip(f"would not fit: needs ~{fmt_bytes(need)}, budget {fmt_bytes(budget)}")
        torch.manual_seed(0)
        inputs = op.make_inputs(size, cfg.device, cfg.dtype)
        if impl in ("native", "reference"):
            step = _eager_step(functools.partial(op.loss, impl), inputs)
        elif impl == "trivial":
            step = _eager_step(_trivial, inputs)
        elif impl == "cuda_graph":
            step = _graph_step(functools.partial(op.loss, "native"), inputs, cfg.device)
        else:  # compiled
            step, compile_s = _compiled_step(op, inputs, compiled, rec)
        rec.update(measure(step, cfg))
        if impl == "compiled":
            if compile_s is not None:     # the compiling call ran before measure()
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
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
        rec["wall_s"] = time.perf_counter() - wall0
    return rec


def _compiled_step(op, inputs, compiled: _Compiled, rec):
    """(step, seconds of its first, compiling call or None when it has not run yet):
    fullgraph=True first; where that fails, the failure is noted and graph breaks are
    allowed (the first call of that function is then measure()'s first call)."""
    if op.name not in compiled.fullgraph_failed:
        step = _eager_step(compiled.fn(op, fullgraph=True), inputs)
        try:
            t0 = time.perf_counter()
            step()
            _sync(inputs["sim"].device)
            return step, time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
            compiled.fullgraph_failed[op.name] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    rec["note"] = "fullgraph=True failed (" + compiled.fullgraph_failed[op.name] + "); graph breaks allowed"
    return _eager_step(compiled.fn(op, fullgraph=False), inputs), None


# ------------------------------------------------------------------ the run

def plan(ops: List[PerCallOp], columns, quick: bool, max_n: Optional[int] = None):
    """(op, impl, size): breadth-first (every op's smallest size first), the cheap columns
    of every case before any torch.compile (a time limit cuts compilations first)."""
    sizes = {op.name: [s for s in (op.quick_sizes if quick else op.sizes) if max_n is None or s["n"] <= max_n]
             for op in ops}
    rounds = max((len(v) for v in sizes.values()), default=0)
    out = []
    for phase in (("native", "trivial", "cuda_graph", "reference"), ("compiled",)):
        for i in range(rounds):
            for op in ops:
                if i < len(sizes[op.name]):
                    out += [(op, c, sizes[op.name][i]) for c in phase if c in columns]
    return out


def _order(records):
    """Records sorted op by op, size by size, column by column, for the table."""
    col = {c: i for i, c in enumerate(COLUMNS)}
    opi = {o: i for i, o in enumerate(PERCALL_OPS)}
    return sorted(records, key=lambda r: (opi.get(r["op"], 99), r["x"], r["size"].get("m", 0), col.get(r["impl"], 99)))


def run(args, device: torch.device) -> int:
    t0 = time.monotonic()
    names = args.ops or list(PERCALL_OPS)
    bad = [n for n in names if n not in PERCALL_OPS]
    if bad:
        raise SystemExit(f"--case percall: unknown op(s) {bad}; choose from {', '.join(PERCALL_OPS)}")
    columns = args.impls or list(COLUMNS)
    bad = [c for c in columns if c not in COLUMNS]
    if bad:
        raise SystemExit(f"--case percall: unknown column(s) {bad}; choose from {', '.join(COLUMNS)}")
    if device.type != "cuda":
        columns = [c for c in columns if c != "cuda_graph"]
    else:
        torch.cuda.set_device(device)   # events, streams and graphs on this device
    cfg = PerCallConfig(device=device, dtype=getattr(torch, args.dtype))
    if args.quick:
        cfg.sample_s, cfg.samples, cfg.case_s = 0.002, 5, 0.2
    if args.sample_time:
        cfg.sample_s = args.sample_time
    if args.samples:
        cfg.samples = args.samples
    if args.case_time:
        cfg.case_s = args.case_time
    cfg.mem_fraction = args.mem_fraction
    if args.time_limit:
        cfg.deadline = time.monotonic() + args.time_limit
    ops = [PERCALL_OPS[n] for n in names]
    compiled = _Compiled()
    if args.time_limit:   # before the first compilation is measured: a guess, so that none starts at the end
        compiled.longest_compile_s = min(30.0, 0.2 * args.time_limit)
    skipped_compile = args.quick and "compiled" in columns
    cases = plan(ops, [c for c in columns if not (skipped_compile and c == "compiled")], args.quick, args.max_n)

    machine = report.machine_info(device)
    threads = {"torch": torch.get_num_threads(),
               "fastrank_openmp": fastrank.backends().get("cpu_openmp_threads")}
    if device.type == "cpu":
        thread_line = (f"CPU threads: torch {threads['torch']}, fastrank OpenMP {threads['fastrank_openmp']}"
                       + (" (single-threaded: the per-call default; --threads N to change)"
                          if threads["torch"] == 1 else ""))
    else:
        thread_line = f"host threads: torch {threads['torch']}"
    print(f"fastrank per-call case on {device} ({machine.get('gpu', {}).get('name', machine['cpu_model'])}), "
          f"load average {machine['loadavg_start']}; {thread_line}; fastrank from {machine['fastrank_path']}",
          flush=True)
    if device.type == "cpu" and args.threads and threads["fastrank_openmp"] not in (None, args.threads):
        print(f"warning: fastrank's OpenMP runs {threads['fastrank_openmp']} threads, not {args.threads} "
              "(its module was loaded before OMP_NUM_THREADS was set)", flush=True)

    prefix = args.name or "percall-" + report.default_prefix(device)
    args.out.mkdir(parents=True, exist_ok=True)
    jp, mp = args.out / f"{prefix}.json", args.out / f"{prefix}.md"
    config = {"command": report.command_line(), "quick": args.quick, "ops": names, "columns": columns,
              "dtype": args.dtype, "threads": threads, "thread_line": thread_line,
              "sample_s": cfg.sample_s, "samples": cfg.samples, "min_samples": cfg.min_samples,
              "case_s": cfg.case_s, "time_limit_s": args.time_limit, "max_n": args.max_n,
              "direction": "both", "reduction": "mean",
              "compile": "torch.compile(reference call, fullgraph=True, dynamic=False), default mode"}
    records: List[dict] = []
    if skipped_compile:
        for op in ops:
            for size in op.quick_sizes:
                if args.max_n is None or size["n"] <= args.max_n:
                    records.append({"case": "percall", "op": op.name, "impl": "compiled", "mode": "forward+backward",
                                    "size": dict(size), "size_label": op.label(size), "x": size["n"],
                                    "device": str(device), "dtype": args.dtype, "status": "skipped",
                                    "reason": "not run in --quick (torch.compile takes about a minute)",
                                    "note": None, "time": None, "first_call_s": None})

    def write(done: bool) -> dict:
        """The results so far (rewritten after every case: a run cut by a timeout keeps them)."""
        recs = _order(records)
        _ratios(recs)
        payload = {"schema": report.SCHEMA, "case": "percall", "created": report.created_now(),
                   "device": str(device), "machine": machine, "config": config, "complete": done,
                   "compile_fullgraph_failures": compiled.fullgraph_failed, "results": recs,
                   "loadavg_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                   "elapsed_s": time.monotonic() - t0}
        report.write_json(jp, payload)
        mp.write_text(markdown(payload))
        return payload

    gc.freeze()
    for op, impl, size in cases:
        rec = run_one(op, impl, size, cfg, compiled)
        records.append(rec)
        print(_line(rec), flush=True)
        write(done=False)
    payload = write(done=True)
    print()
    print(markdown(payload))
    print(f"wrote: {jp}, {mp}")
    return 0


# ------------------------------------------------------------------ output

def _t(s: Optional[float]) -> str:
    if s is None:
        return ""
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _cell(r: Optional[dict]) -> str:
    if r is None:
        return ""
    if r["status"] != "ok":
        why = r["reason"] or ""
        if why.startswith("not run in --quick"):
            return "skip: --quick"
        if why.startswith("would not fit"):
            return "skip: mem " + why.split("~")[1].split(",")[0]
        if why.startswith("run time limit"):
            return "skip: run limit"
        if why.startswith("native kernels unavailable"):
            return "skip: not built"
        return ("error: " if r["status"] == "error" else "skip: ") + why[:60]
    t = r["time"]
    spread = (t["p75_s"] - t["p25_s"]) / 2 / t["median_s"] * 100 if t["median_s"] else 0
    return f"{_t(t['median_s'])} ±{spread:.0f}%" + (" (graph breaks)" if r.get("note") else "")


def _line(r: dict) -> str:
    head = f"percall {r['op']:<12} {r['size_label']:>12} {r['impl']:<10}"
    if r["status"] != "ok":
        return f"{head} {r['status']}: {r['reason']}"
    t = r["time"]
    return (f"{head} {t['median_s'] * 1e3:9.4f} ms  [{t['p25_s'] * 1e3:.4f}, {t['p75_s'] * 1e3:.4f}]  "
            f"{t['repeats']} x {t['calls_per_sample']} calls; first call {r['first_call_s'] * 1e3:.1f} ms")


def markdown(payload: dict) -> str:
    m, cfg, recs = payload["machine"], payload["config"], payload["results"]
    dev = payload["device"]
    hw = m.get("gpu", {}).get("name") if "gpu" in m else m["cpu_model"]
    lines = [f"# fastrank per-call cost: {dev}, {payload['created'][:10]}", "",
             f"- machine: {hw}; {m['cpu_count']} CPU cores, torch {m['torch']}, fastrank {m['fastrank_version']}"
             + (f" @ {m['git_commit']}" if m.get("git_commit") else ""),
             f"- {cfg['thread_line']}"]
    if not payload.get("complete", True):
        lines.append("- PARTIAL: written while the run was going on (it was cut or is still running)")
    la0, la1 = m.get("loadavg_start"), payload.get("loadavg_end")
    if la0:
        lines.append(f"- load average (1, 5, 15 min) at start {la0[0]:.2f}, {la0[1]:.2f}, {la0[2]:.2f}"
                     + (f"; at end {la1[0]:.2f}, {la1[1]:.2f}, {la1[2]:.2f}" if la1 else ""))
    lines += [f"- one call = `sim.grad = None; loss(sim, relevance).backward()`, {cfg['dtype']}, "
              f"direction={cfg['direction']}, reduction={cfg['reduction']}; fast_rerank: "
              "`(i2t.sum() + t2i.sum()).backward()`; trivial = `(sim * relevance).mean().backward()`",
              f"- cells: median per call over up to {cfg['samples']} samples of k back-to-back calls "
              f"(each sample ~{cfg['sample_s'] * 1e3:g} ms), ±half-IQR; command `{cfg['command']}`",
              f"- compiled: {cfg['compile']}; first call (compilation) not in the time", ""]
    cols = [c for c in COLUMNS if any(r["impl"] == c for r in recs)]
    ratio_cols = [(n, f"{a} / {b}") for n, a, b in RATIOS if a in cols and b in cols]
    head = ["op", "size"] + cols + [h for _, h in ratio_cols]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = list(dict.fromkeys((r["op"], r["size_label"]) for r in recs))
    for op, size in keys:
        by = {r["impl"]: r for r in recs if r["op"] == op and r["size_label"] == size}
        row = [op, size] + [_cell(by.get(c)) for c in cols]
        ratios = (by.get("native") or {}).get("ratios") or {}
        row += [f"{ratios[n]:.3g}x" if ratios.get(n) else "" for n, _ in ratio_cols]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    notes = [f"- {r['op']} {r['size_label']} {r['impl']}: {r['note']}" for r in recs if r.get("note")]
    fails = payload.get("compile_fullgraph_failures") or {}
    notes += [f"- torch.compile(fullgraph=True) of the {op} reference failed: {why}" for op, why in fails.items()]
    errors = [f"- {r['op']} {r['size_label']} {r['impl']}: {r['reason']}" for r in recs if r["status"] == "error"]
    if notes:
        lines += ["Notes:", ""] + notes + [""]
    if errors:
        lines += ["Errors:", ""] + errors + [""]
    first = [f"{r['op']} {r['size_label']}: {_t(r['first_call_s'])}" for r in recs
             if r["impl"] == "compiled" and r["status"] == "ok"]
    if first:
        lines += ["First compiled call (compilation): " + "; ".join(first), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    import sys as _sys
    from benchmarks.runner import main
    raise SystemExit(main(["--case", "percall"] + _sys.argv[1:]))
