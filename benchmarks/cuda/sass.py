"""The pair loops of the CUDA kernels, counted in the SASS ptxas wrote (sm_90 cubins, nvdisasm).

A *pair loop* is an innermost loop of a kernel whose body evaluates the logistic of a pair
of list items: every pair loop of the smooth-rank kernels (smooth-NDCG, Smooth-AP,
Recall@k) evaluates exactly one exp per pair, so the loop body's MUFU.EX2 instructions
are the pairs one iteration covers (an unrolled body of 4 pairs holds 4). Per pair:

    instructions / pair = the body's instructions / its MUFU.EX2 count
    MUFU / pair         = the body's MUFU instructions (EX2, RCP, TANH, ...) / its MUFU.EX2 count

How the loops are found (``loops``): nvdisasm -c -g prints each function's instructions
with their addresses, labels and the source line each came from (the kernels are built
with -lineinfo, CMakeLists.txt). A loop is a branch to a label at a lower address (a
backward branch); an innermost loop is one whose address range [label, branch] holds no
other backward branch. Its body is that range, every instruction counted once per
iteration (the pair loops are straight-line bodies: predicated, no forward branch inside;
``Loop.forward_branches`` says when one is, and then the count is an upper bound). Where
a source loop compiles to several SASS loops (the unrolled body and its remainder, or one
copy per unrolled direction), the one that covers the most pairs an iteration is the
loop's count. A loop is named by the source line of its backward branch (ptxas puts it
on the ``for``) and, in this tree, by the ``// pair loop: NAME`` comment on that line
or the line above it; kernels of older trees (``--rev``) have no such comment and are
named by their line.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

_INSTR = re.compile(r"^\s*/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<text>.*?)\s*;\s*(?:/\*.*)?$")
_LABEL = re.compile(r"^(?P<label>\.L_x_\d+):")
_LINE = re.compile(r'//## File "(?P<file>[^"]+)", line (?P<line>\d+)')
_FUNC = re.compile(r"^\.text\.(?P<name>\S+):\s*$")
_BRANCH = re.compile(r"^(?:@!?U?P[T0-9]\s+)?BRA(?:\.\w+)*\s+`?\(?(?P<label>\.L_x_\d+)\)?")
MARKER = re.compile(r"//\s*pair loop:\s*(?P<name>[^\n]+?)\s*$")


def wheel_nvdisasm() -> Optional[str]:
    """nvdisasm from the pip wheel ``nvidia-cuda-nvdisasm`` (a test extra of pyproject.toml: CI
    installs it), or on PATH (cuda_resources.find_nvdisasm tries the CUDA toolkit first)."""
    for base in {sys.prefix, *(p for p in sys.path if p.endswith("site-packages"))}:
        for cand in sorted(glob.glob(os.path.join(base, "**", "nvidia", "**", "bin", "nvdisasm"), recursive=True)):
            if os.access(cand, os.X_OK):
                return cand
    return shutil.which("nvdisasm")


@dataclasses.dataclass
class Instr:
    addr: int
    opcode: str           # e.g. "MUFU.EX2", "FADD", "BRA"
    text: str             # the whole instruction, predicate included
    file: str = ""        # the source file it came from (base name)
    line: int = 0


@dataclasses.dataclass
class Loop:
    kernel: str           # mangled name of the function
    start: int            # address of the loop's first instruction (its label)
    end: int              # address of the backward branch
    instrs: List[Instr]
    file: str = ""        # source file and line of the backward branch (the `for`)
    line: int = 0
    name: str = ""        # the `// pair loop:` comment, or "<file>:<line>"

    @property
    def count(self) -> int:
        return len(self.instrs)

    def opcodes(self, prefix: str) -> int:
        return sum(1 for i in self.instrs if i.opcode.startswith(prefix))

    @property
    def pairs(self) -> int:
        """Pairs one iteration covers: one exp a pair (MUFU.EX2)."""
        return self.opcodes("MUFU.EX2")

    @property
    def mufu(self) -> int:
        return self.opcodes("MUFU")

    @property
    def forward_branches(self) -> int:
        return sum(1 for i in self.instrs[:-1] if i.opcode.startswith("BRA"))

    @property
    def per_pair(self) -> float:
        return self.count / self.pairs

    @property
    def mufu_per_pair(self) -> float:
        return self.mufu / self.pairs


def parse(text: str) -> Dict[str, List[Instr]]:
    """mangled function name -> its instructions (nvdisasm -c -g output); labels are kept as
    Instr(opcode=".label", text=<label>) entries at the address of the next instruction."""
    funcs: Dict[str, List[Instr]] = {}
    cur: Optional[List[Instr]] = None
    file, line = "", 0
    pending: List[str] = []
    for raw in text.splitlines():
        m = _FUNC.match(raw)
        if m:
            cur = funcs.setdefault(m["name"], [])
            file, line, pending = "", 0, []
            continue
        if cur is None:
            continue
        m = _LINE.search(raw)
        if m:
            file, line = os.path.basename(m["file"]), int(m["line"])
            continue
        m = _LABEL.match(raw)
        if m:
            pending.append(m["label"])
            continue
        m = _INSTR.match(raw)
        if m:
            addr = int(m["addr"], 16)
            for lab in pending:
                cur.append(Instr(addr, ".label", lab, file, line))
            pending = []
            body = re.sub(r"^@!?U?P[T0-9]\s+", "", m["text"])
            cur.append(Instr(addr, body.split()[0] if body else "", m["text"], file, line))
    return funcs


def innermost_loops(kernel: str, instrs: Sequence[Instr]) -> List[Loop]:
    labels = {i.text: i.addr for i in instrs if i.opcode == ".label"}
    code = [i for i in instrs if i.opcode != ".label"]
    back = []
    for i in code:
        if i.opcode.startswith("BRA"):
            m = _BRANCH.match(i.text.strip())
            if m and m["label"] in labels and labels[m["label"]] <= i.addr:
                back.append((labels[m["label"]], i))
    loops = []
    for start, br in back:
        nested = any(s >= start and b.addr < br.addr and (s, b.addr) != (start, br.addr) for s, b in back)
        if nested:
            continue
        body = [i for i in code if start <= i.addr <= br.addr]
        loops.append(Loop(kernel, start, br.addr, body, br.file, br.line))
    return loops


def marker_names(source: Path) -> Dict[int, str]:
    """line -> name of every ``// pair loop: NAME`` comment of a source file (the comment's
    own line and the line below it, where the ``for`` is)."""
    names: Dict[int, str] = {}
    for no, text in enumerate(source.read_text().splitlines(), start=1):
        m = MARKER.search(text)
        if m:
            names.setdefault(no, m["name"])
            names.setdefault(no + 1, m["name"])
    return names


def pair_loops(cubin: Path, tool: str, sources: Sequence[Path] = (), marked_only: bool = True) -> Dict[str, List[Loop]]:
    """mangled kernel name -> its pair loops (innermost loops with a MUFU.EX2; with
    `marked_only`, only those a ``// pair loop:`` comment of `sources` names), one per source
    loop: the SASS loop covering the most pairs an iteration (the unrolled body; of equal
    ones, the longest)."""
    r = subprocess.run([tool, "-c", "-g", str(cubin)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {cubin.name}: {r.stderr[-2000:]}")
    names: Dict[str, Dict[int, str]] = {}
    for s in sources:
        names[s.name] = marker_names(s)
    out: Dict[str, List[Loop]] = {}
    for kernel, instrs in parse(r.stdout).items():
        best: Dict[tuple, Loop] = {}
        for lp in innermost_loops(kernel, instrs):
            if lp.pairs == 0:
                continue
            named = names.get(lp.file, {}).get(lp.line)
            if named is None and marked_only:
                continue
            lp.name = named or f"{lp.file}:{lp.line}"
            key = (lp.file, lp.line)
            old = best.get(key)
            if old is None or (lp.pairs, lp.per_pair) > (old.pairs, old.per_pair):
                best[key] = lp
        if best:
            out[kernel] = sorted(best.values(), key=lambda lp: (lp.file, lp.line))
    return out
