"""Every CUDA kernel's registers, spills, shared memory and occupancy on sm_80 and sm_90
(benchmarks/cuda/resources.py): no local-memory spill in a float32 / float16 / bfloat16
kernel, every kernel found, every pair loop within its budget of SASS instructions and MUFU
operations a pair (benchmarks/cuda/sass.py), and docs/cuda-resources.md generated from the current
sources (the resources, the pair loops and the issue-time model's predictions).

The build check (marked slow: make test-slow, CI) runs wherever nvcc is found (CI builds the
CUDA module whenever it is), and fails rather than skips when the CUDA module was built but
nvcc cannot be found. The occupancy calculator and the parsers are checked everywhere, on
hand-worked cases.
"""
import os
import shutil
import re
import sys
from pathlib import Path

import pytest

import fastrank  # first: the package under test (installed by `make test`) stays the one in use

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the benchmarks package of the checkout (it is not installed)
    sys.path.append(str(ROOT))
from benchmarks.cuda import resources as cr  # noqa: E402


# ---- the occupancy calculator, by hand --------------------------------------------------

@pytest.mark.parametrize("regs, smem, threads, arch, blocks, fraction, limiter", [
    # 128 regs: 4096 a warp, 16384 / 4096 = 4 warps per sub-partition, 16 a SM: 2 blocks of 8 warps
    (128, 0, 256, 90, 2, 0.25, "registers"),
    # 80 regs: 2560 a warp, 6 warps per sub-partition (15360 of 16384), 24 a SM: 3 blocks
    (80, 4128, 256, 80, 3, 0.375, "registers"),
    # 58 regs -> 1856 -> 2048 a warp (unit 256): 8 per sub-partition, 32 a SM: one 1024-thread block
    (58, 8192, 1024, 90, 1, 0.5, "registers"),
    # 32 regs: 64 warps fit; 2048 threads / 256 = 8 blocks
    (32, 0, 256, 80, 8, 1.0, "threads"),
    # 48 KiB + 1 KiB reserved a block: 164 KiB / 49 KiB = 3 blocks (sm_80), 228 / 49 = 4 (sm_90)
    (32, 48 * 1024, 128, 80, 3, 12 / 64, "shared memory"),
    (32, 48 * 1024, 128, 90, 4, 16 / 64, "shared memory"),
    # 32 threads a block, few registers: the 32-block limit
    (16, 0, 32, 90, 32, 0.5, "blocks"),
])
def test_occupancy_hand_worked(regs, smem, threads, arch, blocks, fraction, limiter):
    o = cr.occupancy(regs, smem, threads, arch)
    assert (o.blocks, o.limiter) == (blocks, limiter)
    assert o.warps == blocks * -(-threads // 32)
    assert o.fraction == pytest.approx(fraction)


@pytest.mark.parametrize("kwargs", [dict(threads=0), dict(threads=1025), dict(regs=256), dict(smem=-1)])
def test_occupancy_rejects_impossible_kernels(kwargs):
    args = {**dict(regs=32, smem=0, threads=256, arch=90), **kwargs}
    with pytest.raises(ValueError):
        cr.occupancy(**args)


# ---- the parsers, on canned tool output ----------------------------------------------------

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperv
    24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z1kIfEvPT_' for 'sm_90'
ptxas info    : Function properties for _Z1kIfEvPT_
    72 bytes stack frame, 72 bytes spill stores, 324 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 72 bytes cumulative stack size, 4128 bytes smem, 1024 bytes cmem[0]
ptxas info    : Compile time = 1.0 ms
ptxas info    : Compiling entry function '_Z1gv' for 'sm_80'
ptxas info    : Function properties for _Z1gv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 380 bytes cmem[0]
"""


def test_parse_ptxas():
    k, g = cr.parse_ptxas(PTXAS)
    assert (k.mangled, k.arch, k.regs, k.stack, k.spill_stores, k.spill_loads, k.smem) == \
        ("_Z1kIfEvPT_", 90, 80, 72, 72, 324, 4128)
    assert (g.mangled, g.arch, g.regs, g.stack, g.spill_stores, g.smem) == ("_Z1gv", 80, 12, 0, 0, 0)


def test_parse_ptx_block_sizes():
    ptx = """
.visible .entry _Z1av(
\t.param .u64 _Z1av_param_0
)
.maxntid 256, 1, 1
.minnctapersm 4
{
}
.entry _Z1bv(
)
{
}
.entry _Z1cv(
)
.maxntid 16, 16, 1
{
}
"""
    assert cr.parse_ptx_block_sizes(ptx) == {"_Z1av": 256, "_Z1cv": 256}


def test_short_names_and_template_arguments():
    d = ("void fastrank::cuda::rank::subset_forward_kernel<float, fastrank::cuda::(anonymous namespace)::ApHead>"
         "(float const*, long, long, fastrank::AccOf<float>::type, fastrank::cuda::(anonymous namespace)::ApHead)")
    assert cr.short_name(d) == "subset_forward_kernel<float, ApHead>"
    assert cr.template_args(cr.short_name(d)) == ["float", "ApHead"]
    assert cr.short_name("void fastrank::cuda::(anonymous namespace)::k<__nv_bfloat16, float>(int)") == \
        "k<__nv_bfloat16, float>"
    assert cr.template_args("k") == []


# ---- the build ------------------------------------------------------------------------

def _cuda_module_built() -> bool:
    return bool(fastrank.backends().get("cuda_built"))


# the checks below compile every kernel with nvcc for sm_80 and sm_90 (a minute or more on two
# cores): a build, slow by nature, so make test-slow (CI) runs them, not make test
compiles = pytest.mark.slow


@pytest.fixture(scope="module")
def kernels():
    if cr.find_nvcc() is None:
        if _cuda_module_built():
            pytest.fail("the CUDA module was built but nvcc is not found: its kernels' resources cannot be checked")
        pytest.skip("no nvcc here (and no CUDA module built): nothing to compile")
    if shutil.which("g++") is None:   # nvcc preprocesses with the host compiler
        pytest.skip("nvcc but no host C++ compiler (g++) on PATH, as where an installed wheel is tested: "
                    "the checkout's own test run checks the kernels' resources")
    if cr.find_nvdisasm() is None:
        msg = "nvcc but no nvdisasm (pip install nvidia-cuda-nvdisasm, a test extra): the pair loops cannot be counted"
        if _cuda_module_built() or os.environ.get("CI") or os.environ.get("FASTRANK_REQUIRE_NATIVE") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return cr.collect(jobs=os.cpu_count() or 2)


@compiles
def test_every_kernel_is_compiled_for_sm80_and_sm90(kernels):
    expected = set(cr.source_kernels())
    assert len(expected) >= 15, f"too few __global__ functions found in csrc: {sorted(expected)}"
    for arch in cr.ARCHS:
        found = {k.base for k in kernels if k.arch == arch}
        assert found == expected, f"sm_{arch}: missing {sorted(expected - found)}, unexpected {sorted(found - expected)}"
    # every instantiation on both archs
    names = {(k.source, k.name) for k in kernels}
    for source, name in names:
        assert {k.arch for k in kernels if (k.source, k.name) == (source, name)} == set(cr.ARCHS), name
    # the four element types of the templated kernels are told apart
    types = {k.element_type for k in kernels}
    assert {"float", "double", "__half", "__nv_bfloat16"} <= types


@compiles
def test_no_spills_in_float32_float16_bfloat16_kernels(kernels):
    spilling = [f"{k.name} ({k.source}, sm_{k.arch}): {k.spill_stores} B stores / {k.spill_loads} B loads"
                for k in kernels if k.element_type != "double" and (k.spill_stores or k.spill_loads)]
    assert not spilling, "local-memory spills:\n" + "\n".join(spilling)


@compiles
def test_no_spills_in_double_kernels_either(kernels):
    spilling = [f"{k.name} ({k.source}, sm_{k.arch}): {k.spill_stores} / {k.spill_loads} B"
                for k in kernels if k.spill_stores or k.spill_loads]
    assert not spilling, "local-memory spills:\n" + "\n".join(spilling)


@compiles
def test_every_kernel_declares_its_block_size(kernels):
    missing = sorted({k.name for k in kernels if k.threads == 0})
    assert not missing, f"kernels without __launch_bounds__ (their occupancy is unknown): {missing}"
    for k in kernels:
        o = k.occupancy()
        assert o.blocks >= 1, f"{k.name} sm_{k.arch} cannot be resident: {k}"


def _call_args(text: str, start: int):
    """(top-level comma-separated arguments, index after the ")") of the call whose "(" is at
    text[start - 1]."""
    args, depth, cur = [], 0, ""
    for i in range(start, len(text)):
        ch = text[i]
        if ch == ")" and depth == 0:
            args.append(" ".join(cur.split()))
            return args, i + 1
        depth += (ch in "(<[") - (ch in ")>]")
        if ch == "," and depth == 0:
            args.append(" ".join(cur.split()))
            cur = ""
        else:
            cur += ch
    raise ValueError("unbalanced call")


def test_launchers_use_the_block_size_of_the_launch_bounds():
    """The table's occupancy assumes each kernel runs with its __launch_bounds__ threads:
    every launch(kernel, grid, block, ...) passes the same expression as the bound."""
    files = list((ROOT / "csrc" / "cuda").glob("*.cu*")) + list((ROOT / "csrc" / "include" / "fastrank").glob("*.h"))
    text = "\n".join(re.sub(r"//[^\n]*", "", f.read_text()) for f in files)
    bounds = {}
    for m in re.finditer(r"__launch_bounds__\s*\(", text):
        args, end = _call_args(text, m.end())
        name = re.match(r"\s*(\w+)\s*\(", text[end:])
        assert name, f"__launch_bounds__({', '.join(args)}) not followed by a kernel"
        bounds.setdefault(name[1], set()).add(args[0])
    assert len(bounds) == len(cr.source_kernels()), "a __global__ function without __launch_bounds__"
    launches = 0
    for m in re.finditer(r"\blaunch\(\s*(\w+)", text):
        if m[1] not in bounds:
            continue
        args, _ = _call_args(text, m.start() + len("launch("))
        assert bounds[m[1]] == {args[2]}, \
            f"launch of {m[1]} with block {args[2]!r}, its __launch_bounds__ says {bounds[m[1]]}"
        launches += 1
    assert launches >= 15


def test_the_cuda_module_holds_sm80_and_sm90():
    if not _cuda_module_built():
        pytest.skip("the CUDA module is not built here")
    archs = set(fastrank.backends()["cuda_archs"].split(","))
    assert {"80", "90"} <= archs, f"the table describes sm_80 and sm_90 code; the module holds {sorted(archs)}"


@compiles
def test_pair_loops_within_their_budgets(kernels):
    """Every marked pair loop is found in the sm_90 SASS, has a budget, and stays within it, in
    every float32, float16 and bfloat16 instantiation."""
    assert cr.pair_loops(kernels), "no pair loop counted at all"
    bad = cr.over_budget(kernels)
    assert not bad, "\n".join(bad)


@compiles
def test_the_v2_smooth_ndcg_pair_loops_meet_their_targets(kernels):
    """smooth-NDCG v2: at most 16 instructions and 2 MUFU (one exp, one reciprocal) an unordered
    pair in each pass (the sparse pass: a nonzero-gain item and an item); the model puts N =
    4096 forward+backward under 100 ms on an H100."""
    loops = [(k, lp) for k, lp in cr.pair_loops(kernels, ("float", "__nv_bfloat16")) if lp.name.startswith("v2 ")]
    assert {lp.name for _, lp in loops} == {"v2 ranks, tile pairs", "v2 ranks, diagonal tiles",
                                            "v2 gradient, tile pairs", "v2 gradient, diagonal tiles",
                                            "v2 sparse ranks", "v2 sparse gradient"}
    for k, lp in loops:
        assert lp.per_pair <= 16 and lp.mufu_per_pair <= 2, (k.name, lp.name, lp.per_pair, lp.mufu_per_pair)
    eta, rows = cr.issue_model.predictions(cr.loop_counts(kernels), cr.issue_model.Ceilings.measured())
    v2 = next(r for r in rows if (r.workload.op, r.workload.version, r.n) == ("smooth_ndcg", "v2", 4096))
    assert v2.raw_s / eta <= 0.100, v2


@compiles
def test_the_docs_table_is_generated_from_these_sources(kernels):
    text = (ROOT / "docs" / "cuda-resources.md").read_text()
    got = cr.doc_block(text)
    assert got is not None, "docs/cuda-resources.md has no generated block"
    version, body = got
    nvcc_version = cr.nvcc_version(cr.find_nvcc())
    if version == nvcc_version:
        assert body == cr.table(kernels), \
            "docs/cuda-resources.md is stale: run python -m benchmarks cuda_resources --write"
    else:  # another nvcc allocates registers differently: the table must still list every kernel
        listed = set(re.findall(r"^\| `([^`]+)` \| (\S+) \| sm_(\d+)", body, re.M))
        missing = {(k.name, k.source, str(k.arch)) for k in kernels} - listed
        assert not missing, f"docs/cuda-resources.md lacks {sorted(missing)[:5]} (nvcc {version} there, {nvcc_version} here)"


@compiles
@pytest.mark.parametrize("which", [1, 2])
def test_the_docs_pair_loop_and_model_tables_are_generated(kernels, which):
    """The pair-loop counts and the model's predictions in docs/cuda-resources.md are what these
    sources compile to (under the nvcc of the table's header)."""
    pattern, begin, _, make = cr.BLOCKS[which]
    got = cr.doc_block((ROOT / "docs" / "cuda-resources.md").read_text(), pattern)
    assert got is not None, f"docs/cuda-resources.md has no block {begin!r}"
    version, body = got
    if version == cr.nvcc_version(cr.find_nvcc()):
        assert body == make(kernels), "docs/cuda-resources.md is stale: run python -m benchmarks cuda_resources --write"


# ---- the SASS parser, on canned nvdisasm output -----------------------------------------------

SASS = """\
        .text._Z1kPf:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
\t//## File "/src/csrc/cuda/k.cu", line 10
        /*0010*/                   LDS R2, [R3] ;
        /*0020*/                   MUFU.EX2 R4, R2 ;
        /*0030*/                   MUFU.RCP R5, R4 ;
        /*0040*/                   FADD R6, R6, R5 ;
        /*0050*/                   MUFU.EX2 R4, R2 ;
        /*0060*/                   MUFU.RCP R5, R4 ;
\t//## File "/src/csrc/cuda/k.cu", line 9
        /*0070*/               @P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0080*/                   IADD3 R7, R7, 0x1, RZ ;
.L_x_2:
        /*0090*/                   FADD R8, R8, R8 ;
        /*00a0*/               @P1 BRA `(.L_x_2) ;
        /*00b0*/               @P2 BRA `(.L_x_1) ;
        /*00c0*/                   EXIT ;
"""


def test_sass_innermost_loops_and_their_counts():
    text = SASS.replace("        .text._Z1kPf:", ".text._Z1kPf:")
    funcs = cr.sass.parse(text)
    loops = cr.sass.innermost_loops("_Z1kPf", funcs["_Z1kPf"])
    # the loop at 0x0010..0x0070 (7 instructions, 2 exps: 2 pairs), and 0x0090..0x00a0 inside the
    # loop 0x0080..0x00b0 (which is not innermost)
    assert [(lp.start, lp.end, lp.count) for lp in loops] == [(0x10, 0x70, 7), (0x90, 0xA0, 2)]
    first = loops[0]
    assert (first.pairs, first.mufu, first.per_pair, first.mufu_per_pair) == (2, 4, 3.5, 2.0)
    assert (first.file, first.line, first.forward_branches) == ("k.cu", 9, 0)
    assert loops[1].pairs == 0  # no exp: not a pair loop


def test_sass_loop_names_from_markers(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("a\n  // pair loop: ranks\n  for (;;) {\n")
    assert cr.sass.marker_names(src) == {2: "ranks", 3: "ranks"}


# ---- the GPU run's side-by-side timing reads the model's predictions ----------------------------

def test_kernel_versions_reads_the_models_predictions():
    """benchmarks/kernel_versions.py (gpu_check.sh step 4b) puts the model's predictions beside
    what it measures: it reads them from the generated table of docs/cuda-resources.md."""
    from benchmarks import kernel_versions as kv
    pred = kv.predictions()
    for key in [("smooth_ndcg", "v1", 4096), ("smooth_ndcg", "v2", 4096), ("smooth_ap", "v1", 8192),
                ("smooth_ap", "v2", 8192)]:
        assert key in pred and pred[key] > 0, (key, pred)
    assert pred[("smooth_ndcg", "v2", 4096)] < pred[("smooth_ndcg", "v1", 4096)] < pred[("smooth_ndcg", "v0", 4096)]
    record = {"device": "GPU", "created": "2026-11-28T00:00:00", "command": "kernel_versions.py", "torch": "2",
              "fastrank": "0", "rows": [{"op": "smooth_ndcg", "n": 4096, "dtype": "float32",
                                         "seconds": {"v1": 0.2, "v2": 0.1}, "samples": {"v1": 3, "v2": 3},
                                         "loss_diff": 1e-7, "grad_diff_rel": 2e-6,
                                         "predicted": {"v1": 0.269, "v2": 0.0867}},
                                        {"op": "smooth_ap", "n": 8192, "dtype": "float32", "skipped": "time limit"}]}
    md = kv.markdown(record)
    assert "| smooth_ndcg | 4096 | float32 | 200 ms | 100 ms | 2.00x | 269 ms | 86.7 ms |" in md, md
    assert "time limit" in md
