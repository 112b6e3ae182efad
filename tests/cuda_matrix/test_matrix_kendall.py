"""kendall's CUDA kernels (kendall_kernel, reduce_queries_kernel, kendall_backward_kernel)
against the reference."""
import pytest
import torch

import fastrank
from _matrix import (DIRECTIONS, EMULATED, REDUCTIONS, SCHEDULES, case, check_loss,
                     check_nonfinite_propagates, dry_run_launches, each_schedule, launches, layout,
                     low_precision_errors)

ALPHA = 0.1


def native(s, r, direction, reduction, mask, alpha=ALPHA):
    return fastrank.kendall_loss(s, r, alpha, direction, reduction, impl="native", mask=mask)


def reference(s, r, direction, reduction, mask, alpha=ALPHA):
    return fastrank.kendall_loss(s, r, alpha, direction, reduction, impl="reference", mask=mask)


# one block of 256 threads a query (lists longer than that and than a 1024-candidate chunk:
# test_lists_longer_than_a_chunk)
SHAPES = [(1, 1), (1, 19), (19, 1), (33, 17)]


@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, n, m, dtype):
    sim, rel = case(n, m, seed=n * 100 + m, levels=5)
    for direction in DIRECTIONS:
        check_loss(native, reference, sim, rel, direction, "none", dtype=dtype, device=device)


@pytest.mark.parametrize("direction,shape", [("i2t", (2, 300)), ("i2t", (2, 1100)), ("t2i", (1100, 2))])
def test_lists_longer_than_a_chunk(device, direction, shape):
    sim, rel = case(*shape, seed=11, levels=6)
    check_loss(native, reference, sim, rel, direction, "none", dtype=torch.float64, device=device)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_direction_and_reduction(device, direction, reduction):
    sim, rel = case(21, 18, seed=3, ties=True, levels=4)
    check_loss(native, reference, sim, rel, direction, reduction, dtype=torch.float64, device=device,
               schedules=SCHEDULES)


@pytest.mark.parametrize("how", ["transposed", "strided"])
def test_transposed_and_strided_inputs(device, how):
    sim, rel = case(18, 23, seed=4, levels=5)
    mask = torch.rand(18, 23, generator=torch.Generator().manual_seed(4)) > 0.3
    s, r, mk = layout(sim, how, device), layout(rel, how, device), layout(mask, how, device)
    for reduction in ("none", "mean"):
        check_loss(native, reference, s, r, "both", reduction, mk, dtype=torch.float64, device=device)


@pytest.mark.parametrize("grad_layout", ["expanded", "strided"])
def test_strided_grad_output(device, grad_layout):
    sim, rel = case(17, 20, seed=5, levels=5)
    check_loss(native, reference, sim, rel, "both", "none", dtype=torch.float64, device=device,
               grad_layout=grad_layout)


def test_mask_with_empty_rows_and_columns(device):
    sim, rel = case(20, 35, seed=6, levels=3)
    mask = torch.rand(20, 35, generator=torch.Generator().manual_seed(6)) > 0.4
    mask[3] = False
    mask[:, 7] = False
    mask[5] = False
    mask[5, 2] = True
    for reduction in REDUCTIONS:
        got = check_loss(native, reference, sim, rel, "both", reduction, mask, dtype=torch.float64, device=device)
        assert torch.equal(got[1].cpu()[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))


def test_relevance_in_the_accumulation_type(device):
    """bfloat16 scores with float32 labels: pairs are decided on the float32 labels."""
    sim, rel = case(15, 13, seed=12)
    s, r = sim.to(torch.bfloat16), rel.float()
    got = each_schedule(lambda: native(s.to(device), r.to(device), "both", "none", None))[0]
    want = reference(s.double(), r.double(), "both", "none", None)
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_error_bound(device, dtype):
    sim, rel = case(24, 20, seed=7, levels=5)
    kern, ref = low_precision_errors(native, reference, sim, rel, dtype, device)
    assert kern <= 2 * ref + 1e-12, (kern, ref)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("where", ["sim", "relevance"])
def test_nonfinite_propagates(device, no_finite_check, bad, where):
    sim, rel = case(9, 11, seed=9)
    (sim if where == "sim" else rel)[2, 3] = bad
    check_nonfinite_propagates(native, sim, rel, device)


@pytest.mark.skipif(not EMULATED, reason="the launch log is the emulator's")
def test_launches_per_call(device):
    sim, rel = case(40, 30, seed=10)
    s = sim.requires_grad_(True)
    assert launches(lambda: native(s, rel, "both", "mean", None).backward()) == \
        ["kendall_kernel", "reduce_queries_kernel", "kendall_backward_kernel"]


@pytest.mark.skipif(not EMULATED, reason="the emulator's dry run checks launch shapes without running them")
def test_many_queries_fit_the_grid(device, no_finite_check):
    """One block a query, grid-strided: the block count never passes gridDim.x's limit, and
    the backward's elementwise grid is capped. Dry run: shapes checked, nothing computed."""
    s, rel = torch.zeros(300_000, 2).requires_grad_(True), torch.zeros(300_000, 2)
    shapes = dry_run_launches(lambda: native(s, rel, "both", "mean", None).backward())
    assert [k for k, _, _ in shapes] == ["kendall_kernel", "reduce_queries_kernel", "kendall_backward_kernel"]
    assert shapes[0][1] == (300_002, 1, 1) and shapes[2][1] == ((600_000 + 255) // 256, 1, 1)
