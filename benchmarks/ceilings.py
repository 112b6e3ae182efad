"""What the device can do at best (its ceilings), and an op's floor from them.

Measured at the start of a sweep and by the ``floors`` case (``measure_ceilings``):

- ``copy_bytes_per_s``: device-to-device copy of a large buffer, counting the bytes read
  AND written (what a streaming kernel can move);
- ``exp_per_s``: exponentials per second. CUDA: a tiny jiterator kernel (NVRTC, no
  fastrank code) with independent chains of ``__expf``, the same hardware exp the
  kernels use (ex2.approx on the special-function unit); CPU: ``exp_per_s_1core``, the
  one-core vector exp rate (the faster of torch.exp and numpy.exp over a large float32
  array, 2^20 elements, with one thread), times the thread count (``threads``);
- ``fp32_per_s``: fp32 operations (one per lane) per second (CUDA: jiterator FMA chains;
  CPU: half the matmul flop rate, i.e. the FMA lanes at the rate a matmul reaches);
- ``cmp_select_add_per_s`` (CPU only): compare + select + add per element, the work of
  one Kendall-like pair: ``cmp_select_add_per_s_1core`` (the faster of torch
  ``maximum`` + ``add_`` and numpy ``greater`` + ``multiply`` + ``add``, library
  element-wise kernels over float32 vectors of 2^16 elements (L2-resident), one thread)
  times ``threads``; and, where a C++ compiler is found, ``cmp_select_add_loop_per_s_1core``:
  a tight C++ loop doing exactly that (``acc += r_j > r[k] ? s[k] : 0``, whole vectors,
  four accumulators, data in L1) built with the CPU module's flags: the tighter bound,
  kept beside the library rate: a record whose work floor is pair work also gets
  ``loop_s`` and ``measured_over_loop_floor`` from it (the CPU sweep and the floors case
  measure it);
- ``matmul_flops_per_s``: torch.mm of float32 matrices (TF32 off).

An op (ops.py) gives its work as counts (``Op.floor``): bytes that must move
(inputs read once, outputs written once), exponentials, other fp32 instructions,
matmul flops. Then

    bytes floor = bytes / copy_bytes_per_s
    work floor  = max(exp / exp_per_s, fp32 / fp32_per_s, mm_flop / matmul_flops_per_s,
                      cmp_select_add / cmp_select_add_per_s)
    floor       = max(bytes floor, work floor);   reported: measured / floor

A unit whose rate was not measured is left out (and said so in ``methods``).

On the CPU the exp and compare+select+add rates are a library's (torch's / numpy's
vectorised element-wise kernels, one pass per library call), not hardware bounds: a
fused kernel with a cheaper polynomial exp, or one that keeps its values in registers
between the compare, the select and the add, or data that stay in cache (the copy
bandwidth is measured on buffers larger than the caches), can run below this "floor";
measured / floor < 1 says exactly that. The CPU rates are measured on one core and
scaled by the thread count, so a run with ``--threads 1`` gets a one-core floor. On the GPU the exp rate is the special-function unit's, a hardware
bound.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from typing import Callable, Optional

import torch

from .timing import time_call


def _best_time(call: Callable[[], None], device: torch.device, repeats: int = 5) -> float:
    """The fastest of a few calls: a ceiling is what the device can do at best."""
    call()
    return min(time_call(call, device) for _ in range(repeats))


def _copy_bandwidth(device: torch.device, quick: bool) -> float:
    n = (256 << 20) // 4 if device.type == "cuda" else (128 << 20) // 4
    if quick:
        n //= 8
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    t = _best_time(lambda: dst.copy_(src), device)
    return 2 * n * 4 / t


def _matmul_rate(device: torch.device, quick: bool) -> float:
    n = (8192 if device.type == "cuda" else 1024) // (4 if quick else 1)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.rand(n, n, device=device)
        b = torch.rand(n, n, device=device)
        c = torch.empty(n, n, device=device)
        t = _best_time(lambda: torch.mm(a, b, out=c), device, repeats=3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return 2.0 * n ** 3 / t


_EXP_CHAIN = """
template <typename T> T fastrank_exp_chain(T x) {
  float a = x, b = x + 0.25f, c = x + 0.5f, d = x + 0.75f;
  for (int i = 0; i < 256; ++i) {
    a = __expf(-a); b = __expf(-b); c = __expf(-c); d = __expf(-d);
  }
  return a + b + c + d;
}
"""
_FMA_CHAIN = """
template <typename T> T fastrank_fma_chain(T x) {
  float a = x, b = x + 0.25f, c = x + 0.5f, d = x + 0.75f;
  float e = x + 1.f, f = x + 1.25f, g = x + 1.5f, h = x + 1.75f;
  for (int i = 0; i < 256; ++i) {
    a = fmaf(a, 0.999f, 0.001f); b = fmaf(b, 0.999f, 0.001f);
    c = fmaf(c, 0.999f, 0.001f); d = fmaf(d, 0.999f, 0.001f);
    e = fmaf(e, 0.999f, 0.001f); f = fmaf(f, 0.999f, 0.001f);
    g = fmaf(g, 0.999f, 0.001f); h = fmaf(h, 0.999f, 0.001f);
  }
  return a + b + c + d + e + f + g + h;
}
"""


def _jiterator_rate(code: str, per_element: int, device: torch.device) -> float:
    from torch.cuda import jiterator
    fn = jiterator._create_jit_fn(code)
    x = torch.rand(1 << 24, device=device)
    t = _best_time(lambda: fn(x), device, repeats=5)
    return per_element * x.numel() / t


def _nominal_cuda_rates(device: torch.device) -> dict:
    """Data-sheet rates from the SM count and max clock (fallback when NVRTC fails):
    16 special-function results and 128 fp32 lanes per SM per clock (sm_80 / sm_90)."""
    props = torch.cuda.get_device_properties(device)
    clock_hz = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits",
                              f"--id={device.index or 0}"], capture_output=True, text=True, timeout=20)
        clock_hz = float(out.stdout.strip().splitlines()[0]) * 1e6
    except Exception:  # noqa: BLE001
        clock_hz = getattr(props, "clock_rate", 0) * 1e3 or None
    if not clock_hz:
        return {}
    sms = props.multi_processor_count
    return {"exp_per_s": 16 * sms * clock_hz, "fp32_per_s": 128 * sms * clock_hz}


def _one_thread(fn):
    """fn() with torch on one thread (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def _cpu_exp_rate_1core(quick: bool) -> tuple:
    """One core's vector exp rate: the faster of torch.exp (one thread) and numpy.exp
    (single-threaded; AVX2 / AVX-512 where the CPU has it) over a large float32 array
    (2^20 elements, 4 MB: past L2, so a call is long enough that its dispatch does not
    count). The fastest of many calls is kept: robust on a shared machine.
    Returns (exps per second, which)."""
    import numpy as np

    x = torch.rand(1 << 20) * -10
    out = torch.empty_like(x)
    xn, outn = x.numpy(), out.numpy()
    reps = 5 if quick else 20
    cpu = torch.device("cpu")
    t_torch = _one_thread(lambda: _best_time(lambda: torch.exp(x, out=out), cpu, repeats=reps))
    t_numpy = _best_time(lambda: np.exp(xn, out=outn), cpu, repeats=reps)
    t, which = min((t_torch, "torch.exp"), (t_numpy, "numpy.exp"))
    return x.numel() / t, which


def _cpu_cmp_select_add_rate_1core(quick: bool) -> tuple:
    """One core's rate of a compare + select + add per element (a Kendall-like pair:
    is the pair active, its hinge, the sum), with library element-wise kernels on one
    thread over L2-resident float32 vectors (2^16 elements): the faster of
    torch (``torch.maximum(a, b, out=t)``: compare + select in one kernel, then
    ``acc.add_(t)``) and numpy (``greater`` into a bool mask, ``multiply`` by the mask
    as the select, ``add`` into the accumulator). Returns (elements per second, which)."""
    import numpy as np

    n = 1 << 16
    a, b = torch.rand(n), torch.rand(n)
    t, acc = torch.empty(n), torch.zeros(n)
    mask = np.empty(n, dtype=bool)
    an, bn, tn, accn = a.numpy(), b.numpy(), t.numpy(), acc.numpy()
    reps = 10 if quick else 50
    cpu = torch.device("cpu")

    def torch_step():
        torch.maximum(a, b, out=t)
        acc.add_(t)

    def numpy_step():
        np.greater(an, bn, out=mask)
        np.multiply(an, mask, out=tn)
        np.add(accn, tn, out=accn)

    t_torch = _one_thread(lambda: _best_time(torch_step, cpu, repeats=reps))
    t_numpy = _best_time(numpy_step, cpu, repeats=reps)
    best, which = min((t_torch, "torch maximum + add_"), (t_numpy, "numpy greater + multiply + add"))
    return n / best, which


_CMP_SELECT_ADD_LOOP = r"""
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>
static double now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  const long np = 512, Q = np / 4, rows = argc > 1 ? std::atol(argv[1]) : 2048;
  std::mt19937 g(0);
  std::uniform_real_distribution<float> u;
  std::vector<float> s(np), ra(np);
  for (long i = 0; i < np; ++i) { s[i] = u(g) - 0.5f; ra[i] = u(g) + 0.1f; }
  double best = 1e9;
  float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now();
    for (long q = 0; q < rows; ++q) {
      for (long j = 0; j < np; ++j) {
        const float rj = ra[j] - 0.1f + q * 1e-7f;
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        const float* __restrict sp = s.data();
        const float* __restrict rp = ra.data();
#pragma omp simd reduction(+ : a0, a1, a2, a3)
        for (long k = 0; k < Q; ++k) {
          a0 += rj > rp[k] ? sp[k] : 0.0f;
          a1 += rj > rp[k + Q] ? sp[k + Q] : 0.0f;
          a2 += rj > rp[k + 2 * Q] ? sp[k + 2 * Q] : 0.0f;
          a3 += rj > rp[k + 3 * Q] ? sp[k + 3 * Q] : 0.0f;
        }
        sink += a0 + a1 + a2 + a3;
      }
    }
    const double t = now() - t0;
    best = t < best ? t : best;
  }
  std::printf("%.6e %g\n", double(rows) * np * np / best, sink);
}
"""

# the CPU module's flags (CMakeLists.txt), so the loop vectorises as the kernels do
CPU_FLAGS = ["-O3", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math",
              "-march=native", "-fopenmp", "-std=gnu++17"]


def cpp_cmp_select_add_rate_1core(quick: bool = False) -> float:
    """Pairs per second of a tight C++ compare + select + add loop on one core (thread
    CPU time, best of 5 rounds); raises OSError / CalledProcessError without a compiler."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise OSError("no C++ compiler (c++, g++ or $CXX)")
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "loop.cpp"), os.path.join(d, "loop")
        with open(src, "w") as f:
            f.write(_CMP_SELECT_ADD_LOOP)
        subprocess.run([cxx, *CPU_FLAGS, src, "-o", exe], check=True, capture_output=True, timeout=120)
        out = subprocess.run([exe, "256" if quick else "2048"], check=True, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120).stdout
    return float(out.split()[0])


def measure_ceilings(device: torch.device, quick: bool = False, cpp_loop: bool = False) -> dict:
    """The device's measured rates (see module docstring); a few seconds at most
    (quick: smaller buffers, a rough estimate in well under a second)."""
    device = torch.device(device)
    ceil: dict = {"methods": {}}
    t0 = time.perf_counter()
    ceil["copy_bytes_per_s"] = _copy_bandwidth(device, quick)
    ceil["methods"]["copy_bytes_per_s"] = "dst.copy_(src), read + write bytes"
    try:
        ceil["matmul_flops_per_s"] = _matmul_rate(device, quick)
        ceil["methods"]["matmul_flops_per_s"] = "torch.mm float32, TF32 off"
    except Exception as e:  # noqa: BLE001
        ceil["methods"]["matmul_flops_per_s"] = f"n/a ({type(e).__name__})"
    if device.type == "cuda":
        try:
            ceil["exp_per_s"] = _jiterator_rate(_EXP_CHAIN, 4 * 256, device)
            ceil["fp32_per_s"] = _jiterator_rate(_FMA_CHAIN, 8 * 256, device)
            ceil["methods"]["exp_per_s"] = "jiterator kernel, 4 chains of __expf"
            ceil["methods"]["fp32_per_s"] = "jiterator kernel, 8 chains of fmaf"
        except Exception as e:  # noqa: BLE001
            nominal = _nominal_cuda_rates(device)
            ceil.update(nominal)
            why = f"jiterator failed ({type(e).__name__}: {str(e)[:120]})"
            for k in ("exp_per_s", "fp32_per_s"):
                ceil["methods"][k] = (f"nominal: SMs x clock ({why})" if k in nominal else f"n/a: {why}")
    else:
        ceil["threads"] = torch.get_num_threads()
        ceil["exp_per_s_1core"], which = _cpu_exp_rate_1core(quick)
        ceil["methods"]["exp_per_s_1core"] = (f"{which} (the faster of torch.exp and numpy.exp), "
                                              "float32, 2^20 elements, one thread")
        ceil["cmp_select_add_per_s_1core"], which = _cpu_cmp_select_add_rate_1core(quick)
        ceil["methods"]["cmp_select_add_per_s_1core"] = (f"{which} (the faster of torch and numpy), "
                                                         "float32, 2^16 elements, one thread")
        if cpp_loop:
            try:
                ceil["cmp_select_add_loop_per_s_1core"] = cpp_cmp_select_add_rate_1core(quick)
                ceil["methods"]["cmp_select_add_loop_per_s_1core"] = (
                    "C++ loop acc += r_j > r[k] ? s[k] : 0 (CPU module flags, 4 accumulators, L1), "
                    "one thread, thread CPU time")
            except (OSError, subprocess.SubprocessError) as e:
                ceil["methods"]["cmp_select_add_loop_per_s_1core"] = f"n/a ({type(e).__name__}: {str(e)[:120]})"
        complete_cpu_ceilings(ceil)
    ceil["measure_s"] = time.perf_counter() - t0
    return ceil


def complete_cpu_ceilings(ceil: dict) -> dict:
    """CPU rates for ``threads`` threads from the one-core rates, and the CPU fp32 rate
    from the matmul rate (also for results saved before these fields existed)."""
    threads = ceil.get("threads") or 1
    for unit in ("exp_per_s", "cmp_select_add_per_s", "cmp_select_add_loop_per_s"):
        one = ceil.get(unit + "_1core")
        if one and not ceil.get(unit):
            ceil[unit] = one * threads
            ceil.setdefault("methods", {})[unit] = f"{unit}_1core x {threads} thread(s)"
    if not ceil.get("fp32_per_s") and ceil.get("matmul_flops_per_s"):
        ceil["fp32_per_s"] = ceil["matmul_flops_per_s"] / 2
        ceil.setdefault("methods", {})["fp32_per_s"] = \
            "matmul flops / 2: the FMA lanes at the rate a matmul reaches"
    return ceil


_UNITS = (("exp", "exp_per_s"), ("fp32", "fp32_per_s"), ("mm_flop", "matmul_flops_per_s"),
          ("cmp_select_add", "cmp_select_add_per_s"))


def floor_of(counts: Optional[dict], ceilings: dict) -> Optional[dict]:
    """The floors of one case from its counts; None without a model."""
    if not counts:
        return None
    out = {"counts": counts}
    bw = ceilings.get("copy_bytes_per_s")
    out["bytes_s"] = counts.get("bytes", 0) / bw if bw else None
    work = [(counts[c] / ceilings[r], c) for c, r in _UNITS if counts.get(c) and ceilings.get(r)]
    out["work_s"], out["work_unit"] = max(work) if work else (None, None)
    both = [v for v in (out["bytes_s"], out["work_s"]) if v]
    out["floor_s"] = max(both) if both else None
    out["bound"] = None if not both else ("bytes" if out["floor_s"] == out["bytes_s"] else "work")
    loop = ceilings.get("cmp_select_add_loop_per_s")
    if loop and out["work_unit"] == "cmp_select_add":
        out["loop_s"] = counts["cmp_select_add"] / loop   # the tighter CPU bound: a C++ loop of that work
    return out


def annotate(records, ops_by_name: dict, ceilings: dict) -> None:
    """Add ``floor`` (and measured / floor) to every ok record whose op has a model."""
    for rec in records:
        op = ops_by_name.get(rec["op"])
        if op is None or op.floor is None or rec["status"] != "ok":
            continue
        itemsize = torch.empty((), dtype=getattr(torch, rec["dtype"])).element_size()
        counts = op.floor(rec["mode"], rec["size"], itemsize)
        fl = floor_of(counts, ceilings)
        if fl and fl["floor_s"]:
            fl["measured_over_floor"] = rec["time"]["median_s"] / fl["floor_s"]
            if fl.get("loop_s"):
                fl["measured_over_loop_floor"] = rec["time"]["median_s"] / fl["loop_s"]
            if counts.get("bytes") and rec["time"]["median_s"] > 0:
                fl["effective_bytes_per_s"] = counts["bytes"] / rec["time"]["median_s"]
        rec["floor"] = fl
