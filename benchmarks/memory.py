"""Peak extra memory of one call: how many bytes a call needs beyond what was already live.

- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the
  bytes allocated before the call (the inputs).
- CPU: the resident set size (RSS), because tracemalloc does not see torch's
  allocations. Preferred method: reset the kernel's peak-RSS counter (write "5" to
  /proc/self/clear_refs, Linux >= 4.0), run, read VmHWM from /proc/self/status: exact and
  free. Fallback (clear_refs not writable): a background thread samples
  /proc/self/statm every ~0.5 ms while the call runs (torch and fastrank release the GIL
  in their kernels, so the sampler keeps running).
  Before the baseline, garbage is collected and glibc is asked to give freed heap pages
  back (malloc_trim), so that pages freed by earlier cases are not silently reused.

Usage::

    meter = PeakMemory(device)
    with meter.measure() as m:
        call()
    m.peak_bytes, meter.method
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
import time

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def release_freed_memory() -> None:
    """gc, then return free heap pages to the OS (glibc only; a no-op elsewhere)."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _Result:
    peak_bytes: int = 0


class _Sampler(threading.Thread):
    def __init__(self, period_s: float = 0.0005):
        super().__init__(daemon=True)
        self.period_s = period_s
        self.peak = rss_bytes()
        self._stop = threading.Event()

    def run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.period_s)

    def stop(self) -> int:
        self._stop.set()
        self.join()
        return max(self.peak, rss_bytes())


class PeakMemory:
    """Measures the peak extra bytes of the code run inside ``measure()``."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.method = "cuda max_memory_allocated"
        elif os.path.exists("/proc/self/statm") and _reset_hwm():
            self.method = "RSS high-water mark (clear_refs + VmHWM)"
        elif os.path.exists("/proc/self/statm"):
            self.method = "RSS sampled every 0.5 ms"
        else:
            self.method = "unavailable"

    @contextlib.contextmanager
    def measure(self):
        res = _Result()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield res
            torch.cuda.synchronize(self.device)
            res.peak_bytes = max(0, torch.cuda.max_memory_allocated(self.device) - base)
        elif self.method.startswith("RSS high-water"):
            release_freed_memory()
            _reset_hwm()
            base = _status_kb("VmHWM") * 1024
            yield res
            res.peak_bytes = max(0, _status_kb("VmHWM") * 1024 - base)
        elif self.method.startswith("RSS sampled"):
            release_freed_memory()
            base = rss_bytes()
            sampler = _Sampler()
            sampler.start()
            try:
                yield res
            finally:
                peak = sampler.stop()
            res.peak_bytes = max(0, peak - base)
        else:
            yield res
            res.peak_bytes = None


def available_bytes(device: torch.device) -> int:
    """Memory a case may still use: free GPU memory, or MemAvailable on the host."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        avail = _status_meminfo("MemAvailable")
    except (OSError, KeyError):
        avail = 4 << 30
    return min(avail, _cgroup_room())


def _cgroup_room() -> int:
    """Bytes left under a container's memory limit (cgroup v2 or v1); huge if none."""
    for limit_f, usage_f in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                             ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                              "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_f) as f:
                limit = f.read().strip()
            with open(usage_f) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            return max(0, int(limit) - usage)
    return 1 << 62


def _status_meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)
