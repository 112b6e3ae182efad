"""Runtime CPU dispatch: the instruction-set levels of the CPU module (CMakeLists.txt,
csrc/bindings/cpu_dispatch.cpp, src/fastrank/_native.py).

- the level in use is the best this CPU runs, or the one FASTRANK_CPU_ISA forces; a level
  the build lacks or the CPU cannot run is a clear error naming the variable;
- every level this CPU runs gives every native op's values and gradients in float32 within
  the float32 tolerance of the float64 reference, and two processes at one level and thread
  count give bit-identical results (run-to-run determinism);
- the levels share no code: each level's object exports one symbol (its registration
  function), holds no COMDAT group and no static initialiser (the build checks the objects
  too: cmake/check_cpu_level.cmake), and the module exports its init function alone
  (tests/test_module_symbols.py).
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import fastrank
from fastrank import _native

pytestmark = pytest.mark.wheel
REPO = Path(__file__).resolve().parents[1]
B = fastrank.backends()
needs_cpu = pytest.mark.skipif(not B["cpu"], reason="native CPU module not built")
RUNNABLE = B.get("cpu_isa_levels", "").split(",") if B["cpu"] else []


def child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != _native.CPU_ISA_VARIABLE}
    env.update(extra)
    return env


# ---------------------------------------------------------------- picking a level
def test_pick_cpu_level():
    compiled = ["baseline", "avx2", "avx512"]
    assert _native.pick_cpu_level(compiled, compiled, None) == "avx512"
    assert _native.pick_cpu_level(compiled, compiled[:2], "") == "avx2"
    assert _native.pick_cpu_level(compiled, compiled[:2], " baseline ") == "baseline"
    with pytest.raises(_native.CpuIsaError, match="FASTRANK_CPU_ISA='avx512' cannot run on this CPU"):
        _native.pick_cpu_level(compiled, compiled[:2], "avx512")
    with pytest.raises(_native.CpuIsaError, match="FASTRANK_CPU_ISA='sse9' is not compiled into this build"):
        _native.pick_cpu_level(compiled, compiled, "sse9")
    with pytest.raises(_native.CpuIsaError, match="FASTRANK_CPU_ISA='native' is not compiled"):
        _native.pick_cpu_level(compiled, compiled, "native")


@needs_cpu
def test_backends_name_the_level_in_use():
    cpu = sys.modules["fastrank._C_cpu"]
    compiled = list(cpu.levels())
    assert RUNNABLE == [x for x in compiled if cpu.supported(x)] and RUNNABLE[0] in ("baseline", "native")
    forced = os.environ.get(_native.CPU_ISA_VARIABLE)
    assert B["cpu_isa"] == (forced.strip() if forced else RUNNABLE[-1]) == _native.cpu_level()
    assert B["cpu_compiler"].split(", ", 1)[1].startswith(B["cpu_isa"] + ":"), B
    if platform.machine() in ("x86_64", "AMD64") and "native" not in compiled:
        assert compiled == ["baseline", "avx2", "avx512"], compiled
    with pytest.raises(ValueError, match="not compiled"):
        cpu.load("sse9")
    out = subprocess.run([sys.executable, "-m", "fastrank", "info"], capture_output=True, text=True,
                         check=True, env=child_env()).stdout
    assert re.search(rf"^cpu_isa\s+{RUNNABLE[-1]}$", out, re.M), out


@needs_cpu
@pytest.mark.parametrize("value", ["sse9", "AVX2"])
def test_unknown_level_is_a_clear_error(value):
    r = subprocess.run([sys.executable, "-c", "import fastrank"], capture_output=True, text=True,
                       env=child_env(FASTRANK_CPU_ISA=value))
    assert r.returncode != 0
    assert f"FASTRANK_CPU_ISA={value!r} is not compiled into this build" in r.stderr, r.stderr[-2000:]


# ---------------------------------------------------------------- accuracy and determinism per level
CHILD = r"""
import hashlib, json, sys, torch, fastrank
from fastrank.ops.registry import NATIVE_OPS
torch.set_num_threads(2)
out = {"level": fastrank.backends()["cpu_isa"], "ops": {}}
def run(op, ex, dtype, impl):
    inputs = {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.dtype.is_floating_point else v)
              for k, v in ex.inputs.items()}
    for n in ex.grad:
        inputs[n] = inputs[n].detach().clone().requires_grad_(True)
    res = op.functional(**inputs, **{**ex.hyper, "impl": impl})
    outs = [res] if isinstance(res, torch.Tensor) else [t for t in res if t is not None]
    diff = [o for o in outs if o.requires_grad]
    grads = []
    if ex.grad and diff:
        total = sum((o * torch.linspace(0.5, 1.5, o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in diff)
        grads = list(torch.autograd.grad(total, [inputs[n] for n in ex.grad]))
    return [t.detach() for t in outs + grads]
for name, op in NATIVE_OPS.items():
    for ex in op.examples(torch.float32, seed=3, size=(61, 77)):
        got = run(op, ex, torch.float32, "native")
        want = run(op, ex, torch.float64, "reference")
        err = max(float(((g.double() - w) / (2e-5 + 2e-4 * w.abs())).abs().max()) if g.is_floating_point()
                  else float((g.double() != w.double()).sum()) for g, w in zip(got, want))
        h = hashlib.sha256(b"".join(g.contiguous().numpy().tobytes() for g in got)).hexdigest()
        out["ops"][f"{name}/{ex.name}"] = {"err": err, "hash": h}
print(json.dumps(out))
"""


def run_level(level: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                       env=child_env(FASTRANK_CPU_ISA=level, OMP_NUM_THREADS="2"), timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_cpu
@pytest.mark.parametrize("level", RUNNABLE or ["none"])
def test_every_level_is_accurate_and_deterministic(level):
    first, second = run_level(level), run_level(level)
    assert first["level"] == level
    assert first["ops"], "no native op ran"
    for key, rec in first["ops"].items():
        # |float32 native - float64 reference| <= 2e-5 + 2e-4 |reference|, values and gradients
        assert rec["err"] <= 1.0, f"{level}: {key} off the float64 reference ({rec['err']:.3g} x tolerance)"
        assert rec["hash"] == second["ops"][key]["hash"], f"{level}: {key} differs between two runs"


# ---------------------------------------------------------------- the levels share no code
def level_objects() -> list:
    """The per-level objects of the CMake build of this checkout that made the imported module
    (byte for byte: in place, or installed by `pip install .`), or [] when it was built elsewhere."""
    mod = Path(sys.modules["fastrank._C_cpu"].__file__).resolve()
    objs = []
    for d in (REPO / "build").glob(f"cmake-{sysconfig.get_platform()}-{sys.implementation.cache_tag}*"):
        built = d / "modules" / mod.name
        if built.is_file() and built.read_bytes() == mod.read_bytes():
            objs = sorted(d.glob("fastrank_cpu_*.o"))
    return objs


def nm(*args) -> list:
    out = subprocess.run(["nm", *map(str, args)], capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines() if line.strip()]


@needs_cpu
@pytest.mark.skipif(not (shutil.which("nm") and shutil.which("objdump")), reason="no nm / objdump (binutils)")
def test_level_objects_share_no_symbol():
    objs = level_objects()
    if not objs:
        pytest.skip("the imported CPU module was not built by this checkout: no per-level objects to read")
    levels = [o.stem[len("fastrank_cpu_"):] for o in objs]
    assert sorted(levels) == sorted(sys.modules["fastrank._C_cpu"].levels())
    exported = {}
    for level, obj in zip(levels, objs):
        glob = nm("-g", "--defined-only", obj)
        # one global symbol: <level namespace>::register_kernels(pybind11::module_&), a text symbol
        assert len(glob) == 1 and glob[0][1] == "T", glob
        assert glob[0][2] == f"_ZN{len('fastrank_' + level)}fastrank_{level}16register_kernelsERN8pybind117module_E"
        exported[level] = glob[0][2]
        # no weak symbol at all: a weak definition is one a linker may replace by another level's
        assert not [f for f in nm("--defined-only", obj) if f[-2] in "WwVvu"], obj
        sections = subprocess.run(["objdump", "-h", str(obj)], capture_output=True, text=True, check=True).stdout
        assert not re.search(r"\s(\.group|\.init_array|\.ctors|\.preinit_array)\s", sections), obj
        if level == "baseline" and platform.machine() in ("x86_64", "AMD64"):
            dis = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True, check=True).stdout
            assert not re.search(r"%[yz]mm", dis), "the baseline level uses AVX registers"
    assert len(set(exported.values())) == len(exported)
