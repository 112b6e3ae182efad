"""smooth_ap_loss (docs/spec.md §2.8): loop oracle, gradients, masks, ties, no positive, N = 1,
reductions, dtypes, bad input, native vs reference (switched on with the kernel), and the CUDA
test matrix of smooth_ap and recall_at_k."""
import functools

import pytest
import torch

import fastrank
from fastrank._tolerance import low_precision_bound
from fastrank.reference.smooth_ap import smooth_ap_per_query
from fastrank.reference.smooth_rank import smooth_ranks

import _cuda_checks
from _cuda_matrix import (DIRECTIONS, EMULATED, REDUCTIONS, SCHEDULES, case, check_loss, check_nonfinite_propagates,
                          launches, layout, low_precision_errors)
from _rank_oracles import oracle, rand_case, rand_mask, sig, smooth_ap_query

NATIVE_CPU = fastrank.backends()["cpu"]
CUDA = fastrank.backends()["cuda_available"]
KERNEL = NATIVE_CPU
needs_kernel = pytest.mark.skipif(not KERNEL, reason="native CPU module not built")
needs_cuda_kernel = pytest.mark.skipif(not CUDA, reason="no CUDA device")
IMPLS = ["reference"] + (["native"] if KERNEL else [])


def expected(sim, positives, tau, direction="both", reduction="mean", mask=None):
    return oracle(functools.partial(smooth_ap_query, tau=tau), sim, positives, direction, reduction, mask)


SHAPES = [(1, 1), (1, 2), (2, 1), (1, 7), (5, 1), (3, 5), (6, 4), (8, 8), (17, 9)]


# ---------------------------------------------------------------- the loop oracle
@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("direction", ["i2t", "t2i", "both"])
def test_reference_matches_loop_oracle(n, m, direction):
    sim, pos = rand_case(n, m, seed=n * 31 + m, ties=(n + m) % 2 == 0, p_pos=0.4)
    for tau in (1e-3, 0.05, 1.0):
        for reduction in ("mean", "sum", "none"):
            got = fastrank.smooth_ap_loss(sim, pos, tau, direction, reduction, impl="reference")
            torch.testing.assert_close(got, expected(sim, pos, tau, direction, reduction), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_default_positives_are_the_diagonal(n):
    sim, _ = rand_case(n, n, seed=n)
    eye = torch.eye(n, dtype=torch.bool)
    for reduction in ("mean", "none"):
        got = fastrank.smooth_ap_loss(sim, tau=0.1, reduction=reduction)
        torch.testing.assert_close(got, expected(sim, eye, 0.1, "both", reduction), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got, fastrank.smooth_ap_loss(sim, eye, tau=0.1, reduction=reduction))


def test_known_values():
    # two positives (columns 0 and 2) among four items, ranked 1st and 3rd, tau -> 0:
    # AP = (1/1 + 2/3) / 2 -> loss 1/6
    sim = torch.tensor([[0.9, 0.5, 0.3, 0.1]], dtype=torch.float64)
    pos = torch.tensor([[True, False, True, False]])
    loss = fastrank.smooth_ap_loss(sim, pos, tau=1e-4, direction="i2t")
    assert loss.item() == pytest.approx(1 - (1 + 2 / 3) / 2, abs=1e-12)
    # the positives ranked first: AP = 1, loss 0
    assert fastrank.smooth_ap_loss(sim, torch.tensor([[True, True, False, False]]), tau=1e-4,
                                   direction="i2t").item() == pytest.approx(0.0, abs=1e-12)
    # one positive ranked last of four: AP = 1/4
    assert fastrank.smooth_ap_loss(sim, torch.tensor([[False, False, False, True]]), tau=1e-4,
                                   direction="i2t").item() == pytest.approx(0.75, abs=1e-12)
    # a finite tau, by hand: one positive s = 0.5 against 0.9 and 0.1, tau = 0.2
    sim = torch.tensor([[0.9, 0.5, 0.1]], dtype=torch.float64)
    pos = torch.tensor([[False, True, False]])
    r_all = 1 + sig(0.4 / 0.2) + sig(-0.4 / 0.2)
    loss = fastrank.smooth_ap_loss(sim, pos, tau=0.2, direction="i2t")
    assert loss.item() == pytest.approx(1 - 1 / r_all, abs=1e-14)


def test_ties():
    """Equal scores: every sigmoid is 1/2, so R_all = 1 + (n - 1)/2, R_pos = 1 + (|P| - 1)/2."""
    n, npos = 6, 3
    sim = torch.full((1, n), 0.3, dtype=torch.float64, requires_grad=True)
    pos = torch.zeros(1, n, dtype=torch.bool)
    pos[0, :npos] = True
    loss = fastrank.smooth_ap_loss(sim, pos, tau=0.05, direction="i2t")
    assert loss.item() == pytest.approx(1 - (1 + (npos - 1) / 2) / (1 + (n - 1) / 2), abs=1e-14)
    loss.backward()
    assert torch.isfinite(sim.grad).all()
    # raising a positive helps (negative gradient), raising a negative hurts
    assert (sim.grad[0, :npos] < 0).all() and (sim.grad[0, npos:] > 0).all()


def test_no_positive():
    sim, _ = rand_case(4, 6, seed=3)
    none = torch.zeros(4, 6, dtype=torch.bool)
    for reduction in ("mean", "sum", "none"):
        s = sim.clone().requires_grad_(True)
        loss = fastrank.smooth_ap_loss(s, none, 0.1, "both", reduction)
        loss.sum().backward()
        assert torch.all(loss == 0) and torch.all(s.grad == 0)
    # "mean" counts only the queries with a positive: 2 of 4 rows, 1 of 6 columns
    pos = torch.zeros(4, 6, dtype=torch.bool)
    pos[1, 2] = pos[3, 2] = True
    per_q = fastrank.smooth_ap_loss(sim, pos, 0.1, "both", "none")
    assert per_q[[0, 2]].eq(0).all() and per_q[4 + torch.tensor([0, 1, 3, 4, 5])].eq(0).all()
    mean = fastrank.smooth_ap_loss(sim, pos, 0.1, "both", "mean")
    torch.testing.assert_close(mean, per_q[:4].sum() / 2 + per_q[4:].sum() / 1)
    assert mean.item() > 0


def test_single_item_and_single_query():
    # N = M = 1: the only item is the positive, rank 1 -> loss 0, gradient 0
    s = torch.tensor([[0.7]], dtype=torch.float64, requires_grad=True)
    loss = fastrank.smooth_ap_loss(s)
    loss.backward()
    assert loss.item() == 0.0 and s.grad.item() == 0.0
    # N = 1 query, M candidates with explicit positives (t2i: M one-item lists)
    sim, _ = rand_case(1, 9, seed=4)
    pos = torch.zeros(1, 9, dtype=torch.bool)
    pos[0, [2, 5]] = True
    for direction in ("i2t", "t2i", "both"):
        got = fastrank.smooth_ap_loss(sim, pos, 0.05, direction, "none")
        torch.testing.assert_close(got, expected(sim, pos, 0.05, direction, "none"), rtol=1e-10, atol=1e-12)
    # a t2i list of one item that is a positive: loss 0
    assert fastrank.smooth_ap_loss(sim, pos, 0.05, "t2i", "none")[2].item() == 0.0


def test_rectangular_with_several_positives_per_query():
    """N != M: a caption-per-image layout (5 captions of each image), as in COCO."""
    n, per = 4, 5
    sim, _ = rand_case(n, n * per, seed=5)
    pos = torch.arange(n * per).div(per, rounding_mode="floor").unsqueeze(0) == torch.arange(n).unsqueeze(1)
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("mean", "sum", "none"):
            got = fastrank.smooth_ap_loss(sim, pos, 0.02, direction, reduction)
            torch.testing.assert_close(got, expected(sim, pos, 0.02, direction, reduction), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("tau", [0.05, 1.0])
def test_gradcheck_reference(tau):
    sim, pos = rand_case(5, 6, seed=6, p_pos=0.4)
    sim = (sim * 3 * tau).requires_grad_(True)   # keep sigma' away from underflow
    for direction, reduction in [("both", "none"), ("both", "mean"), ("i2t", "sum"), ("t2i", "mean")]:
        f = lambda s: fastrank.smooth_ap_loss(s, pos, tau, direction, reduction, impl="reference")
        assert torch.autograd.gradcheck(f, (sim,), eps=1e-6 * tau, atol=1e-6, rtol=1e-4)


def test_gradient_only_through_list_items_and_positive_ranks():
    """A query's loss depends on its own row only; a negative ranked far below every
    positive gets (almost) no gradient."""
    sim = torch.tensor([[0.9, 0.8, 0.1, -5.0]], dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[True, False, True, False]])
    fastrank.smooth_ap_loss(sim, pos, 0.05, "i2t").backward()
    assert sim.grad[0, 3].abs().item() < 1e-30
    assert sim.grad[0, 1].item() > 0 and sim.grad[0, 2].item() < 0


# ---------------------------------------------------------------- masks (docs/spec.md §2.1a)
MASK_SHAPES = [(1, 1), (1, 6), (5, 1), (3, 5), (6, 4), (9, 9), (17, 11)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,m", MASK_SHAPES)
def test_mask_equals_deleting_entries(impl, n, m):
    for seed, ties in [(0, False), (1, True)]:
        sim, pos = rand_case(n, m, seed=100 + seed, ties=ties, p_pos=0.5)
        mask = rand_mask(n, m, seed, p=0.6)
        mask[0] = False                       # an empty row ...
        if m > 1:
            mask[:, -1] = False               # ... and an empty column
        for tau in (1e-3, 0.1):
            for direction in ("i2t", "t2i", "both"):
                for reduction in ("mean", "sum", "none"):
                    got = fastrank.smooth_ap_loss(sim, pos, tau, direction, reduction, impl=impl, mask=mask)
                    torch.testing.assert_close(got, expected(sim, pos, tau, direction, reduction, mask),
                                               rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_all_true_equals_no_mask(impl):
    sim, pos = rand_case(7, 9, seed=20)
    full = torch.ones(7, 9, dtype=torch.bool)
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("mean", "sum", "none"):
            outs = []
            for mask in (None, full):
                s = sim.clone().requires_grad_(True)
                loss = fastrank.smooth_ap_loss(s, pos, 0.05, direction, reduction, impl=impl, mask=mask)
                (g,) = torch.autograd.grad(loss.sum(), s)
                outs.append((loss, g))
            torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_gradcheck(impl):
    tau = 0.1
    sim, pos = rand_case(5, 6, seed=21, p_pos=0.5)
    sim = (sim * 3 * tau).requires_grad_(True)
    mask = rand_mask(5, 6, seed=22, p=0.6)
    mask[1] = False
    mask[:, 2] = False
    for direction, reduction in [("both", "none"), ("both", "mean"), ("i2t", "sum"), ("t2i", "mean")]:
        f = lambda s: fastrank.smooth_ap_loss(s, pos, tau, direction, reduction, impl=impl, mask=mask)
        assert torch.autograd.gradcheck(f, (sim,), eps=1e-6 * tau, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_empty_lists_and_masked_positives(impl):
    sim, _ = rand_case(5, 4, seed=23)
    pos = torch.eye(5, 4, dtype=torch.bool)
    mask = torch.ones(5, 4, dtype=torch.bool)
    mask[2] = False                           # an empty row
    mask[:, 1] = False                        # an empty column (its positive (1, 1) masked too)
    s = sim.clone().requires_grad_(True)
    per_q = fastrank.smooth_ap_loss(s, pos, 0.1, "both", "none", impl=impl, mask=mask)
    assert per_q[2] == 0 and per_q[1] == 0 and per_q[5 + 1] == 0 and per_q[4] == 0   # no positive in the list
    per_q.sum().backward()
    assert torch.all(s.grad[~mask] == 0)
    # "mean" over the lists with a positive in them: rows 0, 3 and columns 0, 3 (row 2 is
    # empty, (1, 1) is masked, row 4 has no positive; column 2's positive (2, 2) is masked)
    mean = fastrank.smooth_ap_loss(sim, pos, 0.1, "both", "mean", impl=impl, mask=mask)
    torch.testing.assert_close(mean, per_q[:5].sum() / 2 + per_q[5:].sum() / 2)
    # nothing valid at all: loss 0, gradient 0, for every reduction
    nothing = torch.zeros(5, 4, dtype=torch.bool)
    for reduction in ("mean", "sum", "none"):
        s = sim.clone().requires_grad_(True)
        loss = fastrank.smooth_ap_loss(s, pos, 0.1, "both", reduction, impl=impl, mask=nothing)
        loss.sum().backward()
        assert torch.all(loss == 0) and torch.all(s.grad == 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_ignores_masked_values(impl, monkeypatch):
    """Masked entries are never read: garbage (even NaN) there changes nothing, and the
    gradient there is exactly 0."""
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    sim, pos = rand_case(6, 7, seed=24, p_pos=0.4)
    mask = rand_mask(6, 7, seed=25, p=0.6)
    outs = []
    for fill in (0.0, 1e6, float("nan")):
        s = torch.where(mask, sim, torch.full_like(sim, fill)).requires_grad_(True)
        loss = fastrank.smooth_ap_loss(s, pos, 0.05, "both", "none", impl=impl, mask=mask)
        loss.sum().backward()
        assert torch.all(s.grad[~mask] == 0)
        outs.append((loss.detach(), s.grad))
    for loss, grad in outs[1:]:
        torch.testing.assert_close(loss, outs[0][0], rtol=0, atol=0)
        torch.testing.assert_close(grad, outs[0][1], rtol=0, atol=0)


# ---------------------------------------------------------------- the blocked smooth rank
@pytest.mark.parametrize("block", [1, 5, 30, 64, 1 << 22])
def test_smooth_ranks_blocks_equal_one_shot(block):
    """The reference forms (query, item, candidate) differences in blocks of at most
    ``block`` elements (rows, then items), under checkpoint: same values and gradients."""
    sim, pos = rand_case(7, 8, seed=26, p_pos=0.5)
    w = torch.rand(7, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    outs = []
    for b in (block, None):
        s = sim.clone().requires_grad_(True)
        if b is None:    # one (Q, C, C) tensor, written out
            d = (s.unsqueeze(1) - s.unsqueeze(2)) / 0.1
            off = ~torch.eye(8, dtype=torch.bool)
            sg = torch.sigmoid(d) * off
            r_all = 1 + sg.sum(2)
            r_pos = 1 + (sg * pos.unsqueeze(1)).sum(2)
        else:
            r_all, r_pos = smooth_ranks(s, (torch.ones_like(pos), pos), 0.1, block=b)
        (g,) = torch.autograd.grad((r_all * w).sum() + (r_pos * w * w).sum(), s)
        outs.append((r_all.detach(), r_pos.detach(), g))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def test_reference_per_query_keeps_dtype():
    sim, pos = rand_case(3, 4, seed=27, dtype=torch.float32)
    assert smooth_ap_per_query(sim, pos, 0.1).dtype == torch.float32


# ---------------------------------------------------------------- dtypes, module, specs
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_output_dtype_and_half_inputs(dtype):
    sim, pos = rand_case(6, 5, seed=28)
    s = sim.to(dtype).requires_grad_(True)
    loss = fastrank.smooth_ap_loss(s, pos, 0.1)
    loss.backward()
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert s.grad.dtype == dtype
    ref = fastrank.smooth_ap_loss(sim.to(dtype).double(), pos, 0.1)
    assert abs(loss.item() - ref.item()) < 1e-5


def test_module_form_and_combined_spec():
    sim, pos = rand_case(5, 5, seed=29)
    mod = fastrank.nn.SmoothAPLoss(tau=0.05, direction="t2i", reduction="sum")
    torch.testing.assert_close(mod(sim, pos), fastrank.smooth_ap_loss(sim, pos, 0.05, "t2i", "sum"))
    mask = rand_mask(5, 5, seed=30)
    torch.testing.assert_close(mod(sim, pos, mask=mask),
                               fastrank.smooth_ap_loss(sim, pos, 0.05, "t2i", "sum", mask=mask))
    assert "tau=0.05" in repr(mod)
    with pytest.raises(ValueError, match="tau"):
        fastrank.nn.SmoothAPLoss(tau=0)
    combined = fastrank.nn.CombinedLoss("smooth_ap:0.5,triplet", options={"smooth_ap": {"tau": 0.05}})
    total, parts = combined(sim, positives=pos)
    torch.testing.assert_close(parts["smooth_ap"], fastrank.smooth_ap_loss(sim, pos, 0.05))
    torch.testing.assert_close(total, 0.5 * parts["smooth_ap"] + parts["triplet"])


def test_impl_env_var(monkeypatch):
    sim, pos = rand_case(4, 4, seed=31)
    monkeypatch.setenv("FASTRANK_IMPL", "reference")
    torch.testing.assert_close(fastrank.smooth_ap_loss(sim, pos), fastrank.smooth_ap_loss(sim, pos, impl="reference"))
    monkeypatch.setenv("FASTRANK_IMPL", "bogus")
    with pytest.raises(ValueError, match="FASTRANK_IMPL"):
        fastrank.smooth_ap_loss(sim, pos)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(sim=[[1.0]]), TypeError, "sim"),
    (dict(sim=torch.ones(1, 2, dtype=torch.int64)), TypeError, "sim"),
    (dict(sim=torch.ones(2)), ValueError, "sim"),
    (dict(sim=torch.ones(0, 2)), ValueError, "sim"),
    (dict(sim=torch.tensor([[1.0, float("nan")]])), ValueError, "sim"),
    (dict(positives=torch.ones(1, 3, dtype=torch.bool)), ValueError, "positives"),
    (dict(positives=torch.ones(1, 2)), TypeError, "positives"),
    (dict(positives=[[True, False]]), TypeError, "positives"),
    (dict(sim=torch.ones(2, 3), positives=None), ValueError, "positives"),
    (dict(mask=torch.ones(1, 2)), TypeError, "mask"),
    (dict(mask=torch.ones(2, 2, dtype=torch.bool)), ValueError, "mask"),
    (dict(tau=0.0), ValueError, "tau"),
    (dict(tau=-1.0), ValueError, "tau"),
    (dict(tau=float("nan")), ValueError, "tau"),
    (dict(tau="0.1"), ValueError, "tau"),
    (dict(direction="x2y"), ValueError, "direction"),
    (dict(reduction="avg"), ValueError, "reduction"),
    (dict(impl="fast"), ValueError, "impl"),
])
def test_bad_input(kwargs, exc, match):
    args = dict(sim=torch.tensor([[0.1, 0.2]]), positives=torch.tensor([[True, False]]), tau=0.1)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        fastrank.smooth_ap_loss(**args)


# ---------------------------------------------------------------- native vs reference
def both_impls(sim, positives, tau, direction, reduction, mask=None, weight_seed=0, device="cpu"):
    """{impl: (loss, gradient)} of a weighted loss for impl native (on ``device``) and
    reference (CPU, float64)."""
    out = {}
    for impl, dev in (("native", device), ("reference", "cpu")):
        s = sim.detach().to(dev).clone().requires_grad_(True)
        loss = fastrank.smooth_ap_loss(s, positives.to(dev), tau, direction, reduction, impl=impl,
                                       mask=None if mask is None else mask.to(dev))
        w = torch.rand(loss.shape, dtype=loss.dtype, generator=torch.Generator().manual_seed(weight_seed))
        (g,) = torch.autograd.grad((loss * w.to(dev)).sum(), s)
        out[impl] = (loss.detach().cpu(), g.cpu())
    return out


NATIVE_CASES = [(0, False, 1.0, 0.01, None), (1, True, 1.0, 0.1, 0.5), (2, False, 30.0, 1e-3, 0.9),
                (3, True, 0.3, 1.0, 0.3)]


@needs_kernel
# (80, 90): enough pairs for the OpenMP threads, column queries in tiles of 16
@pytest.mark.parametrize("n,m", SHAPES + [(33, 70), (64, 31), (80, 90)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_native_matches_reference(n, m, dtype):
    tol = dict(rtol=1e-9, atol=1e-11) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-6)
    for seed, ties, scale, tau, p_mask in NATIVE_CASES:
        sim, pos = rand_case(n, m, seed, dtype, ties=ties, scale=scale, p_pos=0.3)
        mask = None if p_mask is None else rand_mask(n, m, seed + 50, p_mask)
        for direction in ("i2t", "t2i", "both"):
            for reduction in ("mean", "sum", "none"):
                r = both_impls(sim, pos, tau, direction, reduction, mask, weight_seed=seed)
                torch.testing.assert_close(r["native"][0], r["reference"][0].to(r["native"][0].dtype), **tol)
                torch.testing.assert_close(r["native"][1], r["reference"][1].to(r["native"][1].dtype), **tol)
                if mask is not None:
                    assert torch.all(r["native"][1][~mask] == 0)


@needs_kernel
def test_native_deterministic_and_default_diagonal():
    sim, _ = rand_case(40, 40, seed=33, dtype=torch.float32)
    a = both_impls(sim, torch.eye(40, dtype=torch.bool), 0.01, "both", "mean")["native"]
    b = both_impls(sim, torch.eye(40, dtype=torch.bool), 0.01, "both", "mean")["native"]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    torch.testing.assert_close(fastrank.smooth_ap_loss(sim, impl="native"), a[0])


@needs_cuda_kernel
@pytest.mark.cuda
@pytest.mark.parametrize("n,m", [(1, 1), (5, 3), (17, 40), (130, 70)])
def test_cuda_matches_reference(n, m):
    sim, pos = rand_case(n, m, seed=34)
    mask = rand_mask(n, m, seed=35, p=0.7)
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("mean", "none"):
            r = both_impls(sim, pos, 0.05, direction, reduction, mask, device="cuda")
            torch.testing.assert_close(r["native"][0], r["reference"][0], rtol=1e-9, atol=1e-11)
            torch.testing.assert_close(r["native"][1], r["reference"][1], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[needs_cuda_kernel, pytest.mark.cuda])])
def test_cuda_graph_capture_equals_eager(device):
    # on the CPU: the same step run eagerly twice (a wrong call fails without a GPU)
    sim, pos = rand_case(40, 56, seed=36, p_pos=0.2)
    sim, pos = sim.float().to(device), pos.to(device)
    _cuda_checks.assert_graph_replay_equals_eager(lambda s, p: fastrank.smooth_ap_loss(s, p, 0.05), sim, pos)


# ---- CUDA test matrix (marked cuda_matrix) -------------------------------------------------------
# smooth_ap's and recall_at_k's CUDA kernels (the smooth-rank engine's positive-row kernels:
# subset_forward_warps, version 2, or subset_forward_kernel, version 1 with
# fastrank.kernel_variant(version=1); subset_finalize, subset_backward_kernel) against the reference,
# with the checks of tests/_cuda_matrix.py: on a GPU, or emulated on the CPU by
# tests/test_emulated.py; deselected where neither can run (tests/conftest.py).
TAU = 0.05
KS, TAU_K = (1, 2, 5), (1.0, 0.5, 2.0)


def ap(impl):
    return lambda s, p, d, red, mk: fastrank.smooth_ap_loss(s, p, TAU, d, red, impl=impl, mask=mk)


def rk(impl):
    return lambda s, p, d, red, mk: fastrank.recall_at_k_loss(s, p, KS, TAU, TAU_K, d, red, impl=impl, mask=mk)


HEADS = {"smooth_ap": ap, "recall_at_k": rk}


def positives(n, m, seed, p=0.25):
    return torch.rand(n, m, generator=torch.Generator().manual_seed(seed + 99)) < p


# a warp a query (version 1: a block of 256 threads), 32 candidates a ballot: sizes around
# them (longer lists, and more than 256 positives a list: test_long_lists_and_many_positives)
MATRIX_SHAPES = [(1, 1), (1, 19), (19, 1), (33, 17)]


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("n,m", MATRIX_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, head, n, m, dtype):
    sim, _ = case(n, m, seed=n * 100 + m)
    pos = positives(n, m, seed=n + m)
    pos[0, 0] = True
    for direction in DIRECTIONS:
        check_loss(HEADS[head]("native"), HEADS[head]("reference"), sim, pos, direction, "none", dtype=dtype,
                   device=device)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_every_direction_and_reduction(device, head, reduction):
    sim, _ = case(13, 10, seed=3, ties=True)
    pos = positives(13, 10, seed=3, p=0.4)
    for direction in DIRECTIONS:
        check_loss(HEADS[head]("native"), HEADS[head]("reference"), sim, pos, direction, reduction,
                   dtype=torch.float64, device=device, schedules=SCHEDULES if reduction == "mean" else None)


@pytest.mark.cuda_matrix
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


@pytest.mark.cuda_matrix
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


@pytest.mark.cuda_matrix
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


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("grad_layout", ["expanded", "strided"])
def test_strided_grad_output(device, head, grad_layout):
    sim, _ = case(17, 20, seed=7)
    check_loss(HEADS[head]("native"), HEADS[head]("reference"), sim, positives(17, 20, seed=7), "both", "none",
               dtype=torch.float64, device=device, grad_layout=grad_layout)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_error_bound(device, head, dtype):
    sim, _ = case(24, 20, seed=8)
    kern, ref = low_precision_errors(HEADS[head]("native"), HEADS[head]("reference"), sim,
                                     positives(24, 20, seed=8, p=0.3), dtype, device)
    assert kern <= low_precision_bound(ref), (kern, ref)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_propagates(device, no_finite_check, head, bad):
    sim, _ = case(9, 11, seed=9)
    sim[2, 3] = bad
    check_nonfinite_propagates(HEADS[head]("native"), sim, positives(9, 11, seed=9), device)


@pytest.mark.cuda_matrix
@pytest.mark.skipif(not EMULATED, reason="the launch log is the emulator's")
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("version,forward", [("v2", "subset_forward_warps"), ("v1", "subset_forward_kernel")])
def test_launches_per_call(device, head, version, forward):
    with fastrank.kernel_variant(version=int(version[1:])):
        s = case(40, 30, seed=10)[0].requires_grad_(True)
        assert launches(lambda: HEADS[head]("native")(s, positives(40, 30, seed=10), "both", "mean", None).backward()) \
            == ["subset_transpose_kernel", forward, "subset_finalize", "subset_backward_kernel"]
        # i2t alone reads sim's rows in place: no transpose
        s.grad = None
        assert launches(lambda: HEADS[head]("native")(s, positives(40, 30, seed=10), "i2t", "mean", None).backward()) \
            == [forward, "subset_finalize", "subset_backward_kernel"]


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("head", list(HEADS))
def test_version_1_values_and_gradients(device, head):
    """The engine's version 1 forward stays in the build (the GPU run times both): still checked."""
    with fastrank.kernel_variant(version=1):
        sim, _ = case(33, 17, seed=11)
        pos = positives(33, 17, seed=11)
        mask = torch.rand(33, 17, generator=torch.Generator().manual_seed(11)) > 0.3
        for dtype in (torch.float64, torch.float32):
            check_loss(HEADS[head]("native"), HEADS[head]("reference"), sim, pos, "both", "mean", mask, dtype=dtype,
                       device=device)


@pytest.mark.cuda_matrix
@pytest.mark.skipif(not EMULATED, reason="calls the emulated module directly")
def test_kernel_error_reaches_python(device):
    """A refused call surfaces as a RuntimeError naming the kernel (a C++ exception through
    the bindings): more ks than the kernels take by value."""
    from fastrank import _native
    mod = _native.emulated_cuda()
    s, p = torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool)
    out, ws = torch.empty(()), torch.empty(20)
    with pytest.raises(RuntimeError, match="recall_at_k_forward"):
        mod.recall_at_k_forward(0, 2, 2, 3, 1, 2, s.data_ptr(), 2, 1, p.data_ptr(), 2, 1, 0, 0, 0, 0.1, 1,
                                out.data_ptr(), ws.data_ptr(), torch.empty(32).data_ptr(), [1.0] * 33, [1.0] * 33, 33,
                                0)
