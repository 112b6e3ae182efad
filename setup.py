"""Builds fastrank's two native modules by driving CMake (CMakeLists.txt is the one
description of the native build).

Environment:
  FASTRANK_CUDA=0|1        force the CUDA module off / on (on without nvcc is an error);
                           unset: built when nvcc is found.
  FASTRANK_CUDA_ARCHS      CUDA architectures, default "80;86;89;90" (+ PTX of the last).
  FASTRANK_CPU_NATIVE=0|1  compile the CPU kernels for this machine's CPU (-march=native),
                           default 1; set 0 for a portable binary.
  FASTRANK_BUILD_TYPE      CMake build type, default Release.
"""
import os
import shutil
import subprocess
import sys
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


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import pybind11

        extdir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_temp = Path(self.build_temp).resolve() / "cmake"
        build_temp.mkdir(parents=True, exist_ok=True)
        nvcc = cuda_setting()
        cmake = shutil.which("cmake") or "cmake"
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={extdir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('FASTRANK_BUILD_TYPE', 'Release')}",
            f"-DFASTRANK_CPU_NATIVE={'OFF' if os.environ.get('FASTRANK_CPU_NATIVE') == '0' else 'ON'}",
            f"-DFASTRANK_CUDA={'ON' if nvcc else 'OFF'}",
        ]
        if nvcc:
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
            args.append(f"-DFASTRANK_CUDA_ARCHS={os.environ.get('FASTRANK_CUDA_ARCHS', '80;86;89;90')}")
        if shutil.which("ninja"):
            args.append("-GNinja")
        subprocess.run([cmake, str(ROOT), *args], cwd=build_temp, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.run([cmake, "--build", ".", "--parallel", jobs], cwd=build_temp, check=True)

    def copy_extensions_to_source(self):
        # `build_ext --inplace`: CMake wrote both modules next to the declared one.
        # Copy then rename: overwriting a loaded .so in place crashes processes using it.
        for so in (Path(self.build_lib) / "fastrank").glob("_C_*"):
            tmp = ROOT / "fastrank" / (so.name + ".tmp")
            shutil.copy2(so, tmp)
            os.replace(tmp, ROOT / "fastrank" / so.name)


setup(
    # one CMake project builds both fastrank._C_cpu and (when CUDA is on) fastrank._C_cuda
    ext_modules=[Extension("fastrank._C_cpu", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
