"""Independent jobs run in worker processes, with a log that lets a cut run resume.

A job is a JSON-able dict with a ``"key"`` (unique in the run); ``fn(job)`` returns a JSON-able
result. Jobs run in ``workers`` processes (spawned, one torch thread each: a job's result must not
depend on which worker ran it or on what ran before it there), longest first when the caller orders
them so. Every finished job is appended to the log (one JSON line: key, the run's ``conf`` hash and
the result) before the next is taken, so that ``resume=True`` reuses every job of the log whose
``conf`` matches and runs only the rest.
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional


def conf_hash(conf: dict) -> str:
    """What a logged result must have been run under to be reused."""
    return hashlib.sha256(json.dumps(conf, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Log:
    """The finished jobs of a run, one JSON line each (``path`` None: kept in memory only)."""

    def __init__(self, path: Optional[Path], conf: dict, resume: bool):
        self.path, self.conf = path, conf_hash(conf)
        self.done: Dict[str, dict] = {}
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume and path.is_file():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:   # a line cut by the interruption
                    continue
                if entry.get("conf") == self.conf:
                    self.done[entry["key"]] = entry["result"]
        else:
            path.write_text("")

    def add(self, key: str, result: dict) -> None:
        self.done[key] = result
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({"key": key, "conf": self.conf, "result": result}) + "\n")

    def remove(self) -> None:
        if self.path is not None and self.path.is_file():
            self.path.unlink()


def _init_worker() -> None:
    import torch
    torch.set_num_threads(1)


def run(jobs: Iterable[dict], fn: Callable[[dict], dict], log: Log, workers: int,
        on_result: Optional[Callable[[dict, dict], None]] = None) -> Dict[str, dict]:
    """Runs the jobs not in ``log`` (in ``workers`` processes; 1: in this process, in order) and
    returns every job's result by key. ``on_result(job, result)`` is called as each one finishes
    (a reused one included)."""
    jobs = list(jobs)
    todo: List[dict] = []
    for job in jobs:
        if job["key"] in log.done:
            if on_result:
                on_result(job, log.done[job["key"]])
        else:
            todo.append(job)
    if workers <= 1:
        for job in todo:
            result = fn(job)
            log.add(job["key"], result)
            if on_result:
                on_result(job, result)
        return {j["key"]: log.done[j["key"]] for j in jobs}
    os.environ.setdefault("OMP_NUM_THREADS", "1")   # inherited by the spawned workers
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                             initializer=_init_worker) as pool:
        pending = {pool.submit(fn, job): job for job in todo}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                job = pending.pop(fut)
                result = fut.result()          # a failed job stops the run with its traceback
                log.add(job["key"], result)
                if on_result:
                    on_result(job, result)
    return {j["key"]: log.done[j["key"]] for j in jobs}
