"""The codes and sizes Python shares with the kernels, checked against what each native module
computes (csrc/bindings/constants.h, from csrc/include/fastrank).

Python reads the dtype, direction and reduction codes and MAX_KS from the modules
(src/fastrank/_native.py) and asks them for the CUDA-only buffer sizes. Only the sizes that a
register_fake needs stay Python formulas (a fake must stay symbolic under torch.compile with
dynamic shapes): here each is compared with the module's over a grid of shapes and every
direction, for the CPU module and for the CUDA module (its emulated build, tests/simt, in a
child process with the sanitizers' runtime preloaded, as tests/test_emulated.py runs it).
A drift would be a silent out-of-bounds write.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastrank import _native

HERE = Path(__file__).resolve().parent
SIDES = (1, 2, 15, 16, 17, 31, 32, 33, 100, 257)
SHAPES = [(n, m) for n in SIDES for m in SIDES]
DIRECTIONS = ("i2t", "t2i", "both")


def python_sizes(codes) -> dict:
    """Every Python formula over the grid, keyed like module_sizes."""
    out = {}
    for name in DIRECTIONS:
        d = codes[name]
        for n, m in SHAPES:
            key = f"{n},{m},{d}"
            out[key] = {"query_count": _native.query_count(n, m, d),
                        "smooth_rank_ws_numel": _native.smooth_rank_ws_numel(n, m, d),
                        "kendall_aux_numel": _native.kendall_aux_numel(n, m, d)}
    return out


def module_sizes(mod) -> dict:
    """The module's constants and its sizes over the grid."""
    out = {"DTYPE_CODE": dict(mod.DTYPE_CODE), "DIRECTION_CODE": dict(mod.DIRECTION_CODE),
           "REDUCTION_CODE": dict(mod.REDUCTION_CODE), "MAX_KS": int(mod.MAX_KS),
           "FIELDS": {k: list(v) for k, v in mod.FIELDS.items()},
           "takes_sparse_pass": [[paths, np, n, bool(mod.takes_sparse_pass(paths, np, n))]
                                 for paths in (0, 1, 2) for n in (1, 7, 8, 64, 1000) for np in (0, 1, 3, 4, 32, 500)],
           "sizes": {}}
    for d in mod.DIRECTION_CODE.values():
        for n, m in SHAPES:
            out["sizes"][f"{n},{m},{d}"] = {"query_count": mod.query_count(n, m, d),
                                            "smooth_rank_ws_numel": mod.smooth_rank_ws_numel(n, m, d),
                                            "kendall_aux_numel": mod.kendall_aux_numel(n, m, d)}
    return out


def check(exported: dict) -> None:
    # Python's tables are the module's (read, never typed)
    assert {str(k).removeprefix("torch."): v for k, v in _native.DTYPE_CODE.items()} == exported["DTYPE_CODE"]
    assert _native.DIRECTION_CODE == exported["DIRECTION_CODE"]
    assert _native.REDUCTION_CODE == exported["REDUCTION_CODE"]
    assert _native.MAX_KS == exported["MAX_KS"]
    assert sorted(exported["DIRECTION_CODE"]) == sorted(DIRECTIONS)
    assert set(exported["DTYPE_CODE"]) == {"float32", "float64", "float16", "bfloat16"}
    assert exported["MAX_KS"] >= len((1, 2, 4, 8, 16))  # recall_at_k's default ks fit
    # every entry point is declared by an op, with its struct's field names in order (the
    # stream, CUDA's last field, is added by _launch.call)
    fields = {k: [f for f in v if f != "stream"] for k, v in exported["FIELDS"].items()}
    assert fields == {k: list(v) for k, v in _native._declared_fields.items()}
    # one rule for the sparse or the dense pass of a list (common.h), forced by the pair pass's code
    codes = _native.PATH_CODE
    for paths, np, n, sparse in exported["takes_sparse_pass"]:
        want = 2 * np < n if paths == codes["auto"] else paths == codes["sparse"]
        assert sparse == want, (paths, np, n)
    expected = python_sizes(exported["DIRECTION_CODE"])
    assert set(exported["sizes"]) == set(expected)
    for key, want in expected.items():
        assert exported["sizes"][key] == want, key


def test_cpu_module_constants_match_python():
    mod = _native.cpu_module()
    if mod is None:
        pytest.skip("the CPU module is not built")
    check(module_sizes(mod))


FORWARD = "lists rel_dt sim rel mask rel_i2t rel_t2i version paths tau with_grad out ws partials"


@pytest.mark.parametrize("fields,shown", [
    (FORWARD.replace("sim rel", "rel sim"), "rel_dt, rel, sim, mask"),             # two fields swapped
    (FORWARD.replace("paths", "pass"), "version, pass, tau"),                     # one renamed
    (FORWARD.replace(" partials", ""), "out, ws)"),                               # one missing
])
def test_a_kernel_filled_with_other_field_names_is_refused(fields, shown):
    """An op's kernel declared with field names other than its struct's, in its order, fails
    when it is declared, naming both lists (the binder exports the names: fill.h)."""
    from fastrank.ops._launch import kernel
    if _native.cpu_module() is None:
        pytest.skip("the CPU module is not built")
    with pytest.raises(TypeError) as e:
        kernel("smooth_ndcg_forward", fields)
    msg = str(e.value)
    assert msg.startswith("fields: smooth_ndcg_forward is filled with (") and shown in msg
    assert "its parameter struct declares (lists, rel_dt, sim, rel, mask, rel_i2t, rel_t2i, version, paths" in msg
    kernel("smooth_ndcg_forward", FORWARD)  # the struct's own names pass


def test_every_code_reaches_the_modules():
    """The codes are what the ops pass: every torch float dtype a kernel reads has a code."""
    assert set(_native.DTYPE_CODE) == {torch.float32, torch.float64, torch.float16, torch.bfloat16}


_CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import build as simt
sys.path.insert(0, sys.argv[3])
from test_native_constants import module_sizes
mod = simt.load(Path(sys.argv[1]))
sizes = module_sizes(mod)
sizes["partials"] = {f"{n},{m},{d}": [mod.smooth_ndcg_partials_numel(n, m, d), mod.smooth_rank_partials_numel(n, m, d)]
                     for d in (1, 2, 3) for n, m in [(1, 1), (16, 17), (100, 3)]}
print(json.dumps(sizes))
"""


@pytest.mark.emulated
def test_cuda_module_constants_match_python():
    sys.path.insert(0, str(HERE / "simt"))
    import build as simt
    try:
        module = simt.build()
        env = simt.sanitizer_env()
    except simt.Unavailable as e:
        pytest.skip(f"emulated build unavailable here: {e}")
    env["PYTHONPATH"] = str(Path(_native.__file__).resolve().parent.parent)
    res = subprocess.run([sys.executable, "-c", _CHILD, str(module), str(HERE / "simt"), str(HERE)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    exported = json.loads(res.stdout.strip().splitlines()[-1])
    partials = exported.pop("partials")
    check(exported)
    # the CUDA-only forward buffers: asked of the module by the ops (no Python formula); a
    # buffer exists for every requested direction and none for a direction not requested
    for key, (ndcg, subset) in partials.items():
        n, m, d = map(int, key.split(","))
        assert ndcg > 0 and subset > 0, key
    # smooth-NDCG: the two directions' launches of version 2 reuse one scratch
    assert max(partials["16,17,1"][0], partials["16,17,2"][0]) <= partials["16,17,3"][0] \
        <= partials["16,17,1"][0] + partials["16,17,2"][0]
    assert partials["16,17,3"][1] == partials["16,17,1"][1] + partials["16,17,2"][1]
