"""Loading the native modules and choosing an implementation.

fastrank ships two extension modules built by CMake (see CMakeLists.txt):

- ``fastrank._C_cpu``: C++17 + OpenMP kernels, always built, once per instruction-set
  level (x86-64: ``baseline``, ``avx2`` = x86-64-v3, ``avx512`` = x86-64-v4; elsewhere
  ``baseline``; a ``FASTRANK_CPU_NATIVE=1`` build: ``native`` alone). The best level this
  CPU runs is picked once, here at import; ``FASTRANK_CPU_ISA=<level>`` forces one;
- ``fastrank._C_cuda``: CUDA kernels, built when nvcc is found.

Neither links libtorch: kernels take raw pointers, sizes, strides and a stream, and
Python allocates every output with torch. A missing or broken module is reported with
one warning and the pure-PyTorch reference is used instead; ``import fastrank`` never
fails because of it.
"""
from __future__ import annotations

import contextlib

import importlib
import os
import warnings
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import torch

from ._version import __version__

_modules: Dict[str, object] = {}
_errors: Dict[str, str] = {}
_warned = set()
_emulated_cuda = None  # see emulate_cuda


CPU_ISA_VARIABLE = "FASTRANK_CPU_ISA"
_cpu_levels: Dict[str, object] = {}  # "level": the level in use; "runnable": the levels this CPU runs


def _load(name: str):
    if name in _modules:
        return _modules[name]
    if name in _errors:
        return None
    try:
        mod = importlib.import_module(f"fastrank.{name}")
        if name == "_C_cpu":
            mod = _cpu_kernels(mod)
    except CpuIsaError:
        raise
    except Exception as e:  # ImportError, OSError from a broken .so, ...
        _errors[name] = f"{type(e).__name__}: {e}"
        return None
    _modules[name] = mod
    return mod


class CpuIsaError(RuntimeError):
    """FASTRANK_CPU_ISA names a level that this build lacks or this CPU cannot run."""


def pick_cpu_level(compiled: List[str], runnable: List[str], forced: Optional[str]) -> str:
    """The CPU level to use: ``forced`` (the value of FASTRANK_CPU_ISA) when set, else the
    highest level this CPU runs (``compiled`` and ``runnable`` are lowest first)."""
    forced = (forced or "").strip()
    if not forced:
        return runnable[-1]
    if forced not in runnable:
        why = "is not compiled into this build" if forced not in compiled else "cannot run on this CPU"
        raise CpuIsaError(f"fastrank: {CPU_ISA_VARIABLE}={forced!r} {why} (compiled: {', '.join(compiled)}; "
                          f"this CPU runs: {', '.join(runnable)}); unset {CPU_ISA_VARIABLE} to pick the best")
    return forced


def _cpu_kernels(dispatch):
    """The submodule of the CPU level to use (see pick_cpu_level), from the dispatching
    module fastrank._C_cpu."""
    compiled = [str(x) for x in dispatch.levels()]
    runnable = [x for x in compiled if dispatch.supported(x)]
    level = pick_cpu_level(compiled, runnable, os.environ.get(CPU_ISA_VARIABLE))
    _cpu_levels.update(level=level, runnable=runnable)
    return dispatch.load(level)


def cpu_level() -> Optional[str]:
    """The instruction-set level of the CPU kernels in use (e.g. ``"avx512"``), or None
    when the CPU module is not available."""
    return _cpu_levels.get("level") if cpu_module() is not None else None


def cpu_module():
    return _load("_C_cpu")


def cuda_module():
    return _load("_C_cuda")


# Load both modules now, at `import fastrank`: torch.compile cannot trace a first import
# (importlib is skipped by dynamo, a graph break that fullgraph=True turns into an error),
# while looking up an already-loaded module traces fine. A failure is only recorded here.
cpu_module()
cuda_module()


def emulate_cuda(module) -> object:
    """Runs the CUDA kernels of ``module`` on CPU tensors (None: back to normal); returns the
    previous setting.

    ``module`` is an emulated build of the CUDA module (tests/simt: the same kernel sources,
    compiled for the CPU against a SIMT emulator, with ``_C_cuda``'s exact API). While it is
    set, every native op on a CPU tensor goes the CUDA way: the op layer allocates the
    buffers the CUDA path allocates and calls this module's kernels. For the emulated-CUDA
    tests; no user code needs it."""
    global _emulated_cuda
    if module is not None:
        for name, fields in _declared_fields.items():
            check_fields(module, name, fields)
    previous, _emulated_cuda = _emulated_cuda, module
    return previous


def emulated_cuda():
    """The module set by :func:`emulate_cuda`, or None."""
    return _emulated_cuda


def cuda_device_count() -> int:
    """Devices the CUDA module itself can see (0 when it was not built)."""
    mod = cuda_module()
    return int(mod.device_count()) if mod is not None else 0


def backends() -> dict:
    """What was built and what can run, e.g.
    ``{"cpu": True, "cuda_built": True, "cuda_available": False, "version": "0.2.0"}``, and with the
    CPU module ``cpu_isa`` (the instruction-set level in use, e.g. ``"avx512"``) and
    ``cpu_isa_levels`` (the compiled levels this CPU runs, e.g. ``"baseline,avx2,avx512"``)."""
    cpu = cpu_module()
    cuda = cuda_module()
    info = {
        "cpu": cpu is not None,
        "cuda_built": cuda is not None,
        "cuda_available": cuda is not None and cuda_device_count() > 0 and torch.cuda.is_available(),
        "version": __version__,
        "package": str(Path(__file__).resolve().parent),
    }
    if cpu is not None:
        info["cpu_openmp_threads"] = int(cpu.max_threads())
        info["cpu_compiler"] = cpu.compiler()
        info["cpu_isa"] = _cpu_levels["level"]
        info["cpu_isa_levels"] = ",".join(_cpu_levels["runnable"])
    if cuda is not None:
        info["cuda_runtime"] = cuda.runtime_version()
        info["cuda_archs"] = cuda.archs()
    for k, v in _errors.items():
        info[f"{k}_error"] = v
    return info


def _fix(name: str) -> str:
    """Where the imported fastrank is, and how to give it its native module."""
    where = Path(__file__).resolve().parent
    if not _errors.get(name, "").startswith("ModuleNotFoundError"):
        return f"The fastrank imported is {where}."
    return (f"The fastrank imported is {where}, which has no {name}: a source tree without a build. "
            f"Build it (`pip install .`, or `pip install -e .` for a checkout you edit) and import the "
            f"installed package: from a checkout's root, src/ is not on sys.path.")


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


_device_types: Dict[torch.device, str] = {}


def device_type(device: torch.device) -> str:
    """``device.type``, remembered per device: the attribute builds a new string on every
    read (0.25 us, several times a loss call), a dict lookup takes 0.05 us."""
    kind = _device_types.get(device)
    if kind is None:
        kind = _device_types[device] = device.type
    return kind


def native_module(device: torch.device, impl: str, op: str):
    """The native module to run ``op`` on ``device``, or None for the reference.

    impl="native" raises if no kernel can run there; impl="auto" falls back to the
    reference with one warning per missing module.
    """
    if impl == "reference":
        return None
    kind = device_type(device)
    if kind == "cpu" and _emulated_cuda is not None:
        return _emulated_cuda
    if kind == "cpu":
        mod, name = cpu_module(), "_C_cpu"
    elif kind == "cuda":
        mod, name = cuda_module(), "_C_cuda"
    else:
        mod, name = None, None
    if mod is None:
        why = _errors.get(name, "not built") if name else f"no native kernels for device type {kind!r}"
        if impl == "native":
            raise RuntimeError(f"fastrank: impl='native' asked for {op} on {device}, but {why}")
        if name:
            _warn_once(name, f"fastrank: native module {name} unavailable ({why}); "
                             f"using the pure-PyTorch reference. {_fix(name)}")
        return None
    return mod


@torch.compiler.assume_constant_result
def has_native(device: torch.device, impl: str, op: str) -> bool:
    """``native_module(device, impl, op) is not None``, safe to call under torch.compile:
    dynamo runs it once at trace time and bakes in the answer, instead of tracing the
    lazy ``importlib.import_module`` (which it refuses, failing fullgraph=True when the
    first call of a fresh process is compiled)."""
    return native_module(device, impl, op) is not None


def stream_of(t: torch.Tensor) -> int:
    """The raw cudaStream_t of the current stream on t's device (0 on CPU)."""
    if not t.is_cuda:
        return 0
    return torch.cuda.current_stream(t.device).cuda_stream


# The codes the kernels take, as the native modules export them (csrc/bindings/constants.h,
# from csrc/include/fastrank: DType, Direction, Reduction, kMaxKs); both modules export the
# same values (tests/test_native_constants.py). Without a native module no kernel runs: the
# tables are empty and MAX_KS is None (no limit on the reference path).
_constants = cpu_module() or cuda_module()
DTYPE_CODE = {getattr(torch, name): code for name, code in _constants.DTYPE_CODE.items()} if _constants else {}
DIRECTION_CODE = dict(_constants.DIRECTION_CODE) if _constants else {}
REDUCTION_CODE = dict(_constants.REDUCTION_CODE) if _constants else {}
MAX_KS = int(_constants.MAX_KS) if _constants else None
PATH_CODE = dict(_constants.PATH_CODE) if _constants else {}


# The buffer sizes the ops allocate for their kernels, as Python formulas: a register_fake
# must stay symbolic under torch.compile, so the sizes are not asked of a module (which also
# keeps a C++ call off every call's path). Each is the C++ function of the same name, which
# both modules export; tests/test_native_constants.py compares the two over a grid of shapes.
def query_count(n: int, m: int, direction: int) -> int:
    """The per-query losses of a direction code: n if i2t, + m if t2i (params.h)."""
    return (n if direction & 1 else 0) + (m if direction & 2 else 0)


def smooth_rank_ws_numel(n: int, m: int, direction: int) -> int:
    """Elements of the smooth-rank engine's workspace, the ``ws`` of smooth_ndcg, smooth_ap and
    recall_at_k (params.h, SmoothRankLayout)."""
    d1, d2 = direction & 1, (direction >> 1) & 1
    return (d1 + d2) * n * m + 2 * (d1 * n + d2 * m) + 2


def kendall_aux_numel(n: int, m: int, direction: int) -> int:
    """Elements of kendall's and kendall_sw's aux (kendall.h)."""
    return 2 * query_count(n, m, direction) + 2

# The variants of the kernels a call runs (fastrank.kernel_variant): fields of each call's
# parameter struct, set by the op from what is selected when it is called.
CUDA_KERNELS_VARIABLE = "FASTRANK_CUDA_KERNELS"
VERSIONS = (1, 2)
PAIR_PASSES = ("auto", "dense", "sparse")


class KernelVariant(NamedTuple):
    """The kernel variant a call runs: ``version``, the CUDA kernels' version where two are
    built (smooth-NDCG, Smooth-AP, Recall@k: 1 or 2, the newest); ``pair_pass``, how the graded
    losses' lists are walked (docs/spec.md §2.1b): "auto" (the cheaper pass, per list), "dense"
    (every pair) or "sparse" (the nonzero-gain items against every item). The values are the
    same either way (to rounding)."""
    version: int
    pair_pass: str


def _default_variant() -> KernelVariant:
    """The variant outside any ``kernel_variant`` block: version 2, or 1 where the environment
    says FASTRANK_CUDA_KERNELS=v1 (read once, here at import); the pair pass "auto"."""
    return KernelVariant(1 if os.environ.get(CUDA_KERNELS_VARIABLE, "").strip() == "v1" else 2, "auto")


_variant = _default_variant()
_variant_codes = (_variant.version, PATH_CODE.get(_variant.pair_pass, 0))


def variant_codes() -> tuple:
    """(version, pair-pass code) of the selected variant: the fields an op puts in its call's
    parameter struct (read once per call; under torch.compile, once at trace time)."""
    return _variant_codes


@contextlib.contextmanager
def kernel_variant(version: Optional[int] = None, pair_pass: Optional[str] = None):
    """Selects the kernel variant of the calls made inside the block (as
    ``torch.nn.attention.sdpa_kernel`` selects an attention backend); what is not given stays
    as it was. ``version``: 1 or 2, the CUDA kernels' version (2 by default;
    ``FASTRANK_CUDA_KERNELS=v1`` in the environment makes 1 the default, read at import);
    ``pair_pass``: "auto" (default), "dense" or "sparse" (:class:`KernelVariant`). For the tests
    that compare variants and the benchmarks that time them; a forward and its backward run
    the variant of the forward's call. Under torch.compile, the variant is read when the
    function is traced (a change recompiles)::

        with fastrank.kernel_variant(pair_pass="dense"):
            loss = fastrank.smooth_ndcg_loss(sim, relevance)
    """
    global _variant, _variant_codes
    if version is not None and version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
    if pair_pass is not None and pair_pass not in PAIR_PASSES:
        raise ValueError(f"pair_pass must be one of {PAIR_PASSES}, got {pair_pass!r}")
    before = _variant
    _variant = KernelVariant(before.version if version is None else version,
                             before.pair_pass if pair_pass is None else pair_pass)
    _variant_codes = (_variant.version, PATH_CODE.get(_variant.pair_pass, 0))
    try:
        yield _variant
    finally:
        _variant = before
        _variant_codes = (before.version, PATH_CODE.get(before.pair_pass, 0))


# The field names of each kernel's parameter struct as the Python side fills them
# (ops/_launch.py, kernel), checked against every module that runs them.
_declared_fields: Dict[str, tuple] = {}


def check_fields(module, name: str, fields: tuple) -> None:
    """Raises TypeError unless ``module``'s entry point ``name`` takes the fields ``fields``, by
    name and in order (the module exports its structs' field names: csrc/bindings/fill.h)."""
    declared = tuple(getattr(module, "FIELDS", {}).get(name, ()))
    if declared[-1:] == ("stream",):  # CUDA's last field, added by ops/_launch.py's call
        declared = declared[:-1]
    if declared != tuple(fields):
        raise TypeError(f"fields: {name} is filled with ({', '.join(fields)}) but its parameter struct "
                        f"declares ({', '.join(declared) or 'no such entry point'})")


def declare_fields(name: str, fields: tuple) -> None:
    """Records the fields the Python side fills for kernel ``name`` and checks them against each
    native module loaded (an emulated CUDA module: when it is set, :func:`emulate_cuda`)."""
    for module in (cpu_module(), cuda_module(), _emulated_cuda):
        if module is not None:
            check_fields(module, name, fields)
    _declared_fields[name] = tuple(fields)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, everything else accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
