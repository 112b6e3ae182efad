"""A GPU run's CUDA test counts as a result file, ``cuda-<date>-tests[-<tag>].json``.

The commit and the GPU it ran on (results.machine_info) and pytest's counts, read from its
JUnit XML. gpu_check.sh writes one right after its CUDA tests; cuda_status.py reads these
files, beside the benchmark results of the same commit, as the evidence of what ran on a GPU.

    python -m benchmarks gpu_tests --junit cuda-tests.xml --out DIR [--tag TAG] [--selection TEXT]

The payload is in the results layout (results.py), with no records and a ``tests`` object::

    {"schema": 2, "case": "tests", "created", "device": "cuda", "machine": {..., "git_commit", "gpu"},
     "config": {"command": what wrote the file, "source": where the counts come from},
     "tests": {"passed", "failed", "skipped", "errors", "failures": [test ids], "selection": text},
     "sources_modified": [paths of csrc/ and CMakeLists.txt that differed from the commit] | null,
     "notes": [text, ...], "results": [], "complete": true}

``sources_modified`` null: unknown (no git where the tests ran). A run that was cut before
pytest wrote its XML leaves no file: counts of a part of the suite are no evidence.
"""
from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import List, Optional

from . import tables
from .cli_args import A

CASE = "tests"
#: the files whose local changes make a run's commit not the code that ran
SOURCES = ("csrc", "CMakeLists.txt")
ROOT = Path(__file__).resolve().parents[1]


def is_tests(payload: dict) -> bool:
    return payload.get("case") == CASE


def counts(junit: Path) -> dict:
    """passed / failed / skipped / errors and the failed tests' ids, from pytest's JUnit XML."""
    out = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "failures": []}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        kind = ("failed" if "failure" in tags else "errors" if "error" in tags
                else "skipped" if "skipped" in tags else "passed")
        out[kind] += 1
        if kind in ("failed", "errors"):
            out["failures"].append(f"{case.get('classname')}::{case.get('name')}")
    return out


def summary(tests: dict) -> str:
    """``315 passed, 1 failed, 13 skipped`` (the zero counts left out, as pytest prints it)."""
    parts = [f"{tests[k]} {k if k != 'errors' else 'error' + ('s' if tests[k] != 1 else '')}"
             for k in ("passed", "failed", "skipped", "errors") if tests.get(k)]
    return ", ".join(parts) or "no tests"


def modified_sources(root: Path = ROOT) -> Optional[List[str]]:
    """The paths of csrc/ and CMakeLists.txt that differ from the checkout's commit; None without git."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", *SOURCES], cwd=root,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sorted(line[3:].strip() for line in out.stdout.splitlines() if line.strip())


def payload(junit: Path, machine: dict, created: str, command: str, selection: str,
            modified: Optional[List[str]]) -> dict:
    return {"schema": 2, "case": CASE, "created": created, "device": "cuda", "machine": machine,
            "config": {"command": command, "source": f"pytest's JUnit XML ({Path(junit).name})"},
            "tests": {**counts(junit), "selection": selection}, "sources_modified": modified,
            "notes": [], "results": [], "complete": True}


def markdown(payload: dict) -> str:
    """The ``.md`` of a tests result (report.py writes it beside the JSON)."""
    t = payload["tests"]
    lines = [f"# {CASE}: {payload['device']}, {payload['created'][:10]}", "", f"- {tables.provenance(payload)}",
             f"- the tests: {t['selection']}", f"- counts from {payload['config']['source']}"]
    modified = payload.get("sources_modified")
    lines.append("- sources changed from the commit where the tests ran: "
                 + ("unknown" if modified is None else ", ".join(f"`{p}`" for p in modified) or "none"))
    lines += ["", f"**{summary(t)}**", ""]
    if t["failures"]:
        lines += ["Failed:", ""] + [f"- `{name}`" for name in t["failures"]] + [""]
    for note in payload.get("notes") or []:
        lines += [note, ""]
    return "\n".join(lines)


def parser() -> A.Parser:
    p = A.Parser(prog="python -m benchmarks gpu_tests", description=__doc__.splitlines()[0])
    p.add_argument("--junit", required=True, type=A.existing_file, help="pytest's --junitxml file")
    p.add_argument("--out", required=True, type=A.out_dir, help="folder of the result file")
    p.add_argument("--tag", type=A.name, default=None, help="file name suffix: cuda-<date>-tests-<tag>")
    p.add_argument("--selection", default="the CUDA tests", help="which tests ran (the pytest selection), in words")
    p.add_argument("--force", action="store_true", help="replace a result file of the same name that git tracks")
    return p


@A.command
def main(argv=None) -> int:
    args = parser().parse_args(argv)
    import torch

    from . import results
    prog = parser().prog
    if not torch.cuda.is_available():
        A.fail(prog, "torch sees no CUDA device: a tests result records a run on a GPU")
    path = args.out / (results.stem(torch.device("cuda"), CASE, args.tag or "") + ".json")
    if results.committed(path) and not args.force:
        A.fail(prog, f"{path} is tracked by git: give --tag, or --force")
    results.write_json(path, payload(args.junit, results.machine_info(torch.device("cuda")), results.created_now(),
                                     results.command_line(), args.selection, modified_sources()))
    path.with_suffix(".md").write_text(markdown(results.load(path)))
    print(f"wrote {path} and its .md: {summary(results.load(path)['tests'])}")
    return 0
