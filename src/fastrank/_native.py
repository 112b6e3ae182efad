"""Loading the native modules and choosing an implementation.

fastrank ships two extension modules built by CMake (see CMakeLists.txt):

- ``fastrank._C_cpu``: C++17 + OpenMP kernels, always built;
- ``fastrank._C_cuda``: CUDA kernels, built when nvcc is found.

Neither links libtorch: kernels take raw pointers, sizes, strides and a stream, and
Python allocates every output with torch. A missing or broken module is reported with
one warning and the pure-PyTorch reference is used instead; ``import fastrank`` never
fails because of it.
"""
from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Dict

import torch

from ._version import __version__

_modules: Dict[str, object] = {}
_errors: Dict[str, str] = {}
_warned = set()
_emulated_cuda = None  # see emulate_cuda


def _load(name: str):
    if name in _modules:
        return _modules[name]
    if name in _errors:
        return None
    try:
        mod = importlib.import_module(f"fastrank.{name}")
    except Exception as e:  # ImportError, OSError from a broken .so, ...
        _errors[name] = f"{type(e).__name__}: {e}"
        return None
    _modules[name] = mod
    return mod


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
    ``{"cpu": True, "cuda_built": True, "cuda_available": False, "version": "0.2.0"}``."""
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


def native_module(device: torch.device, impl: str, op: str):
    """The native module to run ``op`` on ``device``, or None for the reference.

    impl="native" raises if no kernel can run there; impl="auto" falls back to the
    reference with one warning per missing module.
    """
    if impl == "reference":
        return None
    if device.type == "cpu" and _emulated_cuda is not None:
        return _emulated_cuda
    if device.type == "cpu":
        mod, name = cpu_module(), "_C_cpu"
    elif device.type == "cuda":
        mod, name = cuda_module(), "_C_cuda"
    else:
        mod, name = None, None
    if mod is None:
        why = _errors.get(name, "not built") if name else f"no native kernels for device type {device.type!r}"
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
    if t.device.type != "cuda":
        return 0
    return torch.cuda.current_stream(t.device).cuda_stream


# dtype codes understood by the kernels (csrc/include/fastrank/common.h: enum class DType)
DTYPE_CODE = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, everything else accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
