"""Two (or more) gloo ranks on CPU for the tests, bounded so that no machine can hang the run.

- ``init(rank, port, world_size)``: loopback only (``GLOO_SOCKET_IFNAME=lo``, so the test does
  not depend on what the hostname resolves to), gloo's own timeout for a peer that never
  comes, and every thread's stack printed on SIGUSR1 (what ``spawn`` sends a rank it ends).
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
- ``spawn(worker, args, nprocs)``: ``torch.multiprocessing.spawn``, joined; a rank's error is
  re-raised as usual. A hung rank is the test run's own timeout to end (pytest-timeout,
  ``timeout`` in pyproject.toml, which fails the test in its main thread): on the way out the
  ranks still running print every thread's stack one at a time (they share stderr) and are
  killed, so none outlives the test.
  No test here measures time.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import socket
import sys
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

#: gloo's timeout for the rendezvous and each collective (a peer that died is an error, not a hang)
INIT_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank: int, port: int, world_size: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    faulthandler.register(signal.SIGUSR1, all_threads=True)
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
    try:
        while not ctx.join(timeout=1.0):      # raises if a rank failed
            pass
    finally:                                  # the test failed or timed out with ranks running
        # one rank at a time: the ranks share stderr, and two stacks dumped at once interleave
        for p in [p for p in ctx.processes if p.is_alive()]:
            os.kill(p.pid, signal.SIGUSR1)
            p.join(timeout=2.0)               # its stack printed (it keeps running: SIGUSR1 only dumps)
            p.kill()
            p.join()
