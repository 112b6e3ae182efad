"""The native build, as a user and a contributor run it, in a temporary copy of the checkout.

One checkout, one after another (each round followed by importing fastrank in a fresh
process and running a native op on CPU):

1. ``pip install .``                       (isolated build, from scratch; ``python -m fastrank info``
                                            from the checkout's root then reports the installed build)
2. touch a kernel, ``pip install .``        (only that kernel recompiles; a second install in one
                                            checkout used to fail: the CMake cache named the deleted
                                            ninja of the first build's isolated environment)
3. edit the bindings and a kernel, ``pip install -e .`` (editable: imports the checkout's
   src/fastrank/ and the edit, and reuses the build directory: only that kernel recompiles)
4. edit them again, ``python setup.py build_ext --inplace``: the edit is imported
5. ``pip install --no-build-isolation .``

and, separately, ``python -m build --sdist`` installed into a fresh virtualenv with
``FASTRANK_CPU_NATIVE=1`` (the ``native`` level alone: one level, the cheapest whole build).
The default wheel (every CPU level, the baseline one without AVX) is not built here: it is
what ``make wheel`` builds once and ``make test`` / ``make test-wheel`` install and test
(tests/test_cpu_dispatch.py reads its level objects).

Every build here is CPU-only (FASTRANK_CUDA=0): the CUDA module is compiled by CI's own
``pip install .[test]`` (every .cu file, four architectures, several minutes on two cores),
and the logic under test (CMake cache, build directory, module copying) is the same for
both modules, so compiling it again here would only make CI slower.

The virtualenvs made here have no pip or torch of their own: a .pth file points at a view of
this interpreter's site-packages without fastrank, and a constraint pins torch to this
interpreter's version, so nothing (least of all a CUDA torch) is downloaded for them.
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
import tarfile
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SKIP_COPY = {".git", ".venv", "build", "dist", "demo_results", "__pycache__", ".pytest_cache"}
TIMINGS: list[tuple[str, float]] = []

if shutil.which("c++") is None and shutil.which("g++") is None:
    pytest.skip("no C++ compiler", allow_module_level=True)


def copy_checkout(dst: Path) -> Path:
    """The tracked files (git ls-files) when this is a git checkout, else the tree without
    build outputs; never the built modules."""
    files = None
    if (REPO / ".git").exists() and shutil.which("git"):
        r = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True)
        if r.returncode == 0:
            files = [f for f in r.stdout.decode().split("\0") if f and (REPO / f).is_file()]
    if files is None:
        files = [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                 if p.is_file() and not SKIP_COPY & set(p.relative_to(REPO).parts)
                 and not any(part.endswith(".egg-info") for part in p.relative_to(REPO).parts)
                 and not p.name.endswith(".so")]
    for f in files:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dst / f)
    return dst


def make_venv(path: Path, tmp: Path) -> Path:
    """A virtualenv that sees this interpreter's packages except fastrank (pip included)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    view = tmp / "parent-site-packages"
    if not view.exists():
        view.mkdir()
        parent = Path(sysconfig.get_paths()["purelib"])
        for entry in parent.iterdir():
            name = entry.name.lower()
            if name.startswith(("fastrank", "__editable__", "_fastrank")) or name.endswith(".pth"):
                continue
            (view / entry.name).symlink_to(entry)
    site = Path(subprocess.run([str(path / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_parent_packages.pth").write_text(str(view) + "\n")
    return path / "bin" / "python"


def build_env(tmp: Path, **extra) -> dict:
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PIP_REQUIRE_VIRTUALENV", "FASTRANK_IMPL"):
        env.pop(k, None)
    constraints = tmp / "constraints.txt"
    constraints.write_text(f"torch=={torch.__version__.split('+')[0]}\n")
    env.update(PIP_CONSTRAINT=str(constraints), PIP_DISABLE_PIP_VERSION_CHECK="1",
               FASTRANK_CUDA="0", FASTRANK_REQUIRE_NATIVE="1")
    env.update(extra)
    return env


def run(label: str, cmd: list, cwd: Path, env: dict) -> str:
    t0 = time.perf_counter()
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    TIMINGS.append((label, time.perf_counter() - t0))
    if r.returncode != 0:
        pytest.fail(f"{label}: {' '.join(map(str, cmd))} exited with {r.returncode}\n{r.stdout[-6000:]}")
    return r.stdout


def backend_warnings(log: str) -> list:
    """Deprecation warnings of the build backend, CMake warnings and compiler warnings
    (pip's own "WARNING:" lines about the package index are not the build's)."""
    pat = re.compile(r"[Dd]eprecat|\bwarning:|CMake Warning|Warning:")
    return [line.strip() for line in log.splitlines() if pat.search(line)]


CHECK = r"""
import json, sys, torch, fastrank
from fastrank import _native
torch.manual_seed(0)
sim, rel = torch.randn(12, 12, dtype=torch.float64), torch.rand(12, 12, dtype=torch.float64)
native = fastrank.kendall_loss(sim, rel, impl="native")
ref = fastrank.kendall_loss(sim, rel, impl="reference")
torch.testing.assert_close(native, ref, rtol=1e-9, atol=1e-12)
cpu = _native.cpu_module()
print(json.dumps({"package": fastrank.__file__, "module": sys.modules["fastrank._C_cpu"].__file__,
                  "compiler": fastrank.backends()["cpu_compiler"], "isa": fastrank.backends()["cpu_isa"],
                  "probe": cpu._build_probe() if hasattr(cpu, "_build_probe") else None}))
"""


def check_import(python: Path, cwd: Path, env: dict, label: str) -> dict:
    out = run(f"{label}: import + native op", [python, "-c", CHECK], cwd, env)
    return json.loads(out.strip().splitlines()[-1])


def kernel_objects(src: Path) -> dict:
    """mtime of every CPU kernel object of the default (dispatching) CMake build, by
    "<level>/<kernel>.cpp.o": each kernel is compiled once per CPU level."""
    objs = {}
    for o in src.glob("build/cmake-*/CMakeFiles/fastrank_cpu_kernels_*.dir/**/*.o"):
        if not o.parts[len(src.parts) + 1].endswith("-native"):
            level = o.relative_to(src).parts[3][len("fastrank_cpu_kernels_"):-len(".dir")]
            objs[f"{level}/{o.name}"] = o.stat().st_mtime_ns
    return objs


def set_probe(src: Path, value: int):
    """Adds (or changes) a `_build_probe()` returning `value` in the temporary copy's
    bindings, so that the test sees which build it imports."""
    path = src / "csrc" / "bindings" / "cpu.cpp"
    text = path.read_text()
    probe = f'  m.def("_build_probe", [] {{ return {value}; }});  // test_build.py\n'
    text, n = re.subn(r'  m\.def\("_build_probe".*// test_build\.py\n', probe, text)
    if n == 0:
        text, n = re.subn(r"(void fastrank::register_kernels\(py::module_& m\) \{\n)",
                          lambda m: m.group(1) + probe, text)
    assert n == 1, "void fastrank::register_kernels(py::module_& m) { not found in csrc/bindings/cpu.cpp"
    path.write_text(text)


def test_repeated_installs_in_one_checkout(tmp_path):
    src = copy_checkout(tmp_path / "src")
    python = make_venv(tmp_path / "venv", tmp_path)
    env = build_env(tmp_path)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    pip = [python, "-m", "pip"]
    kernels = sorted((src / "csrc" / "cpu").glob("*.cpp"))
    assert len(kernels) >= 2

    def installed(info):
        assert Path(info["package"]).is_relative_to(site), info
        assert Path(info["module"]).is_relative_to(site), info

    # 1. the first install, from scratch; its log has no backend, CMake or compiler warning
    log = run("1. pip install .", [*pip, "install", "-v", "."], src, env)
    assert backend_warnings(log) == []
    installed(check_import(python, tmp_path, env, "1"))
    # from the checkout's own root, the installed build is imported, never the source tree
    info = run("1b. python -m fastrank info in the checkout", [python, "-m", "fastrank", "info"], src, env)
    assert re.search(r"^cpu\s+True$", info, re.M), info
    assert re.search(rf"^package\s+{re.escape(str(src))}", info, re.M) is None, info
    objs1 = kernel_objects(src)
    levels = {o.split("/")[0] for o in objs1}
    assert "baseline" in levels and (platform.machine() not in ("x86_64", "AMD64") or len(levels) == 3), objs1
    assert {o.split("/")[1].split(".")[0] for o in objs1} == {k.stem for k in kernels}, objs1

    # 2. a touched kernel, installed again: that one recompiles, and only that one
    touched = kernels[0]
    touched.touch()
    run(f"2. touch {touched.name}, pip install .", [*pip, "install", "."], src, env)
    installed(check_import(python, tmp_path, env, "2"))
    objs2 = kernel_objects(src)
    changed = {o for o in objs2 if objs2[o] != objs1[o]}
    assert changed == {f"{level}/{touched.name}.o" for level in levels}, changed

    # 3. editable, after an edit of the bindings and a kernel: the checkout's package, with its
    # modules next to the sources, holds the edit; the build directory is reused (only the
    # edited kernel recompiles)
    set_probe(src, 1)
    other = kernels[1]
    other.write_text(other.read_text() + "\n// edited by test_build.py\n")
    run("3. edit, pip install -e .", [*pip, "install", "-e", "."], src, env)
    info = check_import(python, tmp_path, env, "3")
    assert Path(info["package"]) == src / "src" / "fastrank" / "__init__.py", info
    assert Path(info["module"]).parent == src / "src" / "fastrank", info
    assert info["probe"] == 1, info
    objs3 = kernel_objects(src)
    assert {o for o in objs3 if objs3[o] != objs2[o]} == {f"{level}/{other.name}.o" for level in levels}

    # 4. the contributor's loop: edit, rebuild in place, and the edit is what is imported
    # (into this virtualenv itself, as a contributor has them: the view of the parent's
    # packages lacks their executables in bin/)
    run("4a. build requirements", [*pip, "install", "--ignore-installed", "setuptools>=77",
                                   "pybind11>=2.11", "cmake>=3.26", "ninja"], src, env)
    set_probe(src, 2)
    other.write_text(other.read_text() + "// edited again by test_build.py\n")
    run("4b. edit again, python setup.py build_ext --inplace",
        [python, "setup.py", "build_ext", "--inplace"], src, env)
    info = check_import(python, tmp_path, env, "4b")
    assert info["probe"] == 2 and Path(info["module"]).parent == src / "src" / "fastrank", info
    objs4 = kernel_objects(src)
    assert {o for o in objs4 if objs4[o] != objs3[o]} == {f"{level}/{other.name}.o" for level in levels}

    # 5. without build isolation (the build requirements of this environment)
    run("5. pip install --no-build-isolation .", [*pip, "install", "--no-build-isolation", "."], src, env)
    info = check_import(python, tmp_path, env, "5")
    installed(info)
    assert info["probe"] == 2 and info["isa"] in levels and info["compiler"].split(", ")[1].startswith(info["isa"])
    print_timings()


def test_sdist_builds_the_native_level_in_a_fresh_virtualenv(tmp_path):
    """The sdist holds what a build needs: installed into a fresh virtualenv with
    FASTRANK_CPU_NATIVE=1, it builds the one `native` level (-march=native) and runs. (The
    default wheel, every level picked at import, is the one `make wheel` builds, which
    `make test` and `make test-wheel` install and test.)"""
    src = copy_checkout(tmp_path / "src")
    env = build_env(tmp_path)
    tools = make_venv(tmp_path / "tools", tmp_path)
    run("sdist: install build", [tools, "-m", "pip", "install", "build"], tmp_path, env)
    run("sdist: python -m build --sdist", [tools, "-m", "build", "--sdist", "--outdir", tmp_path / "dist", "."],
        src, env)
    (sdist,) = (tmp_path / "dist").glob("fastrank-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    needed = {"setup.py", "pyproject.toml", "CMakeLists.txt", "README.md", "LICENSE"}
    needed |= {str(p.relative_to(src)) for p in (src / "csrc").rglob("*") if p.is_file()}
    assert needed <= names, sorted(needed - names)
    assert not [n for n in names if n.endswith(".so")]

    python = make_venv(tmp_path / "fresh", tmp_path)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    run("FASTRANK_CPU_NATIVE=1 pip install fastrank-*.tar.gz into a fresh virtualenv",
        [python, "-m", "pip", "install", "--no-cache-dir", sdist], tmp_path, dict(env, FASTRANK_CPU_NATIVE="1"))
    info = check_import(python, tmp_path, env, "sdist, native level")
    assert Path(info["module"]).is_relative_to(site), info
    assert info["isa"] == "native" and info["compiler"].endswith("native: -march=native"), info
    print_timings()


def print_timings():
    for label, sec in TIMINGS:
        print(f"  {sec:6.1f} s  {label}")
    TIMINGS.clear()
