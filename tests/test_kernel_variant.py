"""fastrank.kernel_variant: the one selection of a call's kernel variant (the CUDA kernels'
version, the graded losses' pair pass), read once per call into the fields of its parameter
struct; the environment's FASTRANK_CUDA_KERNELS is only its default, read at import."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import fastrank
from fastrank import _native

needs_native = pytest.mark.skipif(_native.cpu_module() is None, reason="needs the CPU module")


def test_default_and_nesting():
    assert _native.variant_codes() == (2, _native.PATH_CODE.get("auto", 0))
    with fastrank.kernel_variant(pair_pass="dense") as outer:
        assert outer == fastrank.KernelVariant(2, "dense")
        with fastrank.kernel_variant(version=1) as inner:  # what is not given stays
            assert inner == fastrank.KernelVariant(1, "dense")
            assert _native.variant_codes() == (1, _native.PATH_CODE.get("dense", 0))
        assert _native.variant_codes() == (2, _native.PATH_CODE.get("dense", 0))
    assert _native.variant_codes() == (2, _native.PATH_CODE.get("auto", 0))


def test_restored_after_an_error():
    with pytest.raises(RuntimeError):
        with fastrank.kernel_variant(version=1, pair_pass="sparse"):
            raise RuntimeError
    assert _native.variant_codes() == (2, _native.PATH_CODE.get("auto", 0))


@pytest.mark.parametrize("kwargs,name", [({"version": 3}, "version"), ({"version": "v1"}, "version"),
                                         ({"pair_pass": "fast"}, "pair_pass")])
def test_bad_values_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must be one of"):
        with fastrank.kernel_variant(**kwargs):
            pass


def test_the_environment_is_the_default_read_at_import(monkeypatch):
    """FASTRANK_CUDA_KERNELS=v1 makes version 1 the default of a process that imports fastrank
    with it set; set later, it changes nothing (no kernel reads the environment)."""
    env = dict(os.environ, FASTRANK_CUDA_KERNELS="v1")
    out = subprocess.run([sys.executable, "-c", "import fastrank._native as n; print(n.variant_codes()[0])"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1"
    monkeypatch.setenv("FASTRANK_CUDA_KERNELS", "v1")
    assert _native.variant_codes()[0] == 2


def _loss_and_grad(fn, sim, rel):
    s = sim.detach().clone().requires_grad_(True)
    loss = fn(s, rel)
    (g,) = torch.autograd.grad(loss, s)
    return loss.detach(), g


@needs_native
def test_the_pair_pass_reaches_the_kernels_eagerly_and_compiled():
    """The two passes round differently (float32, lists of 3 nonzero gains in 300 items): each
    forced pass gives its own bits, eagerly and under torch.compile(fullgraph=True), where the
    variant is read at trace time (a change of variant recompiles, never reuses the other's
    graph); the backward runs the forward's pass."""
    g = torch.Generator().manual_seed(0)
    sim = torch.randn(6, 300, generator=g)
    rel = torch.zeros(6, 300)
    rel[:, :3] = torch.rand(6, 3, generator=g) + 0.5
    top = fastrank.TopKRelevance.from_dense(rel, 3)

    def f(s, r):
        return fastrank.smooth_ndcg_loss(s, r, tau=0.05, direction="i2t")

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    got = {}
    for path in ("dense", "sparse"):
        with fastrank.kernel_variant(pair_pass=path):
            eager = _loss_and_grad(f, sim, top)
            comp = _loss_and_grad(compiled, sim, top)
        assert torch.equal(eager[0], comp[0]) and torch.equal(eager[1], comp[1]), path
        got[path] = eager
    torch.testing.assert_close(got["dense"][0], got["sparse"][0])
    torch.testing.assert_close(got["dense"][1], got["sparse"][1])
    assert not (torch.equal(got["dense"][0], got["sparse"][0]) and torch.equal(got["dense"][1], got["sparse"][1]))
