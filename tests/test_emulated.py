"""The CUDA kernels checked on the CPU by the SIMT emulator (tests/simt, README there).

- ``test_cuda_matrix``: builds csrc/cuda/*.cu against the emulator (cached by a hash of the
  sources in build/simt) and runs the CUDA test matrix (the tests marked ``cuda_matrix`` of the
  op test files the table names, tests/_cuda_matrix.py) in child processes with the
  AddressSanitizer runtime preloaded;
- the emulator's own checks, each shown firing on a deliberately broken kernel
  (tests/simt/selftest_kernels.cu), and its lane semantics on correct ones;
- ``test_seeded_mutations_are_caught``: four small bugs planted in a copy of the kernels,
  each of which the emulated matrix must fail.

Where the emulated build cannot be made (no pybind11, no CUDA headers, no AddressSanitizer),
these tests are skipped with the reason, except in CI (CI=true) or with
FASTRANK_REQUIRE_NATIVE=1, where they fail with it.

``pytest -m emulated`` runs this file alone; after editing a .cu file it rebuilds only that file.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import fastrank
from fastrank.ops.registry import NATIVE_OPS

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "simt"))
import build as simt  # noqa: E402

pytestmark = pytest.mark.emulated

# the test files holding the CUDA matrix cases of the table's native ops (src/fastrank/ops/registry.py,
# ``cuda_matrix``), in two child processes that run side by side (dealt out in turn; the halves are not
# equal in cost, smooth-NDCG's and Kendall's files carry most of it, but the whole matrix takes about two
# minutes on two cores)
MATRIX_FILES = list(dict.fromkeys(row.matrix_file for row in NATIVE_OPS.values()))
MATRIX_GROUPS = [MATRIX_FILES[0::2], MATRIX_FILES[1::2]]


def emulated_build_required() -> bool:
    """In CI (CI=true) or with FASTRANK_REQUIRE_NATIVE=1, a missing emulated build is a
    failure: a skip there would pass the whole check without running it."""
    return (os.environ.get("FASTRANK_REQUIRE_NATIVE") == "1"
            or os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"))


def _built(fn):
    try:
        return fn()
    except simt.Unavailable as e:
        why = str(e)
    if emulated_build_required():
        pytest.fail(f"emulated build unavailable: {why} (required here: CI or FASTRANK_REQUIRE_NATIVE=1)",
                    pytrace=False)
    pytest.skip(f"emulated build unavailable here: {why}")


@pytest.fixture(scope="module")
def emulated_module() -> Path:
    return _built(simt.build)


@pytest.fixture(scope="module")
def selftest_library() -> Path:
    return _built(simt.build_selftest)


def _child_env(module: Path) -> dict:
    env = simt.sanitizer_env()
    env["FASTRANK_SIMT_MODULE"] = str(module)
    # the children import the fastrank this process imported (installed or source tree)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(fastrank.__file__).resolve().parent.parent)] +
                                        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _run_matrix(module: Path, files, extra=()) -> subprocess.CompletedProcess:
    # --capture=sys: a sanitizer's report, written to file descriptor 2 as the child dies, reaches us
    # in tests/, under the rootdir of the checkout: tests/conftest.py (the fixtures) applies
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys", "-m", "cuda_matrix",
           *extra, *files]
    return subprocess.run(cmd, cwd=HERE, env=_child_env(module), capture_output=True, text=True, timeout=900)


def _holds_matrix_tests(path: Path) -> bool:
    """Whether a test file marks tests ``cuda_matrix``."""
    return re.search(r"\bpytest\.mark\.cuda_matrix\b", path.read_text()) is not None


def test_every_file_the_table_names_holds_matrix_tests():
    """Each native row's matrix file exists and holds tests marked cuda_matrix: a row
    whose file lost its cases would have none of them run emulated, without a failure."""
    for name, row in NATIVE_OPS.items():
        path = HERE / row.matrix_file
        assert path.is_file() and _holds_matrix_tests(path), (name, path.name)


def test_every_file_of_matrix_tests_is_named_by_the_table():
    """A test file with tests marked cuda_matrix that no row of the table names would never run
    emulated (only the named files go to the children)."""
    holding = [p.name for p in HERE.glob("test_*.py") if p.name != Path(__file__).name and _holds_matrix_tests(p)]
    assert sorted(holding) == sorted(MATRIX_FILES)


def test_cuda_matrix(emulated_module):
    with ThreadPoolExecutor(len(MATRIX_GROUPS)) as pool:
        results = list(pool.map(lambda g: _run_matrix(emulated_module, g), MATRIX_GROUPS))
    for group, res in zip(MATRIX_GROUPS, results):
        assert res.returncode == 0, f"emulated CUDA matrix failed ({', '.join(group)}):\n" \
                                    f"{res.stdout[-12000:]}\n{res.stderr[-6000:]}"
        assert " passed" in res.stdout and " skipped" not in res.stdout.split("\n")[-2], res.stdout[-2000:]


@pytest.mark.parametrize("env,outcome", [({"CI": "true"}, "error"), ({"FASTRANK_REQUIRE_NATIVE": "1"}, "error"),
                                         ({}, "skipped")])
def test_an_unavailable_emulated_build_fails_where_it_is_required(tmp_path, env, outcome):
    """pybind11 hidden: the matrix cannot be built; CI and FASTRANK_REQUIRE_NATIVE=1 fail with
    the reason (in the fixture: an error), elsewhere it is a skip with the reason."""
    hidden = tmp_path / "hidden"
    (hidden / "pybind11").mkdir(parents=True)
    (hidden / "pybind11" / "__init__.py").write_text("raise ImportError('pybind11 hidden by the test')\n")
    child = {k: v for k, v in os.environ.items() if k not in ("CI", "FASTRANK_REQUIRE_NATIVE")}
    child["PYTHONPATH"] = os.pathsep.join([str(hidden), str(Path(fastrank.__file__).resolve().parent.parent)])
    child.update(env)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
           f"{Path(__file__).resolve()}::test_cuda_matrix"]
    res = subprocess.run(cmd, cwd=tmp_path, env=child, capture_output=True, text=True, timeout=300)
    summary = res.stdout.strip().splitlines()[-1]
    assert f"1 {outcome}" in summary, res.stdout[-3000:] + res.stderr[-2000:]
    assert res.returncode == (1 if outcome == "error" else 0), res.stdout[-3000:]
    assert "emulated build unavailable" in res.stdout and "pybind11 is not installed" in res.stdout, res.stdout[-3000:]


# ---- the emulator's own checks ------------------------------------------------------------------
RUN_CASE = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.simt_selftest_error.restype = ctypes.c_char_p
lib.simt_configure(int(sys.argv[3]), ctypes.c_ulonglong(int(sys.argv[4])), int(sys.argv[5]), 0)
lib.simt_approx(int(sys.argv[6]), ctypes.c_ulonglong(int(sys.argv[7])))
out = (ctypes.c_float * 512)(*([0.0] * 512))
code = lib.simt_selftest_run(sys.argv[2].encode(), out, 100)
msg = lib.simt_selftest_error(code).decode() if code > 0 else ""
print(json.dumps({"code": code, "message": msg, "out": [float(x) for x in out]}))
"""


def run_case(lib: Path, name: str, order: int = 0, seed: int = 0, poison: int = 0xFF, approx: int = 1,
             approx_seed: int = 0x9E3779B97F4A7C15):
    """(exit code, the case's JSON result or None, stderr) of one case in a child process;
    approx: the emulated special-function error (0 exact, 1 hashed within the bound, 2 +bound,
    3 -bound: tests/simt/simt.h)."""
    res = subprocess.run([sys.executable, "-c", RUN_CASE, str(lib), name, str(order), str(seed), str(poison),
                          str(approx), str(approx_seed)],
                         env=simt.sanitizer_env(), capture_output=True, text=True, timeout=120)
    result = json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else None
    return res.returncode, result, res.stderr


@pytest.mark.parametrize("name,code,words", [
    ("early_return_before_barrier", 719, ["divergent __syncthreads()", "thread (5,0,0) returned"]),
    ("different_barriers", 719, ["divergent __syncthreads()", "selftest_kernels.cu"]),
    ("block_over_launch_bounds", 701, ["256 threads a block", "__launch_bounds__(128)"]),
    ("block_over_1024", 9, ["more than 1024 threads"]),
    ("grid_y_over_65535", 9, ["(1, 65536, 1)", "at most 65535"]),
    ("grid_z_over_65535", 9, ["(1, 1, 65536)", "at most 65535"]),
    ("static_shared_over_48k", 9, ["53248 bytes of static shared memory"]),
    ("shuffle_after_return", 719, ["warp collective", "lane 3", "returned"]),
    ("shuffle_mask_without_own_lane", 719, ["does not include its own lane 16"]),
])
def test_emulator_refuses_what_a_gpu_refuses(selftest_library, name, code, words):
    rc, result, err = run_case(selftest_library, name)
    assert rc == 0, err
    assert result["code"] == code, result
    for w in words:
        assert w in result["message"], result["message"]


def test_largest_legal_grid_runs(selftest_library):
    rc, result, err = run_case(selftest_library, "grid_y_65535")
    assert rc == 0 and result["code"] == 0 and result["out"][0] == 1.0, (result, err)


@pytest.mark.parametrize("name", ["unwritten_shared", "missing_barrier"])
def test_schedules_expose_unwritten_reads_and_races(selftest_library, name):
    outs = []
    for order, poison in [(0, 0xFF), (1, 0x7F)]:
        rc, result, err = run_case(selftest_library, name, order=order, poison=poison)
        assert rc == 0 and result["code"] == 0, (result, err)
        outs.append(result["out"][:128])
    assert json.dumps(outs[0]) != json.dumps(outs[1])  # NaN-safe comparison


@pytest.mark.parametrize("name", ["neighbour_sum", "shuffles", "split_warp"])
def test_correct_kernels_agree_under_every_schedule(selftest_library, name):
    outs = []
    for order, seed, poison in [(0, 0, 0xFF), (1, 0, 0x7F), (2, 7, 0x00)]:
        rc, result, err = run_case(selftest_library, name, order, seed, poison)
        assert rc == 0 and result["code"] == 0, (result, err)
        outs.append(result["out"])
    assert outs[0] == outs[1] == outs[2]


@pytest.mark.parametrize("name,report", [
    ("global_overflow", "AddressSanitizer: heap-buffer-overflow"),
    ("shared_index_overflow", "runtime error: index 128 out of bounds for type 'float [128]'"),
    ("shared_pointer_overflow", "runtime error: store to address"),
])
def test_sanitizers_report_out_of_bounds(selftest_library, name, report):
    rc, result, err = run_case(selftest_library, name)
    assert rc != 0 and result is None and report in err, err[-3000:]


def test_shuffle_semantics(selftest_library):
    rc, result, err = run_case(selftest_library, "shuffles")
    assert rc == 0 and result["code"] == 0, (result, err)
    out = result["out"]
    for t in range(64):
        lane, seg = t % 32, (t % 32) // 8 * 8
        up = lane - 2 if lane - seg >= 2 else lane
        down = lane + 2 if lane - seg + 2 < 8 else lane
        xor9 = lane ^ 9 if (lane ^ 9) // 8 * 8 <= seg else lane  # a later segment: own value
        warp0 = t // 32 * 32
        ballot = sum(1 << k for k in range(32) if (warp0 + k) % 3 == 0)
        want = [warp0 + seg + 3, warp0 + up, warp0 + down, warp0 + xor9, warp0 + (lane ^ 1), float(ballot),
                float(sum(1 for k in range(64) if k % 5 == 0)), float(sum(range(warp0, warp0 + 32)))]
        assert out[8 * t:8 * t + 8] == pytest.approx(want), (t, out[8 * t:8 * t + 8], want)


def _ulps(got: float, exact: float) -> int:
    """Units in the last place (float32) between got and the exact value, rounded to float32."""
    import struct
    a, b = (struct.unpack("<i", struct.pack("<f", x))[0] for x in (got, exact))
    return abs(a - b)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_special_functions_within_their_documented_error(selftest_library, mode):
    """exp2_approx and rcp_approx (MUFU.EX2, MUFU.RCP) stay within 2 ulp of the exact value in
    every mode, hit the bound in the adversarial ones (2: +2 ulp, 3: -2 ulp), and move the
    result off the exact value for some inputs in the hashed one (the matrix's default)."""
    rc, result, err = run_case(selftest_library, "special_functions", approx=mode)
    assert rc == 0 and result["code"] == 0, (result, err)
    out = result["out"]
    errors = [_ulps(out[i], 2.0 ** (i - 64)) for i in range(128)]
    errors += [_ulps(out[128 + i], 1.0 / (i - 127.5)) for i in range(128)]
    assert max(errors) <= 2, errors
    if mode == 0:
        assert max(errors) == 0
    elif mode in (2, 3):
        assert min(errors) == 2
    else:
        assert 0 < sum(e > 0 for e in errors) < len(errors)


def test_a_kernel_relying_on_exact_special_functions_fails(selftest_library):
    """int(exp2_approx(k)) == 2^k holds with an exact exp and breaks at -2 ulp: the emulated
    error exposes code that depends on the hardware being exact."""
    outs = {}
    for mode in (0, 3):
        rc, result, err = run_case(selftest_library, "special_functions", approx=mode)
        assert rc == 0 and result["code"] == 0, (result, err)
        outs[mode] = result["out"][256:384]
    assert all(v == 1.0 for v in outs[0])
    assert sum(v == 0.0 for v in outs[3]) >= 100  # every k >= 1: 2^k - 2 ulp truncates below 2^k


# ---- seeded mutations -------------------------------------------------------------------------
MUTATIONS = {
    # Each mutation lies in one kernel's own .cu file, the cheapest to compile (a header's edit
    # changes every kernel's cache key and rebuilds them all; smooth_ndcg.cu alone is the longest).
    # a removed barrier: kendall's dense walk reads the staged chunk before every thread wrote it
    "removed barrier": ("cuda/kendall.cu",
                        "ra_k[t] = r[c0 + t] + alpha;  // NaN outside the list: in no active pair\n      }\n"
                        "      __syncthreads();\n",
                        "ra_k[t] = r[c0 + t] + alpha;  // NaN outside the list: in no active pair\n      }\n",
                        "test_kendall.py", "values_and_gradients"),
    # an off-by-one bound: one candidate past the staged chunk
    "off-by-one bound": ("cuda/kendall.cu", "for (int t = 0; t < cn; ++t) {", "for (int t = 0; t <= cn; ++t) {",
                         "test_kendall.py", "values_and_gradients"),
    # a wrong shuffle offset: fast_rerank's row sums of exp stop at half warps
    "wrong shuffle offset": ("cuda/fast_rerank.cu",
                             "s += exp_nonpos(l1 * tile[r][q] - mm);\n          s = warp_sum(s);",
                             "s += exp_nonpos(l1 * tile[r][q] - mm);\n"
                             "          for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);",
                             "test_fast_rerank.py", "values_and_gradients"),
    # a wrong stride: fast_rerank's forward reads sim's rows through its column stride
    "wrong stride": ("cuda/fast_rerank.cu",
                     "sim_sr = p.sim.s0, sim_sc = p.sim.s1;",
                     "sim_sr = p.sim.s1, sim_sc = p.sim.s0;",
                     "test_fast_rerank.py", "values_and_gradients"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_seeded_mutations_are_caught(tmp_path, mutation):
    path, old, new, test_file, selection = MUTATIONS[mutation]
    source = HERE.parent / "csrc"
    if not source.is_dir():
        pytest.skip("needs the checkout's csrc/ (tests run from an sdist or wheel without it)")
    text = (source / path).read_text()
    assert text.count(old) == 1, f"the mutation's target moved: update MUTATIONS[{mutation!r}]"
    copy = tmp_path / "csrc"
    shutil.copytree(source, copy)
    (copy / path).write_text(text.replace(old, new))
    module = _built(lambda: simt.build(csrc=copy))
    res = _run_matrix(module, [test_file], extra=["-x", "-k", selection])
    assert res.returncode != 0, f"the emulated matrix did not catch the {mutation}:\n{res.stdout[-3000:]}"
    assert "failed" in res.stdout or "ERROR: AddressSanitizer" in res.stderr or "runtime error:" in res.stderr, \
        res.stdout[-3000:] + res.stderr[-3000:]
