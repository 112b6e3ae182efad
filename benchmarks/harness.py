"""Measuring a set of implementations of an op over its sizes: guard, warm-up, timed
repeats, peak memory, one record per (op, implementation, mode, size).

The sweep, slate, metrics and peer cases run their ops through :func:`bench_ops`; an op is
an ``ops.Op`` (or anything with the same fields). For each case:

1. Guard. Skip (with the reason recorded) when the estimated memory exceeds the budget
   (a fraction of the free memory; the estimate is the op's analytic one, corrected by
   what was measured at the previous size), or when even two calls (time extrapolated
   from the previous size with the op's cost model) would not fit the per-case limit;
   when warm-up + ``min_repeats`` do not fit, fewer repeats are run.
2. Warm-up. One call (for torch.compile this one compiles: its time is recorded as
   ``first_call_s``), a second one if the first was quick. Peak extra memory is
   measured on the last warm-up call (memory.py).
3. Repeats until ``max_repeats`` calls or ``repeat_budget_s`` seconds (at least
   ``min_repeats``), timed with timing.py; reported: median, quartiles, min, max (and on
   the CPU the median CPU time of the process, all threads).

Modes: ``forward`` (inputs do not require grad), ``backward`` (the forward is run
untimed before each call; the call is the backward alone), ``forward+backward``.
NotImplementedError anywhere becomes "skipped: not implemented", so ops that are not
written yet show up as such instead of breaking the run.
"""
from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from .memory import PeakMemory, available_bytes
from .results import MODES
from .tables import fmt_bytes
from .timing import summarize, time_call


@dataclass
class Config:
    device: torch.device
    dtype: torch.dtype = torch.float32
    min_repeats: int = 3
    max_repeats: int = 30
    repeat_budget_s: float = 3.0       # time spent on timed repeats of one case
    case_limit_s: float = 120.0        # skip a case whose predicted cost exceeds this
    mem_fraction: float = 0.5          # of the free memory, for one case
    mem_budget_bytes: Optional[float] = None   # hard cap (used by --quick)
    deadline: Optional[float] = None   # time.monotonic() after which cases are skipped
    seed: int = 0
    no_warmup: bool = False            # time the first call (used for the one-off --huge case)
    max_warmup: int = 2                # 1: a single warm-up call (--quick)
    compile_reserve_s: float = 0.0     # with a deadline: no first torch.compile call when less is left

    def mem_budget(self) -> float:
        b = self.mem_fraction * available_bytes(self.device)
        return min(b, self.mem_budget_bytes) if self.mem_budget_bytes else b


@dataclass
class History:
    """What earlier sizes of the same (op, impl, mode) measured: the guard's evidence."""
    last: Dict[tuple, dict] = field(default_factory=dict)

    def update(self, key, size_work, seconds, peak, est):
        self.last[key] = {"work": size_work, "seconds": seconds, "peak": peak, "est": est}

    def predict_seconds(self, key, size_work) -> Optional[float]:
        """The previous size's fastest call scaled by the work ratio; None when there is
        no previous size or it is more than 64x smaller (overheads dominate there)."""
        h = self.last.get(key)
        if not h or not h["work"] or size_work > 64 * h["work"]:
            return None
        return h["seconds"] * size_work / h["work"]

    def mem_correction(self, key) -> float:
        """measured / estimated at the previous size (clamped to >= 0.25); 1 when the
        previous peak was under 8 MB, where fixed overheads (allocator, thread stacks,
        page granularity) swamp the op's own memory."""
        h = self.last.get(key)
        if not h or not h["peak"] or not h["est"] or h["peak"] < (8 << 20):
            return 1.0
        return max(0.25, h["peak"] / h["est"])


class Skip(Exception):
    """A case that is not run, with the reason recorded in the results."""


# ------------------------------------------------------------------------ one case

def _backward(out, grad_cache: dict) -> None:
    """Backpropagate a scalar loss, or a tuple of tensors with cached all-ones grads."""
    if isinstance(out, torch.Tensor) and out.dim() == 0:
        out.backward()
        return
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(o, torch.Tensor) and o.requires_grad]
    grads = []
    for o in outs:
        key = (tuple(o.shape), o.dtype, o.device)
        if key not in grad_cache:
            grad_cache[key] = torch.ones_like(o)
        grads.append(grad_cache[key])
    torch.autograd.backward(outs, grads)


def _calls(fn, inputs, mode):
    """(setup, call) for a mode; setup runs untimed before every call."""
    grad_cache: dict = {}
    state: dict = {}
    leaves = [t for t in inputs.values() if isinstance(t, torch.Tensor) and t.requires_grad]

    def clear():
        for t in leaves:
            t.grad = None

    if mode == "forward":
        return (lambda: None), (lambda: fn(**inputs))
    if mode == "backward":
        def setup():
            clear()
            state["out"] = fn(**inputs)

        def call():
            _backward(state.pop("out"), grad_cache)
        return setup, call

    def call_fb():
        _backward(fn(**inputs), grad_cache)
    return clear, call_fb


def classify_error(e: BaseException) -> tuple:
    """(status, reason) for an exception raised by a case."""
    chain, cur = [], e
    while cur is not None and len(chain) < 8:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    text = " | ".join(f"{type(c).__name__}: {c}" for c in chain)
    if isinstance(e, Skip):
        return "skipped", str(e)
    if any(isinstance(c, NotImplementedError) for c in chain) or "NotImplementedError" in text:
        return "skipped", "not implemented"
    if "impl='native'" in text:
        return "skipped", "native kernels unavailable: " + str(e).split(", but ")[-1][:120]
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in text.lower() \
            or "can't allocate memory" in text:
        return "skipped", "out of memory"
    first = text.splitlines()[0] if text else type(e).__name__
    return "error", first[:300]


def record_error(rec: dict, e: BaseException) -> None:
    """A case's exception into its record: status and reason (classify_error), and for a
    real error the last frames of the traceback (call inside the except block)."""
    rec["status"], rec["reason"] = classify_error(e)
    if rec["status"] == "error":
        rec["traceback"] = traceback.format_exc(limit=6)


def run_case(spec, impl: str, fn, mode: str, size: dict, cfg: Config, history: History) -> dict:
    """Run one case and return its record (status "ok", "skipped" or "error"). ``fn`` is
    the implementation, or a string saying why it cannot run."""
    rec = {"op": spec.name, "group": spec.group or spec.name, "impl": impl, "mode": mode, "size": dict(size),
           "size_label": spec.size_label(size), "x": spec.x_of(size),
           "dtype": str(cfg.dtype).replace("torch.", ""), "device": str(cfg.device),
           "status": "ok", "reason": None, "time": None, "memory": None,
           "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    key = (spec.name, impl, mode)
    wall0 = time.perf_counter()
    itemsize = torch.empty((), dtype=cfg.dtype).element_size()
    work = spec.work(size)
    est = spec.est_bytes(impl, mode, size, itemsize)
    cpu = cfg.device.type == "cpu"
    inputs = None
    try:
        if not callable(fn):
            raise Skip(fn or "not implemented")
        if cfg.deadline is not None and time.monotonic() > cfg.deadline:
            raise Skip("run time limit reached")
        if (impl == "compiled" and cfg.deadline is not None and key not in history.last
                and cfg.deadline - time.monotonic() < cfg.compile_reserve_s):
            raise Skip(f"run time limit reached (under {cfg.compile_reserve_s:g} s left to compile)")
        guarded = est * history.mem_correction(key)
        budget = cfg.mem_budget()
        rec["memory_estimate_bytes"] = guarded
        if guarded > budget:
            raise Skip(f"would not fit: needs ~{fmt_bytes(guarded)}, budget {fmt_bytes(budget)}")
        pred = history.predict_seconds(key, work)
        min_repeats, max_repeats = cfg.min_repeats, cfg.max_repeats
        if pred is not None and pred * (1 + min_repeats) > cfg.case_limit_s:
            calls = int(cfg.case_limit_s / pred)      # warm-up + repeats that fit the limit
            if calls < 2:
                raise Skip(f"too slow: predicted ~{pred:.3g} s per call, case limit {cfg.case_limit_s:g} s")
            min_repeats = max_repeats = calls - 1     # fewer repeats rather than none

        torch.manual_seed(cfg.seed)
        inputs = spec.inputs(size, cfg.device, cfg.dtype, mode != "forward")
        setup, call = _calls(fn, inputs, mode)
        meter = PeakMemory(cfg.device)

        # warm-up: one call, or two when the first compiles or a call is quick
        # (predicted < 1 s); peak memory is measured on the last warm-up call.
        # no_warmup: the first call is the only one, timed and measured.
        times: List[float] = []
        cpu_times: List[float] = []
        setup()
        if cfg.no_warmup:
            with meter.measure() as m:
                c0 = time.process_time()
                times.append(time_call(call, cfg.device))
                cpu_times.append(time.process_time() - c0)
            rec["warmup"] = 0
        elif impl != "compiled" and (cfg.max_warmup < 2 or min_repeats < cfg.min_repeats
                                      or (pred is not None and pred > 1.0)):
            with meter.measure() as m:
                rec["first_call_s"] = time_call(call, cfg.device)
            rec["warmup"] = 1
        else:
            rec["first_call_s"] = time_call(call, cfg.device)
            setup()
            with meter.measure() as m:
                call()
            rec["warmup"] = 2
        rec["memory"] = {"peak_bytes": m.peak_bytes, "method": meter.method}
        if spec.out_bytes and m.peak_bytes is not None:
            rec["memory"]["peak_over_one_output"] = m.peak_bytes / spec.out_bytes(size, itemsize)

        # timed repeats
        t_start = time.perf_counter()
        while len(times) < max_repeats:
            if len(times) >= min_repeats and time.perf_counter() - t_start >= cfg.repeat_budget_s:
                break
            if cfg.deadline is not None and time.monotonic() > cfg.deadline and len(times) >= 1:
                break
            setup()
            c0 = time.process_time()
            times.append(time_call(call, cfg.device))
            cpu_times.append(time.process_time() - c0)
        rec["time"] = summarize(times, cpu_times if cpu else None)
        history.update(key, work, rec["time"]["min_s"], m.peak_bytes, est)
    except Skip as s:
        rec["status"], rec["reason"] = "skipped", str(s)
    except Exception as e:  # noqa: BLE001 - any failure is recorded, the run goes on
        record_error(rec, e)
    finally:
        inputs = None
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
        rec["wall_s"] = time.perf_counter() - wall0
    return rec


def probe(spec, fns: Dict[str, object], cfg: Config) -> Dict[str, str]:
    """Impls that cannot run at all (not implemented, native not built), with the reason:
    one tiny forward call each, so their cases are skipped without retrying every size."""
    out = {}
    small = spec.sizes["quick"][0]
    for impl, fn in fns.items():
        if not callable(fn) or impl == "compiled":
            continue
        try:
            fn(**spec.inputs(small, cfg.device, cfg.dtype, False))
        except Exception as e:  # noqa: BLE001
            status, reason = classify_error(e)
            if status == "skipped" and reason != "out of memory":
                out[impl] = reason
    return out


def make_impls(spec, names, cfg: Config, skip: Optional[Dict[str, str]] = None) -> Dict[str, object]:
    """impl -> its function, or a string saying why it cannot run (the op is missing
    from fastrank, the factory failed, a tiny probe call was not implemented; compiled
    follows the reference it compiles)."""
    missing = spec.missing() if hasattr(spec, "missing") else None
    fns: Dict[str, object] = {}
    for name in names:
        if name not in spec.impls:
            continue
        if missing or (skip and name in skip):
            fns[name] = missing or skip[name]
            continue
        try:
            fns[name] = spec.impls[name]()
        except Exception as e:  # noqa: BLE001
            fns[name] = classify_error(e)[1]
    bad = probe(spec, fns, cfg)
    fns.update(bad)
    if callable(fns.get("compiled")) and "reference" in bad:
        fns["compiled"] = bad["reference"]
    return fns


ORDERS = ("depth", "breadth")


def case_order(prepared, modes, sizes_of, order: str = "depth"):
    """(spec, fns, mode, size) in the order the cases run; sizes_of(spec) -> its sizes.

    depth: modes in priority order (forward+backward first), then ops, then each op's
      sizes small to large: with a time limit, the last ops are not reached at all.
    breadth: every op's smallest size (each mode, forward+backward first), then every
      op's second size, and so on: a time limit cuts the largest sizes, never an op.
      Each (op, impl, mode) still sees its sizes in increasing order, so the guards'
      extrapolation from the previous size works the same.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    modes = [m for m in MODES if m in modes]
    if order == "depth":
        for mode in modes:
            for spec, fns in prepared:
                if mode in spec.modes:
                    for size in sizes_of(spec):
                        yield spec, fns, mode, size
        return
    rounds = max((len(sizes_of(spec)) for spec, _ in prepared), default=0)
    for i in range(rounds):
        for mode in modes:
            for spec, fns in prepared:
                sizes = sizes_of(spec)
                if mode in spec.modes and i < len(sizes):
                    yield spec, fns, mode, sizes[i]


def bench_ops(specs: list, impls, modes, cfg: Config, sizes_of, log=print,
              order: str = "depth", skip: Optional[Dict[str, str]] = None,
              on_record=None) -> List[dict]:
    """Every (op, impl, mode, size), in ``order`` (see case_order); sizes_of(spec) -> the
    sizes to run; ``skip``: impl -> why it is not run (recorded as skipped). A compiled
    implementation whose first call fails is not retried at larger sizes. ``on_record``:
    called with the records so far after each one (a case saves them, so that a run cut
    from outside keeps what it measured)."""
    records: List[dict] = []
    history = History()
    prepared = [(spec, make_impls(spec, impls, cfg, skip)) for spec in specs]
    for spec, fns, mode, size in case_order(prepared, modes, sizes_of, order):
        for impl, fn in fns.items():
            rec = run_case(spec, impl, fn, mode, size, cfg, history)
            records.append(rec)
            log(_line(rec))
            if on_record is not None:
                on_record(records)
            if impl == "compiled" and rec["status"] == "error":
                fns[impl] = "torch.compile failed: " + rec["reason"][:200]
    return records


def _line(rec: dict) -> str:
    head = f"{rec['op']:<18} {rec['mode']:<17} {rec['size_label']:>15} {rec['impl']:<10}"
    if rec["status"] != "ok":
        return f"{head} {rec['status']}: {rec['reason']}"
    t = rec["time"]
    mem = rec["memory"]["peak_bytes"]
    mem_s = fmt_bytes(mem) if mem is not None else "n/a"
    return (f"{head} {t['median_s'] * 1e3:10.3f} ms  [{t['p25_s'] * 1e3:.3f}, {t['p75_s'] * 1e3:.3f}]"
            f"  x{t['repeats']:<3} peak {mem_s}")


def run_peer_case(case: str, op, args, device: torch.device, x_key: str, ratios: List[str], method: str,
                  config: dict) -> dict:
    """The whole run of a case that measures one op's implementations side by side in
    forward+backward over its sizes (memory_bank, pml_smooth_ap): the config (``--quick``:
    few repeats), the sizes (``--max-n`` bounds ``size[x_key]``), the records and the payload."""
    from .case import payload
    from .memory import PeakMemory
    from .results import machine_info
    t0 = time.monotonic()
    machine = machine_info(device)
    cfg = Config(device=device, dtype=getattr(torch, args.dtype))
    if args.quick:
        cfg.min_repeats, cfg.max_repeats, cfg.repeat_budget_s, cfg.max_warmup = 1, 3, 0.02, 1
    size_key = "quick" if args.quick else device.type
    records = bench_ops([op], args.impls or list(op.impls), ["forward+backward"], cfg,
                        lambda o: [s for s in o.sizes[size_key] if args.max_n is None or s[x_key] <= args.max_n],
                        log=lambda s: print(s, flush=True))
    report = {"baselines": {op.name: op.baseline}, "ratios": ratios, "x_names": {op.name: op.x_name},
              "method": [f"forward+backward, {args.dtype}, {method}; peak extra memory: {PeakMemory(device).method}"]}
    conf = {"quick": args.quick, "dtype": args.dtype, "threads": args.threads, **config}
    return payload(case, device, conf, records, report, machine, t0)
