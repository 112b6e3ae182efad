"""``fastrank check``: every native op against its pure-PyTorch reference, on every device of
this machine, in about a minute.

The ops are the table's rows with native kernels (``NATIVE_OPS``, src/fastrank/ops/registry.py).
An op's cases are its contract's examples (src/fastrank/ops/_contract.py: small inputs, a
mask where the op takes one, both directions and one direction alone, top-k lists for a loss
that takes a :class:`fastrank.TopKRelevance`), and an example over both directions again with
each direction alone; each case in float32, float64 and bfloat16. A case runs the op with
``impl="native"`` on a device, its values and the gradients of a fixed weighted sum of them,
and compares them with ``impl="reference"`` in float64 on the same (rounded) input, by the rule
of the CUDA test matrix (src/fastrank/_tolerance.py): float32 and float64 within
``atol + rtol |reference|``, bfloat16 at most twice the error of the reference run in bfloat16.

The devices: the CPU at every instruction-set level this CPU runs (the level in use here,
each other one in a child process with ``FASTRANK_CPU_ISA`` set, since a level is picked at
import; with ``FASTRANK_CPU_ISA`` already set, that level alone), and every CUDA device torch
sees, under each version of the CUDA kernels (:func:`fastrank.kernel_variant`).

One line per case (op, device, dtype, case, the largest error against its tolerance, ok or
FAIL), then a summary line; exit status 0 when every case passed, 1 otherwise.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _native
from ._tolerance import TOLERANCE, low_precision_bound
from .ops._contract import Example
from .ops.registry import NATIVE_OPS, Loss
from .topk import TopKRelevance

DTYPES = (torch.float32, torch.float64, torch.bfloat16)
DIRECTIONS = ("i2t", "t2i")
OK, FAIL = "ok", "FAIL"
SUMMARY = "fastrank check:"


# ---------------------------------------------------------------- the versions of the CUDA kernels
def cuda_kernel_versions() -> Tuple[int, ...]:
    """The versions of the CUDA kernels built side by side (smooth-NDCG and the smooth-rank
    engine's forward: 1 and 2, docs/developing.md); every op runs under each (an op with one
    version runs it each time), selected per call by :func:`fastrank.kernel_variant`."""
    return _native.VERSIONS


# ---------------------------------------------------------------- the cases
def cases(row: Loss, dtype: torch.dtype) -> List[Example]:
    """The cases of an op in ``dtype``: its contract's examples (for a loss that takes a
    TopKRelevance, one with top-k lists among them), and an example over both directions again
    with each direction alone."""
    out = []
    for ex in row.examples(dtype):
        out.append(ex)
        if ex.hyper.get("direction") == "both":
            out += [dataclasses.replace(ex, name=f"{ex.name}; {d} alone", hyper={**ex.hyper, "direction": d})
                    for d in DIRECTIONS]
    return out


def _converter(device: torch.device, dtype: Optional[torch.dtype] = None) -> Callable:
    """An example's input on ``device`` (and its floating-point tensors in ``dtype``)."""
    def convert(value):
        if isinstance(value, TopKRelevance):
            return value.to(device=device, dtype=dtype or value.values.dtype)
        if isinstance(value, Tensor):
            value = value.detach()
            return value.to(device=device, dtype=dtype if dtype is not None and value.is_floating_point() else None)
        return value
    return convert


def outputs_and_grads(functional: Callable, ex: Example, impl: str, convert: Callable = lambda v: v) -> List[Tensor]:
    """The output tensors of ``functional`` on the example's inputs (each mapped by
    ``convert``) with ``impl``, then the gradients of its gradient inputs (``ex.grad``) from a
    fixed weighted sum of the differentiable outputs, all detached."""
    inputs = {name: convert(value) for name, value in ex.inputs.items()}
    for name in ex.grad:
        inputs[name] = inputs[name].detach().requires_grad_(True)
    out = functional(**inputs, **{**ex.hyper, "impl": impl})
    outs = [out] if isinstance(out, Tensor) else [t for t in out if t is not None]
    grads = []
    if ex.grad:
        diff = [o for o in outs if o.requires_grad]
        if not diff:
            raise RuntimeError("returned nothing differentiable")
        total = sum((o * torch.linspace(0.5, 1.5, o.numel(), dtype=torch.float64).to(o).reshape(o.shape)).sum()
                    for o in diff)
        grads = list(torch.autograd.grad(total, [inputs[name] for name in ex.grad]))
    return [t.detach() for t in outs + grads]


# ---------------------------------------------------------------- one case against its reference
@dataclasses.dataclass(frozen=True)
class Result:
    """One case on one device: its largest error and the tolerance there (``detail``: why it
    has none, e.g. the exception it raised)."""
    op: str
    where: str
    dtype: str
    case: str
    ok: bool
    error: float = math.nan
    tolerance: float = math.nan
    detail: str = ""

    def line(self) -> str:
        what = self.detail or f"max error {self.error:.2e} tolerance {self.tolerance:.2e}"
        return f"{self.op:<28} {self.where:<12} {self.dtype:<8} {self.case:<32} {what}  {OK if self.ok else FAIL}"


class _Mismatch(Exception):
    """The native op's outputs are not those of the reference (their number, a shape, an index)."""


def _paired(got: Sequence[Tensor], want: Sequence[Tensor]) -> Iterator[Tuple[Tensor, Tensor]]:
    """(native, reference) output pairs, on the CPU in float64; integer outputs (indices) must
    be equal."""
    if len(got) != len(want):
        raise _Mismatch(f"{len(got)} outputs and gradients, the reference {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        g = g.cpu()
        if g.shape != w.shape:
            raise _Mismatch(f"output {i} of shape {tuple(g.shape)}, the reference's {tuple(w.shape)}")
        if not w.is_floating_point():
            if not torch.equal(g, w):
                raise _Mismatch(f"output {i}: {int((g != w).sum())} of {w.numel()} entries differ")
            continue
        yield g.double(), w.double()


def _max_error(got: Sequence[Tensor], want: Sequence[Tensor]) -> float:
    return max((float((g - w).abs().nan_to_num(math.inf).max()) for g, w in _paired(got, want) if w.numel()),
               default=0.0)


def _full_precision(got, want, dtype) -> Tuple[float, float]:
    """(error, tolerance) at the worst entry (error / tolerance largest) of every output."""
    tol = TOLERANCE[dtype]
    worst = (0.0, tol["atol"], 0.0)
    for g, w in _paired(got, want):
        if not w.numel():
            continue
        err = (g - w).abs().nan_to_num(math.inf)
        bound = tol["atol"] + tol["rtol"] * w.abs()
        ratio = (err / bound).nan_to_num(math.inf)   # a NaN on either side fails
        i = int(ratio.argmax())
        if float(ratio.flatten()[i]) > worst[2]:
            worst = (float(err.flatten()[i]), float(bound.flatten()[i]), float(ratio.flatten()[i]))
    return worst[0], worst[1]


class References:
    """The reference outputs of each case, computed once and shared by every device and version
    (float64 on the CPU; for half precision also the reference run in that dtype)."""

    def __init__(self):
        self._done: Dict[tuple, List[Tensor]] = {}

    def get(self, row: Loss, ex: Example, dtype: torch.dtype, key: tuple) -> List[Tensor]:
        if key not in self._done:
            self._done[key] = outputs_and_grads(row.functional, ex, "reference",
                                                _converter(torch.device("cpu"), dtype))
        return self._done[key]


def check_case(row: Loss, ex: Example, dtype: torch.dtype, device: torch.device, where: str,
               references: References, key: tuple) -> Result:
    """Case ``ex`` of ``row`` (its inputs in ``dtype``) with impl="native" on ``device`` against
    the reference (src/fastrank/_tolerance.py)."""
    name = str(dtype).replace("torch.", "")
    result = functools.partial(Result, row.name, where, name, ex.name)
    try:
        want = references.get(row, ex, torch.float64, key + ("float64",))
        got = outputs_and_grads(row.functional, ex, "native", _converter(device))
        if dtype in TOLERANCE:
            error, tol = _full_precision(got, want, dtype)
        else:
            low = references.get(row, ex, dtype, key + (name,))
            error, tol = _max_error(got, want), low_precision_bound(_max_error(low, want))
    except _Mismatch as e:
        return result(False, detail=str(e))
    except Exception as e:  # a kernel that raises fails its case; the check goes on
        return result(False, detail=f"raised {type(e).__name__}: {' '.join(str(e).split())[:160]}")
    return result(error <= tol, error, tol)


# ---------------------------------------------------------------- the devices
class Tally:
    """The lines printed so far: how many cases, which failed, on which devices."""

    def __init__(self):
        self.cases = 0
        self.failed: List[str] = []
        self.where: List[str] = []

    def add(self, line: str, ok: bool, op: str) -> None:
        print(line, flush=True)
        self.cases += 1
        if not ok:
            self.failed.append(op)

    def result(self, result: Result) -> None:
        if result.where not in self.where:
            self.where.append(result.where)
        self.add(result.line(), result.ok, result.op)


def check_device(rows: Sequence[Loss], device: torch.device, where: str, references: References,
                 tally: Tally) -> None:
    """Every case of every op of ``rows`` in every dtype on ``device``."""
    for row in rows:
        for dtype in DTYPES:
            for i, ex in enumerate(cases(row, dtype)):
                tally.result(check_case(row, ex, dtype, device, where, references, (row.name, str(dtype), i)))


def check_cpu_level(level: str, ops: Sequence[str], tally: Tally) -> None:
    """The CPU cases at another instruction-set level: ``fastrank check --device cpu`` in a child
    process with FASTRANK_CPU_ISA=<level> (a level is picked at import), its lines relayed."""
    package_root = str(Path(__file__).resolve().parents[1])   # the same fastrank as this process
    code = (f"import sys; sys.path.insert(0, {package_root!r}); from fastrank.cli import main; "
            f"sys.exit(main(['check', '--device', 'cpu', '--ops', {','.join(ops)!r}]))")
    env = {**os.environ, _native.CPU_ISA_VARIABLE: level}
    other, cases, failed = [], 0, 0
    with subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as child:
        for line in child.stdout:
            line = line.rstrip("\n")
            status = line.rsplit(None, 1)[-1] if line.strip() else ""
            if status in (OK, FAIL) and not line.startswith(SUMMARY):
                tally.add(line, status == OK, line.split(None, 1)[0])   # an op's name has no space
                cases += 1
                failed += status == FAIL
            elif not line.startswith(SUMMARY):
                other.append(line)
    where = f"cpu/{level}"
    tally.where.append(where)
    if child.returncode not in (0, 1) or (child.returncode == 1) != (failed > 0) or not cases:
        last = " | ".join(x for x in other[-3:] if x.strip())
        tally.result(Result("(every op)", where, "-", "the child process", False,
                            detail=f"exited with status {child.returncode}: {last}"))


def _cuda_devices(device: str) -> List[torch.device]:
    if device == "cpu" or not torch.cuda.is_available():
        return []
    if device == "auto":
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    d = torch.device(device)
    return [d if d.index is not None else torch.device("cuda", torch.cuda.current_device())]


def run(device: str = "auto", ops: Optional[Sequence[str]] = None) -> int:
    """``fastrank check --device <device> --ops <ops>``: the lines, the summary and the exit
    status (0: every case passed, 1: one or more failed)."""
    start = time.monotonic()
    ops = list(ops or NATIVE_OPS)
    rows = [NATIVE_OPS[name] for name in ops]
    backends = _native.backends()
    references, tally = References(), Tally()
    if device in ("auto", "cpu"):
        if not backends["cpu"]:
            tally.result(Result("(every op)", "cpu", "-", "the CPU module", False,
                                detail=backends.get("_C_cpu_error", "not built")))
        else:
            check_device(rows, torch.device("cpu"), f"cpu/{_native.cpu_level()}", references, tally)
            if not os.environ.get(_native.CPU_ISA_VARIABLE, "").strip():   # a forced level: that one alone
                for level in backends["cpu_isa_levels"].split(","):
                    if level != _native.cpu_level():
                        check_cpu_level(level, ops, tally)
    for dev in _cuda_devices(device):
        if not backends["cuda_available"]:
            why = backends.get("_C_cuda_error") or ("fastrank was built without its CUDA module (no nvcc at build "
                                                    "time)" if not backends["cuda_built"] else
                                                    "fastrank's CUDA module sees no device, torch does")
            tally.result(Result("(every op)", str(dev), "-", "the CUDA module", False, detail=why))
            continue
        for version in cuda_kernel_versions():
            with _native.kernel_variant(version=version):
                check_device(rows, dev, f"{dev}/v{version}", references, tally)
    seconds = time.monotonic() - start
    failed = sorted(set(tally.failed))
    verdict = (f"{len(tally.failed)} FAILED ({', '.join(failed)})" if failed else "all ok")
    print(f"{SUMMARY} {tally.cases} cases on {', '.join(tally.where)}: {verdict} ({seconds:.0f} s)", flush=True)
    return 1 if tally.failed else 0
