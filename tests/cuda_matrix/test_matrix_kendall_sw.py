"""kendall_sw's CUDA kernels (sw_forward_kernel, reduce_queries_kernel, sw_backward_kernel)
against the reference."""
import pytest
import torch

import fastrank
from _matrix import (DIRECTIONS, EMULATED, REDUCTIONS, SCHEDULES, case, check_loss,
                     check_nonfinite_propagates, dry_run_launches, layout, low_precision_errors)


def native(s, r, direction, reduction, mask, alpha=0.1, beta=0.05, label_range=(0.0, 1.0)):
    assert mask is None
    return fastrank.kendall_sw_loss(s, r, alpha, beta, label_range, direction, reduction, impl="native")


def reference(s, r, direction, reduction, mask, alpha=0.1, beta=0.05, label_range=(0.0, 1.0)):
    return fastrank.kendall_sw_loss(s, r, alpha, beta, label_range, direction, reduction, impl="reference")


# backward tiles of 8 rows x 32 columns: shapes on and off the tiles
SHAPES = [(1, 1), (1, 19), (19, 1), (8, 32), (33, 17), (9, 70)]


@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, n, m, dtype):
    sim, rel = case(n, m, seed=n * 100 + m)
    for direction in DIRECTIONS:
        check_loss(native, reference, sim, rel, direction, "none", dtype=dtype, device=device)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_direction_and_reduction(device, direction, reduction):
    sim, rel = case(21, 18, seed=3, ties=True, levels=7)
    check_loss(native, reference, sim, rel, direction, reduction, dtype=torch.float64, device=device,
               schedules=SCHEDULES)


def test_many_windows(device):
    """More windows than one shared-memory chunk of the forward (512) and of the backward (64)."""
    sim, rel = case(6, 40, seed=13)
    fn = lambda s, r, d, red, mk: native(s, r, d, red, mk, alpha=0.05, beta=0.001)
    ref = lambda s, r, d, red, mk: reference(s, r, d, red, mk, alpha=0.05, beta=0.001)
    check_loss(fn, ref, sim, rel, "both", "none", dtype=torch.float64, device=device)


def test_label_range_and_ties(device):
    sim, rel = case(14, 16, seed=14, ties=True, levels=5)
    rel = rel * 2 - 1
    fn = lambda s, r, d, red, mk: native(s, r, d, red, mk, alpha=0.2, beta=0.1, label_range=(-1.0, 1.0))
    ref = lambda s, r, d, red, mk: reference(s, r, d, red, mk, alpha=0.2, beta=0.1, label_range=(-1.0, 1.0))
    check_loss(fn, ref, sim, rel, "both", "mean", dtype=torch.float64, device=device)


@pytest.mark.parametrize("how", ["transposed", "strided"])
def test_transposed_and_strided_inputs(device, how):
    sim, rel = case(18, 23, seed=4)
    s, r = layout(sim, how, device), layout(rel, how, device)
    check_loss(native, reference, s, r, "both", "none", dtype=torch.float64, device=device)


@pytest.mark.parametrize("grad_layout", ["expanded", "strided"])
def test_strided_grad_output(device, grad_layout):
    sim, rel = case(17, 20, seed=5)
    check_loss(native, reference, sim, rel, "both", "none", dtype=torch.float64, device=device,
               grad_layout=grad_layout)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_error_bound(device, dtype):
    sim, rel = case(24, 20, seed=7)
    kern, ref = low_precision_errors(native, reference, sim, rel, dtype, device)
    assert kern <= 2 * ref + 1e-12, (kern, ref)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("where", ["sim", "relevance"])
def test_nonfinite_propagates(device, no_finite_check, bad, where):
    sim, rel = case(9, 11, seed=9)
    (sim if where == "sim" else rel)[2, 3] = bad
    check_nonfinite_propagates(native, sim, rel, device)


@pytest.mark.skipif(not EMULATED, reason="the emulator's dry run checks launch shapes without running them")
def test_many_columns_fit_the_grid(device):
    """More than 2,097,120 columns: the backward's 65535-tile gridDim.y limit is gone (the
    tiles go on gridDim.x) and the forward's queries are grid-strided. Dry run."""
    m = 65535 * 32 + 1
    s, rel = torch.zeros(1, m).requires_grad_(True), torch.zeros(1, m)
    shapes = dry_run_launches(lambda: native(s, rel, "both", "mean", None).backward())
    assert [k for k, _, _ in shapes] == ["sw_forward_kernel", "reduce_queries_kernel", "sw_backward_kernel"]
    assert shapes[0][1] == (1 + m, 1, 1)
    assert shapes[2][1] == ((m + 31) // 32, 1, 1)
