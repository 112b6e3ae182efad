"""What the native modules need of the machine they load on (CMakeLists.txt, "How the modules
are linked"; docs/developing.md, "Source distribution and wheels"), read with objdump from the
imported modules:

- no libstdc++ (the C++ runtime is linked in): no GLIBCXX_ or CXXABI_ version, no
  libstdc++.so.6; no run path (a folder of the machine that built it);
- every symbol a module needs from another library is versioned (but the Python C API's and
  weak ones): a glibc function bound without a version would load on an older glibc that lacks
  it and fail only when called (a data symbol: at load);
- no glibc version newer than the one the module was linked for: the wheel's manylinux tag
  (`make wheel`: manylinux_2_28) or the FASTRANK_GLIBC of the CMake build that made it;
- the module exports its init function alone.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.wheel, pytest.mark.skipif(not shutil.which("objdump"), reason="no objdump (binutils)")]


def built_modules() -> list:
    """The native modules of the imported fastrank, by file (those this build has)."""
    mods = []
    for name in ("_C_cpu", "_C_cuda"):
        spec = importlib.util.find_spec(f"fastrank.{name}")
        if spec is not None and spec.origin:
            mods.append(Path(spec.origin))
    return mods


MODULES = built_modules()
if not MODULES:
    pytestmark = [*pytestmark, pytest.mark.skip(reason="no native module built")]


def objdump(*args) -> str:
    return subprocess.run(["objdump", *map(str, args)], capture_output=True, text=True, check=True).stdout


def needed(mod: Path) -> dict:
    """{library: [versions needed of it]} from the module's version references, plus NEEDED
    libraries of which it needs no version (as []), e.g. {"libm.so.6": ["GLIBC_2.2.5", ...]}."""
    out = objdump("-p", mod)
    libs = {m: [] for m in re.findall(r"^\s*NEEDED\s+(\S+)", out, re.M)}
    lib = None
    for line in out.split("Version References:", 1)[-1].splitlines():
        if m := re.match(r"\s*required from (\S+):", line):
            lib = m.group(1)
            libs.setdefault(lib, [])
        elif lib and (m := re.match(r"\s*0x[0-9a-f]+ 0x[0-9a-f]+ \d+ (\S+)", line)):
            libs[lib].append(m.group(1))
    return libs


def undefined(mod: Path) -> list:
    """(name, version or None, weak) of each dynamic symbol the module needs from elsewhere."""
    syms = []
    for line in objdump("-T", mod).splitlines():
        f = line.split()
        if "*UND*" not in f:
            continue
        at = f.index("*UND*")
        version = f[-2][1:-1] if f[-2].startswith("(") else None
        syms.append((f[-1], version, "w" in f[1:at]))
    return syms


def linked_glibc(mod: Path):
    """(major, minor) of the glibc the module was linked for, or None when that is this
    machine's: the manylinux tag of the wheel it was installed from, else FASTRANK_GLIBC of the
    CMake build in this checkout that made it (byte for byte)."""
    try:
        dist = importlib.metadata.distribution("fastrank")
        files = {Path(dist.locate_file(f)).resolve() for f in dist.files or ()}
        if mod.resolve() in files:
            tags = re.findall(r"manylinux_(\d+)_(\d+)_", dist.read_text("WHEEL") or "")
            if tags:
                return max((int(a), int(b)) for a, b in tags)
    except importlib.metadata.PackageNotFoundError:
        pass
    for d in (REPO / "build").glob(f"cmake-{sysconfig.get_platform()}-{sys.implementation.cache_tag}*"):
        built = d / "modules" / mod.name
        if built.is_file() and built.read_bytes() == mod.read_bytes():
            m = re.search(r"^FASTRANK_GLIBC:\w+=(2\.\d+)$", (d / "CMakeCache.txt").read_text(), re.M)
            return tuple(map(int, m.group(1).split("."))) if m else None
    return None


def version_key(v: str) -> tuple:
    return tuple(int(x) for x in v.split("_", 1)[1].split("."))


@pytest.mark.parametrize("mod", MODULES, ids=[m.name.split(".")[0] for m in MODULES])
def test_module_needs_no_cxx_runtime(mod):
    libs = needed(mod)
    assert not [lib for lib in libs if lib.startswith("libstdc++")], libs
    newer = [v for vs in libs.values() for v in vs if v.startswith(("GLIBCXX_", "CXXABI_"))]
    assert not newer, newer


@pytest.mark.parametrize("mod", MODULES, ids=[m.name.split(".")[0] for m in MODULES])
def test_module_has_no_run_path(mod):
    # a run path would name a folder of the machine that built it (a build directory)
    assert not re.findall(r"^\s*(?:RPATH|RUNPATH)\s+(\S+)", objdump("-p", mod), re.M)


@pytest.mark.parametrize("mod", MODULES, ids=[m.name.split(".")[0] for m in MODULES])
def test_module_needs_every_symbol_at_a_version(mod):
    # the Python C API comes from the interpreter, unversioned; a weak reference may stay unbound
    loose = [name for name, version, weak in undefined(mod)
             if version is None and not weak and not re.match(r"_?Py", name)]
    assert not loose, f"{mod.name} needs these without a version: {loose}"


@pytest.mark.parametrize("mod", MODULES, ids=[m.name.split(".")[0] for m in MODULES])
def test_module_needs_no_newer_glibc_than_it_was_linked_for(mod):
    glibc = linked_glibc(mod)
    if glibc is None:
        pytest.skip("linked against this machine's glibc (no manylinux tag, no FASTRANK_GLIBC)")
    versions = {v for vs in needed(mod).values() for v in vs if v.startswith("GLIBC_")}
    assert versions, "no glibc version read"
    newer = sorted(v for v in versions if version_key(v) > glibc)
    assert not newer, f"{mod.name} is for glibc {glibc[0]}.{glibc[1]} but needs {newer}"


@pytest.mark.parametrize("mod", MODULES, ids=[m.name.split(".")[0] for m in MODULES])
def test_module_exports_its_init_function_alone(mod):
    out = subprocess.run(["nm", "-D", "--defined-only", str(mod)], capture_output=True, text=True,
                         check=True).stdout
    assert [line.split()[-1] for line in out.splitlines() if line.strip()] == [f"PyInit_{mod.name.split('.')[0]}"]
