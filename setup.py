"""Builds fastrank's two native modules by driving CMake (CMakeLists.txt is the one
description of the native build).

Environment:
  FASTRANK_CUDA=0|1        force the CUDA module off / on (on without nvcc is an error);
                           unset: built when nvcc is found.
  FASTRANK_CUDA_ARCHS      CUDA architectures, default "80;86;89;90" (+ PTX of the last).
  FASTRANK_CPU_NATIVE=0|1  default 0: the CPU kernels compiled for every instruction-set level
                           of the architecture (x86-64: baseline, avx2, avx512), one picked at
                           import from the CPU's features (a portable binary); 1: for this
                           machine's CPU alone (-march=native, level "native").
  FASTRANK_BUILD_TYPE      CMake build type, default Release.
  FASTRANK_GLIBC           link against the symbols of this glibc (e.g. 2.28, what `make wheel`
                           sets), so the modules load on it and later ones; unset: this system's.
                           Needs zig (the `ziglang` package of this Python, or FASTRANK_ZIG, its
                           path) to make that glibc's link stubs (cmake/glibc_link_stubs.cmake).
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def find_nvcc():
    cands = [shutil.which("nvcc")]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(os.path.join(os.environ[env], "bin", "nvcc"))
    cands.append("/usr/local/cuda/bin/nvcc")
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def cuda_setting():
    flag = os.environ.get("FASTRANK_CUDA", "").strip()
    nvcc = find_nvcc()
    if flag == "0":
        return None
    if flag == "1" and nvcc is None:
        raise RuntimeError("FASTRANK_CUDA=1 but nvcc was not found (PATH, CUDA_HOME, /usr/local/cuda)")
    if flag not in ("", "0", "1"):
        raise RuntimeError(f"FASTRANK_CUDA must be 0 or 1, got {flag!r}")
    return nvcc


def cpu_native_setting() -> bool:
    flag = os.environ.get("FASTRANK_CPU_NATIVE", "").strip()
    if flag not in ("", "0", "1"):
        raise RuntimeError(f"FASTRANK_CPU_NATIVE must be 0 or 1, got {flag!r}")
    return flag == "1"


def glibc_setting():
    """(glibc version, zig) when FASTRANK_GLIBC asks for a link against an older glibc, else None."""
    version = os.environ.get("FASTRANK_GLIBC", "").strip()
    if not version:
        return None
    if not re.fullmatch(r"2\.\d+", version):
        raise RuntimeError(f"FASTRANK_GLIBC must be a glibc version such as 2.28, got {version!r}")
    zig = os.environ.get("FASTRANK_ZIG", "").strip()
    if not zig:
        try:
            import ziglang
            zig = str(Path(ziglang.__file__).with_name("zig"))
        except ImportError:
            zig = shutil.which("zig") or ""
    if not (zig and os.path.isfile(zig) and os.access(zig, os.X_OK)):
        raise RuntimeError(f"FASTRANK_GLIBC={version} needs zig for that glibc's link stubs: pip install ziglang, "
                           f"or FASTRANK_ZIG=<path of zig> (found {zig!r})")
    return version, zig


MODULES = ("_C_cpu", "_C_cuda")


def cmake_build_dir(native: bool, build_type: str, glibc=None) -> Path:
    """One CMake build directory per interpreter and configuration, kept between builds.

    It lives in the checkout (`build/`), not in setuptools' build_temp: an editable install
    gets a new temporary build_temp each time, which would recompile everything. Portable
    and native builds (and those linked against an older glibc) get separate directories,
    so switching between them recompiles nothing that was built before.
    """
    name = f"cmake-{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
    if native:
        name += "-native"
    if glibc:
        name += f"-glibc{glibc}"
    if build_type != "Release":
        name += "-" + build_type.lower()
    return ROOT / "build" / name


def read_cmake_cache(path: Path) -> dict:
    values = {}
    for line in path.read_text(errors="replace").splitlines():
        if not line or line.startswith(("#", "//")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        values[key.split(":", 1)[0]] = value
    return values


def stale_cache_reason(build_dir: Path, generator: str):
    """Why an existing CMake cache cannot be configured again, or None.

    Leftovers that merely point at a vanished tool are fixed by configuring with the
    current tool (CMAKE_MAKE_PROGRAM and the compilers are passed explicitly); these
    cannot: CMake refuses another source directory or generator, and a compiler that
    is gone would be looked up again by CMake only in a new cache.
    """
    cache = build_dir / "CMakeCache.txt"
    if not cache.is_file():
        return None
    values = read_cmake_cache(cache)
    home = values.get("CMAKE_HOME_DIRECTORY", "")
    if not home or Path(home).resolve() != ROOT:
        return f"it belongs to another source directory ({home or 'unknown'})"
    if values.get("CMAKE_GENERATOR") != generator:
        return f"it was made by the generator {values.get('CMAKE_GENERATOR')!r}, now {generator!r}"
    for key in ("CMAKE_CXX_COMPILER", "CMAKE_CUDA_COMPILER"):
        tool = values.get(key)
        if tool and os.path.isabs(tool) and not os.path.exists(tool):
            return f"its {key} {tool} no longer exists"
    return None


def python_package_tool(package: str, attr: str, exe: str):
    """The executable of the cmake / ninja Python package of this environment (the build
    requirements), which `python setup.py ...` in a virtualenv that is not activated does
    not have on PATH."""
    try:
        mod = __import__(package)
        path = os.path.join(getattr(mod, attr), exe)
    except (ImportError, AttributeError, TypeError):
        return None
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def build_tools():
    """(cmake, generator, make program): Ninja when it is installed, else Unix Makefiles.

    Under pip's build isolation cmake and ninja are the ones of the temporary build
    environment, a new directory each time; the cache of an earlier build still names
    the old ones, so the make program is always passed explicitly.
    """
    cmake = python_package_tool("cmake", "CMAKE_BIN_DIR", "cmake") or shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("cmake was not found: pip install cmake (pip install . does it for you)")
    ninja = python_package_tool("ninja", "BIN_DIR", "ninja") or shutil.which("ninja")
    if ninja:
        return cmake, "Ninja", ninja
    make = shutil.which("make") or shutil.which("gmake")
    if make is None:
        raise RuntimeError("neither ninja nor make was found: pip install ninja")
    return cmake, "Unix Makefiles", make


class CMakeBuild(build_ext):
    """Configures and builds CMakeLists.txt, then copies the modules it built.

    Safe to repeat in the same checkout in any order (pip install ., with or without
    build isolation, pip install -e ., python setup.py build_ext --inplace, pip wheel .):
    the CMake build directory is kept, so only what changed is recompiled, and a cache
    that cannot be reused is removed first (see stale_cache_reason); should configuring
    an old cache still fail, the build directory is removed and configured once more.
    """

    def build_extension(self, ext):
        import pybind11

        native = cpu_native_setting()
        build_type = os.environ.get("FASTRANK_BUILD_TYPE", "Release")
        glibc = glibc_setting()
        build_dir = cmake_build_dir(native, build_type, glibc[0] if glibc else None)
        module_dir = build_dir / "modules"
        nvcc = cuda_setting()
        cmake, generator, make_program = build_tools()
        args = [
            f"-G{generator}",
            f"-DCMAKE_MAKE_PROGRAM={make_program}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={module_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DFASTRANK_CPU_NATIVE={'ON' if native else 'OFF'}",
            f"-DFASTRANK_CUDA={'ON' if nvcc else 'OFF'}",
            f"-DFASTRANK_GLIBC={glibc[0] if glibc else ''}",
            f"-DFASTRANK_ZIG={glibc[1] if glibc else ''}",
        ]
        if nvcc:
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
            args.append(f"-DFASTRANK_CUDA_ARCHS={os.environ.get('FASTRANK_CUDA_ARCHS', '80;86;89;90')}")

        reason = stale_cache_reason(build_dir, generator)
        if reason:
            print(f"fastrank: starting a new CMake build in {build_dir}: {reason}", flush=True)
            shutil.rmtree(build_dir)
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [cmake, str(ROOT), *args]
        if subprocess.run(configure, cwd=build_dir).returncode != 0:
            # never fail for leftovers of an earlier build: start afresh once
            print(f"fastrank: configuring the existing CMake build in {build_dir} failed; "
                  "removing it and configuring from scratch", flush=True)
            shutil.rmtree(build_dir)
            build_dir.mkdir(parents=True)
            subprocess.run(configure, cwd=build_dir, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.run([cmake, "--build", ".", "--parallel", jobs], cwd=build_dir, check=True)

        # Copy exactly the modules of this configuration next to the declared one: a
        # module built earlier with other settings (a CUDA module before FASTRANK_CUDA=0)
        # must not end up in the wheel.
        self._fastrank_built = ["_C_cpu"] + (["_C_cuda"] if nvcc else [])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        extdir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        extdir.mkdir(parents=True, exist_ok=True)
        for name in MODULES:
            target = extdir / (name + suffix)
            if target.exists():
                target.unlink()
        for name in self._fastrank_built:
            shutil.copy2(module_dir / (name + suffix), extdir / (name + suffix))

    def copy_extensions_to_source(self):
        # `build_ext --inplace` and `pip install -e .`: the modules built now go next to
        # the sources, and one of the other configuration is removed (a stale CUDA module
        # would otherwise still be imported after a FASTRANK_CUDA=0 rebuild).
        # Copy then rename: overwriting a loaded .so in place crashes processes using it.
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        src = Path(self.build_lib) / "fastrank"
        dst = ROOT / "src" / "fastrank"
        built = getattr(self, "_fastrank_built", ())
        for name in MODULES:
            if name in built:
                tmp = dst / (name + suffix + ".tmp")
                shutil.copy2(src / (name + suffix), tmp)
                os.replace(tmp, dst / (name + suffix))
            elif (dst / (name + suffix)).exists():
                (dst / (name + suffix)).unlink()


setup(
    # one CMake project builds both fastrank._C_cpu and (when CUDA is on) fastrank._C_cuda
    ext_modules=[Extension("fastrank._C_cpu", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
