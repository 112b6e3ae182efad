"""Two (or more) gloo ranks on CPU for the tests, bounded so that no machine can hang the run.

- ``init(rank, port, world_size)``: loopback only (``GLOO_SOCKET_IFNAME=lo``, so the test does
  not depend on what the hostname resolves to), a short init timeout, and a per-rank
  faulthandler deadline that dumps every thread's stack and exits.
- ``group(rank, port, world_size)``: a context for a rank's work: ``init`` on entry; on an
  exception the group is destroyed and the exception goes on (the parent sees the rank
  fail); on success ``leave()``.
- ``leave()``: the end of a rank that succeeded. A barrier, then ``os._exit(0)`` without tearing
  the group down. With torch 2.13, destroying a gloo group from Python (for example the DDP
  reducer's last reference, dropped when the worker returns) joins gloo's worker threads
  while holding the GIL, and a worker thread still releasing a collective issued during
  backward needs the GIL to free the Python context autograd stashed in it: about 1 run in 4
  of tests/test_distributed.py hung for ever (py-spy: ``~ProcessGroupGloo`` ->
  ``std::thread::join`` on the main thread, ``~AsyncAllreduceWork`` -> ``gil_scoped_acquire``
  on the worker). Every rank is past the barrier and has written its results, so nothing is
  lost by exiting there.
- ``spawn(worker, args, nprocs)``: ``torch.multiprocessing.spawn`` with a polling join that
  kills the ranks and fails the test past a deadline (a rank's error is re-raised as usual).
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

INIT_TIMEOUT_S = 60
RANK_DEADLINE_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank: int, port: int, world_size: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    faulthandler.dump_traceback_later(RANK_DEADLINE_S, exit=True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=INIT_TIMEOUT_S))


@contextlib.contextmanager
def group(rank: int, port: int, world_size: int):
    init(rank, port, world_size)
    try:
        yield
    except BaseException:
        dist.destroy_process_group()
        raise
    leave()


def leave() -> None:
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(worker, args: tuple, nprocs: int) -> None:
    ctx = mp.spawn(worker, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + RANK_DEADLINE_S + 30
    while not ctx.join(timeout=1.0):          # raises if a rank failed
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{nprocs} gloo ranks did not finish within {RANK_DEADLINE_S + 30} s")
