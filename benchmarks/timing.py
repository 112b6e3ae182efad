"""Timing one call: wall clock (CUDA: events), CPU time, and the statistics of repeats.

Two ways to time, for two kinds of call:

- :func:`time_call`: one call at a time (the sweep, slates, metrics: calls of a
  millisecond or more), repeated by the caller; :func:`summarize` gives the median,
  quartiles, min and max of the repeats.
- :func:`autorange`: calls too short to time one by one (the per-call case: tens of
  microseconds): timeit style, k back-to-back calls per sample with k grown until a sample
  takes ``sample_s``, then samples of k calls; per-call time = sample / k.

CPU: ``time.perf_counter`` (and ``time.process_time``, the CPU time of every thread of the
process, which exceeds the wall time when several cores work); CUDA: events on the current
stream around the call, so device time is what is measured.
"""
from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, List, Optional

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(call: Callable[[], None], device: torch.device, k: int = 1) -> float:
    """Seconds taken by k back-to-back calls (CUDA: events around them, after a sync)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(k):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for _ in range(k):
        call()
    return time.perf_counter() - t0


def time_call(call: Callable[[], None], device: torch.device) -> float:
    return time_calls(call, device, 1)


def first_call_and_repeats(call: Callable[[], None], device: torch.device, mem, repeat_under_s: float) -> dict:
    """A large call timed as the size cases time it: the first call, with its peak extra memory
    (``mem``: a memory.PeakMemory), or the median of 2 more calls when it took under
    ``repeat_under_s``. The record's fields ``first_call_s``, ``time`` and ``memory``."""
    with mem.measure() as res:
        first = time_call(call, device)
    times = [first] if first >= repeat_under_s else [time_call(call, device) for _ in range(2)]
    return {"first_call_s": first, "time": summarize(times),
            "memory": {"peak_bytes": res.peak_bytes, "method": mem.method}}


def summarize(times: List[float], cpu_times: Optional[List[float]] = None) -> dict:
    """median, quartiles, min and max of the repeats (and the median CPU time when given)."""
    ts = sorted(times)
    if len(ts) >= 2:
        q = statistics.quantiles(ts, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25 = p75 = ts[0]
    out = {"median_s": statistics.median(ts), "p25_s": p25, "p75_s": p75,
           "min_s": ts[0], "max_s": ts[-1], "repeats": len(ts)}
    if cpu_times:
        out["cpu_median_s"] = statistics.median(cpu_times)
    return out


def autorange(step: Callable[[], None], device: torch.device, sample_s: float, samples: int,
              min_samples: int = 3, case_s: float = 5.0, max_calls: int = 100000) -> dict:
    """First call, then k at least doubled until k calls take ``sample_s``, then up to
    ``samples`` samples of k calls (at least ``min_samples``, no more after ``case_s``
    seconds). The garbage collector is off while timing. Returns ``first_call_s`` and
    ``time`` (per-call statistics over the samples, ``calls_per_sample`` = k)."""
    t0 = time.perf_counter()
    step()
    sync(device)
    first = time.perf_counter() - t0
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        k, per_call = 1, []
        while True:
            t = time_calls(step, device, k)
            if t >= sample_s or k >= max_calls:
                break
            k = min(max_calls, max(2 * k, int(k * sample_s / max(t, 1e-9) * 0.6) or 1))
        if k == 1 and t >= sample_s:   # a slow call: this batch of one is a sample already
            per_call.append(t)
        start = time.perf_counter()
        while len(per_call) < samples:
            if len(per_call) >= min_samples and time.perf_counter() - start >= case_s:
                break
            per_call.append(time_calls(step, device, k) / k)
    finally:
        if was_enabled:
            gc.enable()
    stats = summarize(per_call)
    stats["calls_per_sample"] = k
    return {"first_call_s": first, "time": stats}
