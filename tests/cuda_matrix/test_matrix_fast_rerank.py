"""fast_rerank's CUDA kernels (lse_tile_kernel, lse_merge_kernel, scores_kernel,
sums_tile_kernel, sums_merge_kernel, grad_kernel) against the reference, and the
statistics-only path of fast_rerank_topk."""
import pytest
import torch

import fastrank
from _matrix import EMULATED, case, dry_run_launches, each_schedule, launches, layout

GAMMA, LAM = (25.0, 20.0), (20.0, 15.0)
TOL = {torch.float64: dict(rtol=1e-9, atol=1e-9), torch.float32: dict(rtol=2e-5, atol=2e-4)}

# 64-row tiles, 256-column tiles, 32-row strips, a statistics grid of at most 32 x 64 blocks
SHAPES = [(1, 1), (1, 300), (300, 1), (70, 257), (33, 40)]


def run(sim, device, dtype, which=("i2t", "t2i"), grad_layout="contiguous", impl="native"):
    g = torch.Generator().manual_seed(1)
    w1 = torch.randn(sim.shape, generator=g, dtype=torch.float64)
    w2 = torch.randn(sim.shape, generator=g, dtype=torch.float64)

    def once():
        same = sim.dtype == dtype and sim.device == device
        s = (sim.detach() if same else sim.detach().to(device=device, dtype=dtype)).requires_grad_(True)
        i2t, t2i = fastrank.fast_rerank(s, GAMMA, LAM, impl=impl)
        loss = 0
        if "i2t" in which:
            loss = loss + (i2t.sum() if grad_layout == "expanded" else (i2t * w1.to(i2t)).sum())
        if "t2i" in which:
            loss = loss + (t2i.sum() if grad_layout == "expanded" else (t2i * w2.to(t2i)).sum())
        (grad,) = torch.autograd.grad(loss, s)
        return i2t.detach(), t2i.detach(), grad

    return each_schedule(once) if impl == "native" else once()


def check(sim, device, dtype, **kw):
    got = run(sim, device, dtype, **kw)
    want = run(sim.to(dtype).double().cpu(), torch.device("cpu"), torch.float64, impl="reference", **kw)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double().cpu(), b, **TOL[dtype])
    return got


@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, n, m, dtype):
    sim, _ = case(n, m, seed=n + m, scale=0.3)
    check(sim, device, dtype)


@pytest.mark.parametrize("which", [("i2t",), ("t2i",)])
def test_one_output_used(device, which):
    """The other output's gradient is None: the backward reads a null pointer for it."""
    sim, _ = case(40, 50, seed=2, scale=0.3)
    check(sim, device, torch.float64, which=which)


def test_expanded_grads(device):
    sim, _ = case(40, 50, seed=3, scale=0.3)
    check(sim, device, torch.float64, grad_layout="expanded")


@pytest.mark.parametrize("how", ["transposed", "strided"])
def test_transposed_and_strided_inputs(device, how):
    sim, _ = case(45, 70, seed=4, scale=0.3)
    check(layout(sim, how, device), device, torch.float64)


def test_grid_strided_tiles(device):
    """More column tiles than the statistics grid's 32 block columns (m > 8192)."""
    sim, _ = case(3, 8300, seed=5, scale=0.3)
    check(sim, device, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_error_bound(device, dtype):
    sim, _ = case(40, 60, seed=6, scale=0.3)
    rounded = sim.to(dtype).double()
    want = run(rounded, torch.device("cpu"), torch.float64, impl="reference")
    got = run(rounded, device, dtype)
    lp = run(rounded.to(dtype), torch.device("cpu"), dtype, impl="reference")
    err = lambda x: max((a.double().cpu() - b).abs().max().item() for a, b in zip(x, want))
    assert got[0].dtype == dtype and got[2].dtype == dtype
    assert err(got) <= 2 * err(lp) + 1e-12, (err(got), err(lp))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_propagates(device, no_finite_check, bad):
    sim, _ = case(9, 11, seed=7)
    sim[2, 3] = bad
    s = sim.to(device).requires_grad_(True)
    i2t, t2i = fastrank.fast_rerank(s, impl="native")
    (i2t.sum() + t2i.sum()).backward()
    assert not torch.isfinite(i2t).all() and not torch.isfinite(t2i).all() and not torch.isfinite(s.grad).all()


def test_topk_statistics_path(device):
    """fast_rerank_topk's statistics kernel (fast_rerank_lse) in tiles of rows."""
    g = torch.Generator().manual_seed(8)
    img = torch.nn.functional.normalize(torch.randn(37, 16, generator=g, dtype=torch.float64), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(53, 16, generator=g, dtype=torch.float64), dim=1)
    got = each_schedule(lambda: tuple(fastrank.fast_rerank_topk(img.to(device), txt.to(device), 5, block=10,
                                                                impl="native")))
    want = fastrank.fast_rerank_topk(img, txt, 5, block=10, impl="reference")
    for a, b in zip(got, want):
        if a.is_floating_point():
            torch.testing.assert_close(a.cpu(), b, rtol=1e-9, atol=1e-9)
        else:
            assert torch.equal(a.cpu(), b)


@pytest.mark.skipif(not EMULATED, reason="the launch log is the emulator's")
def test_launches_per_call(device):
    s = case(40, 30, seed=10)[0].requires_grad_(True)
    assert launches(lambda: sum(x.sum() for x in fastrank.fast_rerank(s, impl="native")).backward()) == \
        ["lse_tile_kernel", "lse_merge_kernel", "scores_kernel", "sums_tile_kernel", "sums_merge_kernel", "grad_kernel"]


@pytest.mark.skipif(not EMULATED, reason="the emulator's dry run checks launch shapes without running them")
@pytest.mark.parametrize("n,m", [(300_000, 1), (1, 3_000_000)])
def test_large_shapes_fit_the_grid(device, no_finite_check, n, m):
    """The statistics grid stays at most 32 x 64 blocks and the elementwise grid's rows at
    most 1024 (grid-strided) for any n, m. Dry run: shapes checked, nothing computed."""
    s = torch.zeros(n, m).requires_grad_(True)
    shapes = {k: g for k, g, _ in dry_run_launches(lambda: sum(x.sum() for x in fastrank.fast_rerank(s, impl="native"))
                                                   .backward())}
    assert len(shapes) == 6
    assert shapes["lse_tile_kernel"][0] <= 32 and shapes["lse_tile_kernel"][1] <= 64
    assert shapes["scores_kernel"] == ((m + 255) // 256, min((n + 3) // 4, 1024), 1)
