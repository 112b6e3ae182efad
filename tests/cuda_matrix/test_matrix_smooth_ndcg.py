"""smooth_ndcg's CUDA kernels (forward_tiles, finalize, backward_tiles) against the reference."""
import pytest
import torch

import fastrank
from _matrix import (DIRECTIONS, EMULATED, REDUCTIONS, SCHEDULES, case, check_loss,
                     check_nonfinite_propagates, dry_run_launches, each_schedule, launches, layout,
                     low_precision_errors)

TAU = 0.05


def native(s, r, direction, reduction, mask, tau=TAU):
    return fastrank.smooth_ndcg_loss(s, r, tau, direction, reduction, impl="native", mask=mask)


def reference(s, r, direction, reduction, mask, tau=TAU):
    return fastrank.smooth_ndcg_loss(s, r, tau, direction, reduction, impl="reference", mask=mask)


# sizes: one item, one list, tiles of 16 exactly and not, chunks of 32 candidates and not
SHAPES = [(1, 1), (1, 19), (19, 1), (16, 32), (33, 17), (20, 70)]


@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, n, m, dtype):
    sim, rel = case(n, m, seed=n * 100 + m, levels=4)
    for direction in DIRECTIONS:
        check_loss(native, reference, sim, rel, direction, "none", dtype=dtype, device=device)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_direction_and_reduction(device, direction, reduction):
    sim, rel = case(21, 18, seed=3, ties=True)
    check_loss(native, reference, sim, rel, direction, reduction, dtype=torch.float64, device=device,
               schedules=SCHEDULES)


@pytest.mark.parametrize("how", ["transposed", "strided"])
def test_transposed_and_strided_inputs(device, how):
    sim, rel = case(18, 23, seed=4)
    mask = torch.rand(18, 23, generator=torch.Generator().manual_seed(4)) > 0.3
    s, r, mk = layout(sim, how, device), layout(rel, how, device), layout(mask, how, device)
    for reduction in ("none", "mean"):
        check_loss(native, reference, s, r, "both", reduction, mk, dtype=torch.float64, device=device)


@pytest.mark.parametrize("grad_layout", ["expanded", "strided"])
def test_strided_grad_output(device, grad_layout):
    sim, rel = case(17, 20, seed=5)
    check_loss(native, reference, sim, rel, "both", "none", dtype=torch.float64, device=device,
               grad_layout=grad_layout)


def test_mask_with_empty_rows_and_columns(device):
    sim, rel = case(20, 35, seed=6, levels=3)
    mask = torch.rand(20, 35, generator=torch.Generator().manual_seed(6)) > 0.4
    mask[3] = False        # an empty i2t list
    mask[:, 7] = False     # an empty t2i list
    mask[5] = False
    mask[5, 2] = True      # a list of one
    rel[8] = 0.0           # a list whose gains are all 0
    for reduction in REDUCTIONS:
        got = check_loss(native, reference, sim, rel, "both", reduction, mask, dtype=torch.float64, device=device)
        assert torch.equal(got[1].cpu()[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))


def test_ties_large_magnitudes_and_temperatures(device):
    for seed, (ties, scale, tau) in enumerate([(True, 1.0, 0.1), (False, 30.0, 1e-3), (True, 0.3, 1.0)]):
        sim, rel = case(19, 22, seed=seed + 10, ties=ties, scale=scale)
        fn = lambda s, r, d, red, mk, t=tau: native(s, r, d, red, mk, t)
        ref = lambda s, r, d, red, mk, t=tau: reference(s, r, d, red, mk, t)
        check_loss(fn, ref, sim, rel, "both", "none", dtype=torch.float64, device=device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_error_bound(device, dtype):
    sim, rel = case(24, 20, seed=7)
    kern, ref = low_precision_errors(native, reference, sim, rel, dtype, device)
    assert kern <= 2 * ref + 1e-12, (kern, ref)


def test_relevance_read_in_the_accumulation_type(device):
    """bfloat16 scores with float32 graded labels: the kernel must not round the labels to
    bfloat16 (that moves the per-query loss by up to ~1e-3)."""
    sim, rel = case(16, 24, seed=8)
    rel = (rel * 0.9 + 0.05).float()  # labels far from bfloat16's grid points
    s = sim.to(torch.bfloat16)
    exact = fastrank.smooth_ndcg_loss(s.double(), rel.double(), TAU, "both", "none", impl="reference")
    rounded = fastrank.smooth_ndcg_loss(s.double(), rel.to(torch.bfloat16).double(), TAU, "both", "none",
                                        impl="reference")
    got = each_schedule(lambda: native(s.to(device), rel.to(device), "both", "none", None))[0].double().cpu()
    assert (rounded - exact).abs().max() > 1e-4  # the rounding would be visible
    torch.testing.assert_close(got, exact, rtol=0, atol=2e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("where", ["sim", "relevance"])
def test_nonfinite_propagates(device, no_finite_check, bad, where):
    sim, rel = case(9, 11, seed=9)
    (sim if where == "sim" else rel)[2, 3] = bad
    check_nonfinite_propagates(native, sim, rel, device)


@pytest.mark.skipif(not EMULATED, reason="the launch log is the emulator's")
def test_one_launch_pair_forward_one_backward(device):
    sim, rel = case(40, 30, seed=10)
    s = sim.requires_grad_(True)
    assert launches(lambda: native(s, rel, "both", "mean", None).backward()) == \
        ["forward_tiles", "finalize", "backward_tiles"]


@pytest.mark.skipif(not EMULATED, reason="the emulator's dry run checks launch shapes without running them")
def test_many_short_lists_fit_the_grid(device):
    """More than 65535 row tiles (1,048,560 rows of one item): the tiles go on gridDim.x, the
    launches are valid. Dry run: shapes are checked, nothing is computed."""
    n = 65536 * 16 + 1
    s, rel = torch.zeros(n, 1).requires_grad_(True), torch.zeros(n, 1)
    shapes = dry_run_launches(lambda: native(s, rel, "both", "mean", None).backward())
    assert [k for k, _, _ in shapes] == ["forward_tiles", "finalize", "backward_tiles"]
    assert shapes[0][1] == ((n + 15) // 16, 1, 1) and shapes[2][1] == shapes[0][1]
