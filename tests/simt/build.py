"""Builds the SIMT-emulated CUDA module: ``csrc/cuda/*.cu`` and the unchanged
``csrc/bindings/cuda.cpp``, compiled by the host compiler against the emulator in this folder
(``simt.h``, ``simt.cpp``, see README.md here), into a module with exactly ``fastrank._C_cuda``'s
Python API that runs the kernels on host memory.

Each ``.cu`` file is compiled through a generated two-line wrapper: ``#include`` of the file
itself (the source nvcc compiles, never a copy), then the registration of its kernels'
``__launch_bounds__`` with the emulator (the expressions are evaluated by the compiler, in
the kernel's own namespace). AddressSanitizer and UBSan are on by default: a process that
loads the module needs the ASan runtime preloaded (``asan_runtime()``, ``LD_PRELOAD``).

Objects and modules are cached under ``build/simt/`` (or ``$FASTRANK_SIMT_CACHE``) by a hash
of everything that goes into them, so after editing one ``.cu`` file only that file is
recompiled. ``python tests/simt/build.py`` builds and prints the module's path.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
# -g1: line tables only, what a sanitizer's report names (file:line of each frame); the full -g
# (every local's description) made the emulated build a third longer and no report uses it
COMMON = ["-std=c++17", "-O1", "-g1", "-fPIC", "-fvisibility=hidden", "-fno-omit-frame-pointer", "-Wall"]


class Unavailable(RuntimeError):
    """What the emulated build needs is missing here (a reason to skip, not a failure)."""


def cxx() -> str:
    return os.environ.get("CXX", "g++")


def cuda_include() -> Path:
    """The CUDA toolkit's include folder: the emulator uses its real cuda_fp16.h,
    cuda_bf16.h, driver_types.h and vector_types.h."""
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent / "include")
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            candidates.append(Path(os.environ[env]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / "cuda_fp16.h").is_file() and (c / "driver_types.h").is_file():
            return c
    raise Unavailable("no CUDA toolkit headers (cuda_fp16.h) found: nvcc on PATH, CUDA_HOME or /usr/local/cuda")


def asan_runtime() -> str:
    """Path of the compiler's AddressSanitizer runtime, for LD_PRELOAD."""
    out = subprocess.run([cxx(), "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not out or not os.path.isabs(out) or not os.path.exists(out):
        raise Unavailable(f"{cxx()} has no AddressSanitizer runtime (libasan.so)")
    return out


def cxx_runtime() -> str:
    """Path of the compiler's C++ runtime (libstdc++), preloaded with ASan's: ASan finds the
    real __cxa_throw only in a library loaded before it starts, and Python itself links no
    C++ runtime (without it, the first C++ exception in the process aborts)."""
    out = subprocess.run([cxx(), "-print-file-name=libstdc++.so.6"], capture_output=True, text=True).stdout.strip()
    if not out or not os.path.isabs(out) or not os.path.exists(out):
        raise Unavailable(f"{cxx()} has no libstdc++.so.6")
    return out


def sanitizer_env(env: Optional[dict] = None) -> dict:
    """An environment for a process that loads the sanitized module."""
    env = dict(os.environ if env is None else env)
    env["LD_PRELOAD"] = f"{asan_runtime()} {cxx_runtime()}"
    # Python and torch never free some allocations at exit: leak reports would be noise
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:abort_on_error=0:detect_odr_violation=0:" \
                          "alloc_dealloc_mismatch=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    return env


# ---- the __launch_bounds__ of each kernel --------------------------------------------------------
def _strip(source: str) -> str:
    """Comments, string literals and preprocessor lines blanked out (newlines kept)."""
    out = re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), source, flags=re.S)
    out = re.sub(r'"(?:\\.|[^"\\\n])*"', lambda m: '"' + " " * (len(m.group()) - 2) + '"', out)
    lines = out.split("\n")
    in_directive = False
    for i, line in enumerate(lines):
        if in_directive or line.lstrip().startswith("#"):
            in_directive = line.rstrip().endswith("\\")
            lines[i] = ""
    return "\n".join(lines)


def launch_bounds(source: str) -> List[Tuple[Tuple[str, ...], str, str, int]]:
    """(namespaces, kernel name, bound expression, line) of every ``__launch_bounds__`` at
    namespace scope; "" stands for an anonymous namespace."""
    text = _strip(source)
    token = re.compile(r"\bnamespace\s+(\w*)\s*\{|\{|\}|\b__launch_bounds__\s*\(")
    stack: List[Optional[str]] = []  # namespace names, None for any other brace
    found = []
    pos = 0
    while True:
        m = token.search(text, pos)
        if m is None:
            break
        tok = m.group(0)
        if tok.startswith("namespace"):
            stack.append(m.group(1))
            pos = m.end()
        elif tok == "{":
            stack.append(None)
            pos = m.end()
        elif tok == "}":
            if stack:
                stack.pop()
            pos = m.end()
        else:
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            expr = " ".join(text[m.end():i - 1].split())
            name = re.match(r"\s*(\w+)\s*\(", text[i:])
            if name is None:
                raise ValueError(f"__launch_bounds__ at line {text.count(chr(10), 0, m.start()) + 1} "
                                 "is not followed by a kernel name")
            if all(s is not None for s in stack):
                line = text.count("\n", 0, m.start()) + 1
                found.append((tuple(stack), name.group(1), expr.split(",")[0].strip(), line))
            pos = i
    return found


def wrapper(cu: Path, include_root: Path) -> str:
    """The translation unit compiled for one .cu file."""
    source = cu.read_text()
    kernels = [(cu.name, k) for k in launch_bounds(source)]
    for header in re.findall(r'#include\s+"([\w/.]+)"', source):  # fastrank/x.h, or a .cuh next to it
        path = include_root / header if header.startswith("fastrank/") else cu.parent / header
        if path.is_file():
            kernels += [(header, k) for k in launch_bounds(path.read_text())]
    lines = [f"// generated by tests/simt/build.py from {cu.name}: the file itself, then the",
             "// __launch_bounds__ of its kernels, registered with the SIMT emulator",
             f'#include "{cu}"']
    for k, (file, (spaces, name, expr, line)) in enumerate(kernels):
        opening = " ".join(f"namespace {s} {{" for s in spaces)
        closing = " ".join("}" for _ in spaces)
        lines.append(f"{opening} [[maybe_unused]] const bool simt_bounds_{k} = ::simt::register_bounds("
                     f'"{name}", static_cast<int>({expr}), "{file}", {line}); {closing}')
    return "\n".join(lines) + "\n"


# ---- compiling, cached --------------------------------------------------------------------------
def _digest(parts: Iterable) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _tree_digest(paths: Iterable[Path]) -> str:
    return _digest(x for p in sorted(paths) for x in (p.name, p.read_bytes()))


def _compiler_id() -> str:
    return subprocess.run([cxx(), "--version"], capture_output=True, text=True).stdout.split("\n")[0]


def cache_root() -> Path:
    return Path(os.environ.get("FASTRANK_SIMT_CACHE", REPO / "build" / "simt"))


def _compile(cmd: List[str], src_text: Optional[str], src_path: Optional[Path], out: Path) -> None:
    if out.exists():
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = src_path
        if src_text is not None:
            src = Path(tmp) / (out.stem + ".cpp")
            src.write_text(src_text)
        obj = Path(tmp) / "out.o"
        res = subprocess.run(cmd + ["-c", str(src), "-o", str(obj)], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"emulated build failed: {' '.join(cmd)} {src}\n{res.stdout}{res.stderr}")
        os.replace(obj, out)


def _toolchain(include_root: Path, sanitize: bool):
    """(kernel compile command, runtime compile command, link flags, cache-key parts)."""
    cuda_inc = cuda_include()
    flags = COMMON + (SANITIZE if sanitize else [])
    base = [cxx()] + flags
    headers = (list(include_root.rglob("*.h")) + list(include_root.parent.glob("cuda/*.cuh"))
               + list(include_root.parent.glob("bindings/*.h")) + list(HERE.glob("*.h")))
    kernel_cmd = base + ["-DFASTRANK_SIMT", "-include", str(HERE / "cuda_runtime.h"), "-I", str(HERE),
                         "-I", str(include_root), "-I", str(cuda_inc), "-x", "c++"]
    runtime_cmd = base + ["-I", str(HERE), "-I", str(cuda_inc)]
    return kernel_cmd, runtime_cmd, flags, [_compiler_id(), _tree_digest(headers)]


def _build(cu_files: List[Path], include_root: Path, extra: List[tuple], out_name: str, sanitize: bool,
           jobs: Optional[int], verbose: bool) -> Path:
    """Compiles (cached) every .cu file through its wrapper, the emulator's runtime and the
    extra (cmd, source path, key parts, stem) objects, and links them into out_name."""
    kernel_cmd, runtime_cmd, flags, key = _toolchain(include_root, sanitize)
    objects = cache_root() / "objects"
    jobs_list = []  # (cmd, text, path, out)
    # objects are keyed by content, not by where the checkout lies (a copy of csrc/ with one
    # file changed recompiles that file only)
    where = lambda parts: [str(p).replace(str(include_root), "<include>") for p in parts]
    for cu in cu_files:
        text = wrapper(cu, include_root)
        parts = key + where(kernel_cmd) + [text.replace(str(cu), cu.name), cu.read_bytes()]
        jobs_list.append((kernel_cmd, text, None, objects / f"{cu.stem}-{_digest(parts)}.o"))
    runtime = HERE / "simt.cpp"
    jobs_list.append((runtime_cmd, None, runtime,
                      objects / f"simt-{_digest(key + [runtime_cmd, runtime.read_bytes()])}.o"))
    for cmd, src, parts, stem in extra:
        cmd = [cxx()] + flags + cmd
        jobs_list.append((cmd, None, src, objects / f"{stem}-{_digest(key + where(cmd) + [src.read_bytes()] + parts)}.o"))
    todo = [j for j in jobs_list if not j[3].exists()]
    if verbose and todo:
        print(f"simt: compiling {len(todo)} of {len(jobs_list)} objects", file=sys.stderr, flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
        for f in [pool.submit(_compile, *j) for j in todo]:
            f.result()
    out = cache_root() / "modules" / _digest(key + [flags] + [j[3].name for j in jobs_list]) / out_name
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
        cmd = [cxx(), "-shared"] + flags + [str(j[3]) for j in jobs_list] + ["-ldl", "-o", str(tmp)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"emulated link failed: {' '.join(cmd)}\n{res.stdout}{res.stderr}")
        os.replace(tmp, out)
    return out


def build(csrc: Path = REPO / "csrc", sanitize: bool = True, jobs: Optional[int] = None,
          verbose: bool = False) -> Path:
    """Builds (or finds in the cache) the emulated CUDA module for the sources in ``csrc`` and
    returns its path (a file named like ``_C_cuda.cpython-311-x86_64-linux-gnu.so``)."""
    csrc = Path(csrc).resolve()
    try:
        import pybind11
    except ImportError as e:  # pragma: no cover - pybind11 is in the test extra
        raise Unavailable("pybind11 is not installed (pip install pybind11)") from e
    include_root = csrc / "include"
    binding = csrc / "bindings" / "cuda.cpp"
    binding_cmd = ["-I", str(include_root), "-I", pybind11.get_include(), "-I", sysconfig.get_paths()["include"],
                   '-DFASTRANK_CUDA_ARCHS="emulated"']
    return _build(sorted((csrc / "cuda").glob("*.cu")), include_root,
                  [(binding_cmd, binding, [pybind11.__version__], "bindings")],
                  "_C_cuda" + sysconfig.get_config_var("EXT_SUFFIX"), sanitize, jobs, verbose)


def build_selftest(sanitize: bool = True, verbose: bool = False) -> Path:
    """The emulator's own test library: selftest_kernels.cu (deliberately broken kernels and
    correct controls, each run by name through a C function), for tests/test_emulated.py."""
    return _build([HERE / "selftest_kernels.cu"], REPO / "csrc" / "include", [], "libsimt_selftest.so",
                  sanitize, None, verbose)


def load(path: Path):
    """Imports an emulated module file as a Python module (named _C_cuda, like the real one,
    but not registered as fastrank._C_cuda)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_C_cuda", str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


if __name__ == "__main__":
    print(build(verbose=True))
