"""What of the CUDA build ran on a GPU: per CUDA source, the last GPU run whose commit holds
it, and whether its code changed since. The docs' CUDA status is drawn from this, so that no
page calls code run on a GPU that changed after the run.

The evidence is a folder of result files (benchmarks/results): every ``cuda-*.json`` names
the commit it ran at (``machine.git_commit``) and the GPU (``machine.gpu.name``); a ``tests``
result (gpu_tests.py) adds the CUDA tests' counts and the sources that differed from the
commit where they ran. A run is the result files of one commit and one GPU.

The sources are the CUDA module of CMakeLists.txt (csrc/cuda/*.cu, the headers beside them,
and its bindings csrc/bindings/cuda.cpp) as committed at HEAD. A file's code is the file and
the repository's headers it includes, transitively ("x.cuh" beside it, "fastrank/x.h" in
csrc/include). Against the newest run whose commit holds the file, it is:

- ``ran as it is now``: the file and each header it includes are the blobs of that commit;
- ``emulated only since C``: one of them differs, C the first commit after the run that
  changed one (every commit is checked by the SIMT emulator and the SASS budgets; no GPU was);
- ``never ran on a GPU``: no run's commit holds it.

Only commits count (HEAD's tree, never the working tree), so committing the regenerated
table leaves it as it is, and a later commit that changes a CUDA source makes it stale:
``python -m benchmarks report --check`` then fails until the docs are regenerated. It needs
the history back to the runs' commits: without it (a shallow clone) it stops with
:class:`CudaStatusError`, never a table drawn from part of the history.

report.py's markers (the folder of the evidence relative to the page)::

    <!-- benchmarks table: ../benchmarks/results; layout=cuda-status -->     the table, a row a source
    <!-- benchmarks table: benchmarks/results; layout=cuda-status; view=summary -->
                                                    one line: how many ran as they are now, and where
    <!-- benchmarks table: ../../benchmarks/results; layout=cuda-status; files=kendall.cu,graded_list.cuh -->
                                                    one line: those sources
"""
from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import gpu_tests
from .results import is_partial, load

#: the sources of the CUDA module (CMakeLists.txt: the kernels' glob and the module's bindings)
SOURCES = ("csrc/cuda/*.cu", "csrc/cuda/*.cuh", "csrc/bindings/cuda.cpp")
#: where ``#include "fastrank/x.h"`` is found, after the including file's own folder
INCLUDE_DIRS = ("csrc/include",)
#: the page that holds the table, and its heading's anchor (the one-line status links it)
TABLE_PAGE = "docs/benchmarks.md"
TABLE_ANCHOR = "cuda-status"
ABBREV = 7
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)
#: a sentence that says code ran on a GPU: only the generated status may say it
CLAIM = re.compile(r"(?<!never )\b(?:ran|tested) on (?:an? |one |the )?(?:[\w-]+ ){0,3}?"
                   r"(?:GPU|H100|H200|A100|L4|L40S?)s?\b", re.I)


class CudaStatusError(ValueError):
    """The status cannot be drawn here (no git, or history missing): said in one line."""


class Git:
    """git at the repository that holds ``where``."""

    def __init__(self, where: Path):
        self.root = Path(where)
        self.root = Path(self("rev-parse", "--show-toplevel").strip())
        self._shown: Dict[str, str] = {}
        if self("rev-parse", "--is-shallow-repository").strip() == "true":
            raise CudaStatusError(f"{self.root} is a shallow clone: the CUDA status is drawn from the history "
                                  "back to every GPU run (git fetch --unshallow)")

    def __call__(self, *args: str) -> str:
        try:
            out = subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as err:
            raise CudaStatusError(f"the CUDA status needs git: {err}") from None
        if out.returncode != 0:
            raise CudaStatusError(f"the CUDA status needs a git checkout: git {' '.join(args)}: "
                                  f"{' '.join(out.stderr.split())}")
        return out.stdout

    def commit(self, rev: str, why: str) -> str:
        """The full hash of ``rev``; CudaStatusError when this checkout's history lacks it."""
        try:
            return self("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
        except CudaStatusError:
            raise CudaStatusError(f"commit {rev} ({why}) is not in the history of {self.root}: "
                                  "the CUDA status is drawn from the history back to every GPU run") from None

    def show(self, rev: str, path: str) -> str:
        key = f"{rev}:{path}"
        if key not in self._shown:
            self._shown[key] = self("show", key)
        return self._shown[key]

    def tree(self, rev: str) -> Dict[str, str]:
        """path -> blob id of every file of csrc/ at ``rev``."""
        out = self("ls-tree", "-r", rev, "--", "csrc")
        return {line.split("\t", 1)[1]: line.split()[2] for line in out.splitlines()}

    def short(self, *args: str) -> List[str]:
        """The abbreviated hashes ``git log`` lists (newest first, unless --reverse is given)."""
        return self("log", "--format=%h", f"--abbrev={ABBREV}", *args).split()


@dataclass
class Run:
    """The result files of one commit and one GPU."""
    commit: str                      # as the results name it
    gpu: str
    date: str
    files: List[str] = field(default_factory=list)
    tests: Optional[dict] = None     # the newest tests result's counts
    tests_file: Optional[str] = None
    modified: set = field(default_factory=set)   # sources that differed from the commit there
    full: str = ""
    time: int = 0


def runs(evidence: Path, git: Git) -> List[Run]:
    """The GPU runs of the evidence folder, newest first (a result without a commit or a GPU is none)."""
    by_key: Dict[tuple, Run] = {}
    for path in sorted(Path(evidence).glob("cuda-*.json")):
        if is_partial(path):
            continue
        payload = load(path)
        machine = payload.get("machine") or {}
        commit, gpu = machine.get("git_commit"), (machine.get("gpu") or {}).get("name")
        if not commit or not gpu:
            continue
        run = by_key.setdefault((commit, gpu), Run(commit, gpu, payload["created"][:10]))
        run.date = min(run.date, payload["created"][:10])
        run.files.append(path.name)
        if gpu_tests.is_tests(payload):
            run.modified |= set(payload.get("sources_modified") or ())
            if run.tests is None or payload["created"] > run.tests["created"]:
                run.tests, run.tests_file = {**payload["tests"], "created": payload["created"]}, path.name
    out = list(by_key.values())
    for run in out:
        run.full = git.commit(run.commit, f"the GPU run of {run.files[0]}")
        run.time = int(git("show", "-s", "--format=%ct", run.full).strip())
    # newest first: HEAD's ancestors nearest HEAD first, then any other commit by its time
    order = {c: i for i, c in enumerate(git("rev-list", "--topo-order", "HEAD").split())}
    return sorted(out, key=lambda r: (order.get(r.full, len(order)), -r.time, r.date))


def is_source(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, p) and path.count("/") == p.count("/") for p in SOURCES)


def code(git: Git, tree: Dict[str, str], path: str) -> List[str]:
    """``path`` and the files of ``tree`` it includes, transitively (as committed at HEAD)."""
    seen, todo = [path], [path]
    while todo:
        current = todo.pop()
        for name in _INCLUDE.findall(git.show("HEAD", current)):
            for folder in (posixpath.dirname(current),) + INCLUDE_DIRS:
                found = posixpath.normpath(posixpath.join(folder, name))
                if found in tree:
                    if found not in seen:
                        seen.append(found)
                        todo.append(found)
                    break
    return seen


@dataclass
class Row:
    path: str
    run: Optional[Run]
    changed: List[str]               # of the file's code, what differs from the run's commit
    since: Optional[str] = None      # the first commit after the run that changed one of them
    added: Optional[str] = None      # never run: the commit that added the file

    @property
    def ran_as_is(self) -> bool:
        return self.run is not None and not self.changed


@dataclass
class Status:
    rows: List[Row]
    last_change: str                 # the last commit that changed a source's code


def status(evidence: Path, where: Path) -> Status:
    """Every CUDA source at HEAD against the runs of ``evidence`` (``where``: a path in the repository)."""
    git = Git(where)
    head = git.tree("HEAD")
    sources = sorted(p for p in head if is_source(p))
    if not sources:
        raise CudaStatusError(f"no CUDA source ({', '.join(SOURCES)}) at HEAD of {git.root}")
    all_runs = runs(evidence, git)
    trees = {run.full: git.tree(run.full) for run in all_runs}
    rows, every = [], set()
    for path in sources:
        deps = code(git, head, path)
        every |= set(deps)
        run = next((r for r in all_runs if path in trees[r.full] and path not in r.modified), None)
        if run is None:
            rows.append(Row(path, None, deps, added=git.short("--diff-filter=A", "HEAD", "--", path)[-1]))
            continue
        changed = [d for d in deps if trees[run.full].get(d) != head[d] or d in run.modified]
        since = git.short("--reverse", f"{run.full}..HEAD", "--", *changed)[:1] if changed else []
        rows.append(Row(path, run, changed, since=since[0] if since else None))
    return Status(rows, git.short("-1", "HEAD", "--", *sorted(every))[0])


# ------------------------------------------------------------------ rendering

def _name(path: str) -> str:
    """A file as an #include names it (csrc/include/fastrank/x.h: fastrank/x.h), a source by its path."""
    for folder in INCLUDE_DIRS:
        if path.startswith(folder + "/"):
            return path[len(folder) + 1:]
    return posixpath.basename(path)


def _link(evidence_rel: str, name: str) -> str:
    return posixpath.join(evidence_rel, name)


def _now(row: Row, short: bool = False) -> str:
    """The status of a row (``short``: a changed header said, not named)."""
    if row.run is None:
        return f"**never ran on a GPU** (added in `{row.added}`)"
    if not row.changed:
        return "ran as it is now"
    since = f" since `{row.since}`" if row.since else f" (differs from `{row.run.commit}`)"
    if row.path in row.changed:
        return f"**emulated only**{since}"
    if short:
        return f"**emulated only**{since} (a header it includes changed)"
    return f"**emulated only**{since} (headers it includes: {', '.join(f'`{_name(p)}`' for p in sorted(row.changed))})"


def _run(run: Run) -> str:
    tests = f"; its CUDA tests: {gpu_tests.summary(run.tests)}" if run.tests else ""
    return f"`{run.commit}`, {run.date}, {run.gpu}{tests}"


def _tests(row: Row, evidence_rel: str) -> str:
    run = row.run
    if run is None:
        return ""
    if run.tests is None:
        return "not recorded"
    md = posixpath.splitext(run.tests_file)[0] + ".md"    # the result's rendering (report.py)
    return f"[{gpu_tests.summary(run.tests)}]({_link(evidence_rel, md)})"


def _source(evidence: Path, base: Path) -> str:
    rel = os.path.relpath(evidence, base)
    return f"[`{rel}`]({rel})"


def _from(evidence: Path, base: Path, page: str) -> str:
    return f"From {_source(evidence, base)} and git; per source: [CUDA status]({page}#{TABLE_ANCHOR})."


def table(st: Status, evidence: Path, base: Path) -> str:
    rel = os.path.relpath(evidence, base)
    lines = [f"From {_source(evidence, base)} (the GPU runs' `cuda-*` result files: the commit and GPU of each; "
             f"`*-tests-*`: its CUDA tests' counts) and git, for the CUDA sources as of `{st.last_change}` "
             "(the last commit that changed one, or a header one includes). A source's code is the file and "
             "the headers it includes; \"emulated only\": checked on every commit by the SIMT emulator and "
             "the SASS budgets, not run on a GPU since it changed.",
             "",
             "| CUDA source | last ran on a GPU at | GPU | the CUDA tests there | now |",
             "|---|---|---|---|---|"]
    for row in st.rows:
        run = row.run
        lines.append(f"| `{row.path}` | " + (f"`{run.commit}`, {run.date} | {run.gpu}" if run else "— | —")
                     + f" | {_tests(row, rel)} | {_now(row)} |")
    return "\n".join(lines) + "\n"


def line(st: Status, files: Sequence[str], evidence: Path, base: Path, root: Path) -> str:
    """One line: the status of ``files`` (paths or base names of CUDA sources)."""
    by_name = {}
    for row in st.rows:
        by_name[row.path] = by_name[posixpath.basename(row.path)] = row
    unknown = [f for f in files if f not in by_name]
    if unknown:
        raise ValueError(f"cuda-status files: {', '.join(unknown)} is no CUDA source at HEAD "
                         f"(the sources: {', '.join(posixpath.basename(r.path) for r in st.rows)})")
    page = os.path.relpath(root / TABLE_PAGE, base)
    rows = [by_name[f] for f in files]
    runs_of = {}
    for row in rows:
        if row.run is not None:
            runs_of.setdefault(row.run.full, (row.run, []))[1].append(f"`{posixpath.basename(row.path)}`")
    text = "; ".join(f"`{posixpath.basename(row.path)}` {_now(row, short=True)}" for row in rows) + "."
    if len(runs_of) == 1:
        (run, _), = runs_of.values()
        text += f" Last run on a GPU: {_run(run)}."
    for run, names in runs_of.values() if len(runs_of) > 1 else ():
        text += f" Last run on a GPU of {', '.join(names)}: {_run(run)}."
    return f"**CUDA status:** {text} {_from(evidence, base, page)}\n"


def summary(st: Status, evidence: Path, base: Path, root: Path) -> str:
    """One line: how many sources ran as they are now, are emulated only, never ran; the last runs."""
    page = os.path.relpath(root / TABLE_PAGE, base)
    ran = [r for r in st.rows if r.ran_as_is]
    emulated = [r for r in st.rows if r.run is not None and r.changed]
    never = [r for r in st.rows if r.run is None]
    parts = [f"{len(ran)} ran on a GPU as {'it is' if len(ran) == 1 else 'they are'} now" if ran
             else "none ran on a GPU as it is now"]
    if emulated:
        parts.append(f"{len(emulated)} {'is' if len(emulated) == 1 else 'are'} emulated only since their last GPU run")
    if never:
        names = ", ".join(f"`{posixpath.basename(r.path)}`" for r in never)
        parts.append(f"{len(never)} never ran on a GPU ({names})")
    runs_of = {}
    for row in ran + emulated:
        runs_of.setdefault(row.run.full, row.run)
    last = "; ".join(_run(run) for run in runs_of.values())
    return (f"**CUDA status:** of the {len(st.rows)} CUDA sources of the build, " + ", ".join(parts[:-1])
            + (" and " if len(parts) > 1 else "") + parts[-1] + "."
            + (f" Last GPU run{'s' if len(runs_of) > 1 else ''}: {last}." if runs_of else "")
            + f" {_from(evidence, base, page)}\n")


#: a marker's ``view``: the table (default), or one line of counts
VIEWS = ("table", "summary")


def render(spec: dict, base: Path) -> str:
    """The block of a ``layout=cuda-status`` marker (report.py): the table, ``view=summary``'s
    line of counts, or with ``files`` one line on those sources."""
    evidence = (base / spec["file"]).resolve()
    if not evidence.is_dir():
        raise ValueError(f"cuda-status: {spec['file']} is not a folder of result files")
    view = spec.get("view", "table")
    if view not in VIEWS:
        raise ValueError(f"cuda-status: view={view!r}: one of {', '.join(VIEWS)}")
    st = status(evidence, base)
    root = Path(Git(base).root)
    if spec.get("files"):
        return line(st, [f.strip() for f in spec["files"].split(",") if f.strip()], evidence, base, root)
    return summary(st, evidence, base, root) if view == "summary" else table(st, evidence, base)


def claims(text: str) -> List[str]:
    """The sentences of ``text`` (generated blocks left out) that say code ran on a GPU: such a
    claim is the generated status's alone, which changes when the code does."""
    return [m.group(0) for m in CLAIM.finditer(text)]
