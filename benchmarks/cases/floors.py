"""floors: the device's ceilings, the rates every op's floor is computed from (ceilings.py).

    python -m benchmarks floors                  # CPU: copy bandwidth, exp, compare+select+add, matmul
    python -m benchmarks floors --threads 1      # the one-core rates alone
    python -m benchmarks floors --device cuda    # GPU: copy bandwidth, __expf and FMA chains, matmul

CPU: copy bandwidth over buffers larger than the caches; the one-core vector exp rate
(the faster of torch.exp and numpy.exp); the one-core compare+select+add rate of library
element-wise kernels and of a tight C++ loop built with the CPU module's flags (the
Kendall pair's work); float32 matmul. GPU: copy bandwidth, exp and FMA rates of small
jiterator kernels (no fastrank code), matmul with TF32 off. The sweep measures the same
at its start and reports every native case against them.
"""
from __future__ import annotations

import time

from ..case import Case, payload
from ..ceilings import measure_ceilings
from ..results import machine_info


def run(args, device, save):
    t0 = time.monotonic()
    machine = machine_info(device)
    ceilings = measure_ceilings(device, quick=args.quick, cpp_loop=True)
    print(f"ceilings: {ceilings}", flush=True)
    report = {"method": ["every rate is the best of a few calls (what the device can do at best); "
                         "CPU rates are measured on one core and scaled by the thread count"]}
    return payload("floors", device, {"quick": args.quick, "threads": args.threads}, [], report, machine, t0,
                   ceilings=ceilings)


CASE = Case("floors", "the device's ceilings behind every floor: copy bandwidth, exp rate, compare+select+add "
                      "(library and C++ loop), fp32 and matmul rates", run)
