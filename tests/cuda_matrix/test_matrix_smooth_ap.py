"""smooth_ap's and recall_at_k's CUDA kernels (the smooth-rank engine's positive-row kernels:
subset_forward_kernel, subset_finalize, subset_backward_kernel) against the reference."""
import pytest
import torch

import fastrank
from _matrix import (DIRECTIONS, EMULATED, REDUCTIONS, SCHEDULES, case, check_loss,
                     check_nonfinite_propagates, launches, layout, low_precision_errors)

TAU = 0.05
KS, TAU_K = (1, 2, 5), (1.0, 0.5, 2.0)


def ap(impl):
    return lambda s, p, d, red, mk: fastrank.smooth_ap_loss(s, p, TAU, d, red, impl=impl, mask=mk)


def rk(impl):
    return lambda s, p, d, red, mk: fastrank.recall_at_k_loss(s, p, KS, TAU, TAU_K, d, red, impl=impl, mask=mk)


HEADS = {"smooth_ap": ap, "recall_at_k": rk}


def positives(n, m, seed, p=0.25):
    return torch.rand(n, m, generator=torch.Generator().manual_seed(seed + 99)) < p


# one block of 256 threads a query, 32 candidates a ballot: sizes around them (longer lists,
# and more than 256 positives a list: test_long_lists_and_many_positives)
SHAPES = [(1, 1), (1, 19), (19, 1), (33, 17)]


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, head, n, m, dtype):
    sim, _ = case(n, m, seed=n * 100 + m)
    pos = positives(n, m, seed=n + m)
    pos[0, 0] = True
    for direction in DIRECTIONS:
        check_loss(HEADS[head]("native"), HEADS[head]("reference"), sim, pos, direction, "none", dtype=dtype,
                   device=device)


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_every_direction_and_reduction(device, head, reduction):
    sim, _ = case(13, 10, seed=3, ties=True)
    pos = positives(13, 10, seed=3, p=0.4)
    for direction in DIRECTIONS:
        check_loss(HEADS[head]("native"), HEADS[head]("reference"), sim, pos, direction, reduction,
                   dtype=torch.float64, device=device, schedules=SCHEDULES if reduction == "mean" else None)


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("direction,shape", [("i2t", (3, 600)), ("t2i", (600, 2))])
def test_long_lists_and_many_positives(device, head, direction, shape):
    """Lists longer than a block, every item of a list a positive (all rows ranked), and more
    than 256 positives in a list (more than one staging chunk)."""
    sim, _ = case(*shape, seed=4)
    pos = positives(*shape, seed=4, p=0.7)
    if direction == "i2t":
        pos[1] = True
    else:
        pos[:, 1] = True
    check_loss(HEADS[head]("native"), HEADS[head]("reference"), sim, pos, direction, "none", dtype=torch.float64,
               device=device)


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("how", ["transposed", "strided"])
@pytest.mark.parametrize("n,m", [(18, 23), (40, 70)])   # one tile of the t2i transposes; 2 x 3 tiles
def test_transposed_and_strided_inputs(device, head, how, n, m):
    sim, _ = case(n, m, seed=5)
    pos = positives(n, m, seed=5)
    mask = torch.rand(n, m, generator=torch.Generator().manual_seed(5)) > 0.3
    s, p, mk = layout(sim, how, device), layout(pos, how, device), layout(mask, how, device)
    check_loss(HEADS[head]("native"), HEADS[head]("reference"), s, p, "both", "mean", mk, dtype=torch.float64,
               device=device)


@pytest.mark.parametrize("head", list(HEADS))
def test_mask_with_empty_rows_and_columns_and_no_positive(device, head):
    sim, _ = case(12, 21, seed=6)
    pos = positives(12, 21, seed=6)
    mask = torch.rand(12, 21, generator=torch.Generator().manual_seed(6)) > 0.4
    mask[3] = False        # an empty i2t list
    mask[:, 7] = False     # an empty t2i list
    pos[4] = False         # a list without a positive
    for reduction in REDUCTIONS:
        got = check_loss(HEADS[head]("native"), HEADS[head]("reference"), sim, pos, "both", reduction, mask,
                         dtype=torch.float64, device=device)
        assert torch.equal(got[1].cpu()[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("grad_layout", ["expanded", "strided"])
def test_strided_grad_output(device, head, grad_layout):
    sim, _ = case(17, 20, seed=7)
    check_loss(HEADS[head]("native"), HEADS[head]("reference"), sim, positives(17, 20, seed=7), "both", "none",
               dtype=torch.float64, device=device, grad_layout=grad_layout)


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_error_bound(device, head, dtype):
    sim, _ = case(24, 20, seed=8)
    kern, ref = low_precision_errors(HEADS[head]("native"), HEADS[head]("reference"), sim,
                                     positives(24, 20, seed=8, p=0.3), dtype, device)
    assert kern <= 2 * ref + 1e-12, (kern, ref)


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_propagates(device, no_finite_check, head, bad):
    sim, _ = case(9, 11, seed=9)
    sim[2, 3] = bad
    check_nonfinite_propagates(HEADS[head]("native"), sim, positives(9, 11, seed=9), device)


@pytest.mark.skipif(not EMULATED, reason="the launch log is the emulator's")
@pytest.mark.parametrize("head", list(HEADS))
def test_launches_per_call(device, head):
    s = case(40, 30, seed=10)[0].requires_grad_(True)
    assert launches(lambda: HEADS[head]("native")(s, positives(40, 30, seed=10), "both", "mean", None).backward()) \
        == ["subset_transpose_kernel", "subset_forward_kernel", "subset_finalize", "subset_backward_kernel"]
    # i2t alone reads sim's rows in place: no transpose
    s.grad = None
    assert launches(lambda: HEADS[head]("native")(s, positives(40, 30, seed=10), "i2t", "mean", None).backward()) \
        == ["subset_forward_kernel", "subset_finalize", "subset_backward_kernel"]


@pytest.mark.skipif(not EMULATED, reason="calls the emulated module directly")
def test_kernel_error_reaches_python(device):
    """A refused call surfaces as a RuntimeError naming the kernel (a C++ exception through
    the bindings): more ks than the kernels take by value."""
    from fastrank import _native
    mod = _native.emulated_cuda()
    s, p = torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool)
    out, ws = torch.empty(()), torch.empty(20)
    with pytest.raises(RuntimeError, match="recall_at_k_forward"):
        mod.recall_at_k_forward(0, 2, 2, 3, 1, s.data_ptr(), 2, 1, p.data_ptr(), 2, 1, 0, 0, 0, 0.1, 1, out.data_ptr(),
                                ws.data_ptr(), [1.0] * 33, [1.0] * 33, 33, torch.empty(32).data_ptr(), 0)
