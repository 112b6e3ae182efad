"""recall_at_k_loss (docs/spec.md §2.9): loop oracle, gradients, masks, ties, no positive, N = 1,
reductions, ks / tau_k forms, dtypes, bad input, and native vs reference (switched on
with the kernel)."""
import functools

import numpy as np
import pytest
import torch

import fastrank

import _cuda_checks
from _rank_oracles import oracle, rand_case, rand_mask, recall_at_k_query, sig

NATIVE_CPU = fastrank.backends()["cpu"]
CUDA = fastrank.backends()["cuda_available"]
KERNEL = NATIVE_CPU
needs_kernel = pytest.mark.skipif(not KERNEL, reason="native CPU module not built")
needs_cuda_kernel = pytest.mark.skipif(not CUDA, reason="no CUDA device")
IMPLS = ["reference"] + (["native"] if KERNEL else [])


def expected(sim, positives, ks, tau, tau_k, direction="both", reduction="mean", mask=None):
    ks = ks if isinstance(ks, tuple) else (ks,)
    tau_k = tau_k if isinstance(tau_k, tuple) else (tau_k,) * len(ks)
    fn = functools.partial(recall_at_k_query, tau=tau, ks=ks, tau_k=tau_k)
    return oracle(fn, sim, positives, direction, reduction, mask)


SHAPES = [(1, 1), (1, 2), (2, 1), (1, 7), (5, 1), (3, 5), (6, 4), (8, 8), (17, 9)]
# the last one is soft enough (tau_k = 8) that the smooth count often passes k and is clipped
HYPER = [((1, 2, 4, 8, 16), 0.01, 1.0), ((1, 3), 0.1, (0.5, 2.0)), (2, 1.0, 0.3), ((1, 2), 0.1, 8.0)]


# ---------------------------------------------------------------- the loop oracle
@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("direction", ["i2t", "t2i", "both"])
def test_reference_matches_loop_oracle(n, m, direction):
    sim, pos = rand_case(n, m, seed=n * 37 + m, ties=(n + m) % 2 == 0, p_pos=0.4)
    for ks, tau, tau_k in HYPER:
        for reduction in ("mean", "sum", "none"):
            got = fastrank.recall_at_k_loss(sim, pos, ks, tau, tau_k, direction, reduction, impl="reference")
            exp = expected(sim, pos, ks, tau, tau_k, direction, reduction)
            torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_default_positives_are_the_diagonal(n):
    sim, _ = rand_case(n, n, seed=n)
    eye = torch.eye(n, dtype=torch.bool)
    for reduction in ("mean", "none"):
        got = fastrank.recall_at_k_loss(sim, tau=0.1, reduction=reduction)
        torch.testing.assert_close(got, expected(sim, eye, (1, 2, 4, 8, 16), 0.1, 1.0, "both", reduction),
                                   rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got, fastrank.recall_at_k_loss(sim, eye, tau=0.1, reduction=reduction))


def test_known_values():
    # positives ranked 1st and 3rd of four, both temperatures -> 0: R@2 = 1/2, R@4 = 2/2
    sim = torch.tensor([[0.9, 0.5, 0.3, 0.1]], dtype=torch.float64)
    pos = torch.tensor([[True, False, True, False]])
    loss = fastrank.recall_at_k_loss(sim, pos, ks=(2, 4), tau=1e-4, tau_k=1e-3, direction="i2t")
    assert loss.item() == pytest.approx(1 - (0.5 + 1.0) / 2, abs=1e-12)
    # a positive ranked exactly k counts one half (sigma(0)): R@1 = 1/2 here
    loss = fastrank.recall_at_k_loss(sim, pos, ks=1, tau=1e-4, tau_k=1e-3, direction="i2t")
    assert loss.item() == pytest.approx(0.5, abs=1e-12)
    # min(k, |P|): one positive at rank 1 gives R@k = 1 for every k
    one = torch.tensor([[True, False, False, False]])
    assert fastrank.recall_at_k_loss(sim, one, ks=(2, 3, 16), tau=1e-4, tau_k=1e-3,
                                     direction="i2t").item() == pytest.approx(0.0, abs=1e-12)
    # the smooth count is clipped at k: ten positives on top, k = 2 and a soft step
    # (tau_k = 5) count sum_r sigma((2 - r) / 5) = 3.4 > 2, clipped to 2: R@2 = 2 / 2
    ten = torch.linspace(1.0, 0.0, 12, dtype=torch.float64).unsqueeze(0)
    top = torch.arange(12).unsqueeze(0) < 10
    assert sum(sig((2 - r) / 5) for r in range(1, 11)) > 3
    assert fastrank.recall_at_k_loss(ten, top, ks=2, tau=1e-4, tau_k=5.0,
                                     direction="i2t").item() == pytest.approx(0.0, abs=1e-12)
    # a finite temperature by hand: one positive s = 0.5 between 0.9 and 0.1
    sim = torch.tensor([[0.9, 0.5, 0.1]], dtype=torch.float64)
    pos = torch.tensor([[False, True, False]])
    r = 1 + sig(0.4 / 0.2) + sig(-0.4 / 0.2)
    loss = fastrank.recall_at_k_loss(sim, pos, ks=(1, 2), tau=0.2, tau_k=(0.5, 2.0), direction="i2t")
    assert loss.item() == pytest.approx(1 - (sig((1 - r) / 0.5) + sig((2 - r) / 2.0)) / 2, abs=1e-14)


def test_ties():
    """Equal scores: every rank is 1 + (n - 1)/2."""
    n, npos = 5, 2
    sim = torch.full((1, n), -0.2, dtype=torch.float64, requires_grad=True)
    pos = torch.zeros(1, n, dtype=torch.bool)
    pos[0, :npos] = True
    r = 1 + (n - 1) / 2
    loss = fastrank.recall_at_k_loss(sim, pos, ks=(1, 4), tau=0.05, tau_k=1.0, direction="i2t")
    r1 = min(1, npos * sig(1 - r)) / 1
    r4 = min(4, npos * sig(4 - r)) / 2
    assert loss.item() == pytest.approx(1 - (r1 + r4) / 2, abs=1e-14)
    loss.backward()
    assert torch.isfinite(sim.grad).all()
    assert (sim.grad[0, :npos] < 0).all() and (sim.grad[0, npos:] > 0).all()


def test_no_positive():
    sim, _ = rand_case(4, 6, seed=3)
    none = torch.zeros(4, 6, dtype=torch.bool)
    for reduction in ("mean", "sum", "none"):
        s = sim.clone().requires_grad_(True)
        loss = fastrank.recall_at_k_loss(s, none, tau=0.1, direction="both", reduction=reduction)
        loss.sum().backward()
        assert torch.all(loss == 0) and torch.all(s.grad == 0)
    pos = torch.zeros(4, 6, dtype=torch.bool)
    pos[1, 2] = pos[3, 2] = True
    per_q = fastrank.recall_at_k_loss(sim, pos, tau=0.1, reduction="none")
    mean = fastrank.recall_at_k_loss(sim, pos, tau=0.1, reduction="mean")
    torch.testing.assert_close(mean, per_q[:4].sum() / 2 + per_q[4:].sum() / 1)
    assert mean.item() > 0


def test_single_item_and_single_query():
    # N = M = 1: the positive is at rank 1; R@1 = sigma(0) = 1/2 (rank exactly k), R@k = 1 above
    s = torch.tensor([[0.7]], dtype=torch.float64, requires_grad=True)
    loss = fastrank.recall_at_k_loss(s, ks=(1, 2), tau=0.1, tau_k=1e-3)
    assert loss.item() == pytest.approx(2 * (1 - (0.5 + 1.0) / 2), abs=1e-12)
    loss.backward()
    assert s.grad.item() == 0.0      # a list of one item: the rank does not depend on its score
    sim, _ = rand_case(1, 9, seed=4)
    pos = torch.zeros(1, 9, dtype=torch.bool)
    pos[0, [2, 5]] = True
    for direction in ("i2t", "t2i", "both"):
        got = fastrank.recall_at_k_loss(sim, pos, (1, 4), 0.05, 1.0, direction, "none")
        torch.testing.assert_close(got, expected(sim, pos, (1, 4), 0.05, 1.0, direction, "none"),
                                   rtol=1e-10, atol=1e-12)


def test_rectangular_with_several_positives_per_query():
    n, per = 4, 5
    sim, _ = rand_case(n, n * per, seed=5)
    pos = torch.arange(n * per).div(per, rounding_mode="floor").unsqueeze(0) == torch.arange(n).unsqueeze(1)
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("mean", "sum", "none"):
            got = fastrank.recall_at_k_loss(sim, pos, (1, 2, 4, 8), 0.02, (1.0, 2.0, 4.0, 8.0), direction, reduction)
            exp = expected(sim, pos, (1, 2, 4, 8), 0.02, (1.0, 2.0, 4.0, 8.0), direction, reduction)
            torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-12)


def test_ks_and_tau_k_forms():
    sim, pos = rand_case(5, 6, seed=6, p_pos=0.4)
    base = fastrank.recall_at_k_loss(sim, pos, (1, 2), 0.1, (1.0, 1.0))
    for ks, tau_k in [([1, 2], 1.0), ((np.int64(1), 2), [1, 1]), ((torch.tensor(1), 2), 1)]:
        torch.testing.assert_close(fastrank.recall_at_k_loss(sim, pos, ks, 0.1, tau_k), base)
    torch.testing.assert_close(fastrank.recall_at_k_loss(sim, pos, 4, 0.1),
                               fastrank.recall_at_k_loss(sim, pos, (4,), 0.1, (1.0,)))
    # k beyond the list: every positive counts (up to the smooth step)
    assert fastrank.recall_at_k_loss(sim, pos, 1000, 0.1, 1.0).item() == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("tau", [0.05, 1.0])
def test_gradcheck_reference(tau):
    sim, pos = rand_case(5, 6, seed=7, p_pos=0.4)
    sim = (sim * 3 * tau).requires_grad_(True)
    for direction, reduction in [("both", "none"), ("both", "mean"), ("i2t", "sum"), ("t2i", "mean")]:
        f = lambda s: fastrank.recall_at_k_loss(s, pos, (1, 2, 4), tau, (0.5, 1.0, 2.0), direction, reduction,
                                                impl="reference")
        assert torch.autograd.gradcheck(f, (sim,), eps=1e-6 * tau, atol=1e-6, rtol=1e-4)


# ---------------------------------------------------------------- masks (docs/spec.md §2.1a)
MASK_SHAPES = [(1, 1), (1, 6), (5, 1), (3, 5), (6, 4), (9, 9), (17, 11)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,m", MASK_SHAPES)
def test_mask_equals_deleting_entries(impl, n, m):
    for seed, ties in [(0, False), (1, True)]:
        sim, pos = rand_case(n, m, seed=100 + seed, ties=ties, p_pos=0.5)
        mask = rand_mask(n, m, seed, p=0.6)
        mask[0] = False
        if m > 1:
            mask[:, -1] = False
        for ks, tau, tau_k in HYPER[1:]:
            for direction in ("i2t", "t2i", "both"):
                for reduction in ("mean", "sum", "none"):
                    got = fastrank.recall_at_k_loss(sim, pos, ks, tau, tau_k, direction, reduction, impl=impl,
                                                    mask=mask)
                    exp = expected(sim, pos, ks, tau, tau_k, direction, reduction, mask)
                    torch.testing.assert_close(got, exp, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_all_true_equals_no_mask(impl):
    sim, pos = rand_case(7, 9, seed=20)
    full = torch.ones(7, 9, dtype=torch.bool)
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("mean", "sum", "none"):
            outs = []
            for mask in (None, full):
                s = sim.clone().requires_grad_(True)
                loss = fastrank.recall_at_k_loss(s, pos, (1, 4), 0.05, 1.0, direction, reduction, impl=impl,
                                                 mask=mask)
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
        f = lambda s: fastrank.recall_at_k_loss(s, pos, (1, 2), tau, (0.7, 1.5), direction, reduction, impl=impl,
                                                mask=mask)
        assert torch.autograd.gradcheck(f, (sim,), eps=1e-6 * tau, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_empty_lists_and_ignored_values(impl, monkeypatch):
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    sim, pos = rand_case(6, 7, seed=23, p_pos=0.4)
    mask = rand_mask(6, 7, seed=24, p=0.6)
    mask[2] = False
    mask[:, 1] = False
    outs = []
    for fill in (0.0, 1e6, float("nan")):
        s = torch.where(mask, sim, torch.full_like(sim, fill)).requires_grad_(True)
        loss = fastrank.recall_at_k_loss(s, pos, (1, 3), 0.05, 1.0, "both", "none", impl=impl, mask=mask)
        loss.sum().backward()
        assert loss[2] == 0 and loss[6 + 1] == 0
        assert torch.all(s.grad[~mask] == 0)
        outs.append((loss.detach(), s.grad))
    for loss, grad in outs[1:]:
        torch.testing.assert_close(loss, outs[0][0], rtol=0, atol=0)
        torch.testing.assert_close(grad, outs[0][1], rtol=0, atol=0)
    nothing = torch.zeros(6, 7, dtype=torch.bool)
    for reduction in ("mean", "sum", "none"):
        s = sim.clone().requires_grad_(True)
        loss = fastrank.recall_at_k_loss(s, pos, 2, 0.1, 1.0, "both", reduction, impl=impl, mask=nothing)
        loss.sum().backward()
        assert torch.all(loss == 0) and torch.all(s.grad == 0)


# ---------------------------------------------------------------- dtypes, module, specs
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_output_dtype_and_half_inputs(dtype):
    sim, pos = rand_case(6, 5, seed=28)
    s = sim.to(dtype).requires_grad_(True)
    loss = fastrank.recall_at_k_loss(s, pos, tau=0.1)
    loss.backward()
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert s.grad.dtype == dtype
    ref = fastrank.recall_at_k_loss(sim.to(dtype).double(), pos, tau=0.1)
    assert abs(loss.item() - ref.item()) < 1e-5


def test_module_form_and_combined_spec():
    sim, pos = rand_case(5, 5, seed=29)
    mod = fastrank.nn.RecallAtKLoss(ks=(1, 2), tau=0.05, tau_k=(1.0, 2.0), direction="t2i", reduction="sum")
    torch.testing.assert_close(mod(sim, pos), fastrank.recall_at_k_loss(sim, pos, (1, 2), 0.05, (1.0, 2.0), "t2i",
                                                                        "sum"))
    mask = rand_mask(5, 5, seed=30)
    torch.testing.assert_close(mod(sim, pos, mask=mask), fastrank.recall_at_k_loss(
        sim, pos, (1, 2), 0.05, (1.0, 2.0), "t2i", "sum", mask=mask))
    assert "ks=(1, 2)" in repr(mod) and "tau_k=(1.0, 2.0)" in repr(mod)
    assert fastrank.nn.RecallAtKLoss(ks=4, tau_k=2).tau_k == (2.0,)
    with pytest.raises(ValueError, match="tau_k"):
        fastrank.nn.RecallAtKLoss(ks=(1, 2), tau_k=(1.0,))
    combined = fastrank.nn.CombinedLoss("recall_at_k:2,smooth_ap:1", options={"recall_at_k": {"ks": (1, 2)}})
    total, parts = combined(sim, positives=pos)
    torch.testing.assert_close(parts["recall_at_k"], fastrank.recall_at_k_loss(sim, pos, (1, 2)))
    torch.testing.assert_close(total, 2 * parts["recall_at_k"] + parts["smooth_ap"])


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(sim=[[1.0]]), TypeError, "sim"),
    (dict(sim=torch.ones(1, 2, dtype=torch.int64)), TypeError, "sim"),
    (dict(sim=torch.ones(2)), ValueError, "sim"),
    (dict(sim=torch.tensor([[1.0, float("inf")]])), ValueError, "sim"),
    (dict(positives=torch.ones(2, 2, dtype=torch.bool)), ValueError, "positives"),
    (dict(positives=torch.ones(1, 2, dtype=torch.int64)), TypeError, "positives"),
    (dict(sim=torch.ones(2, 3), positives=None), ValueError, "positives"),
    (dict(mask=torch.ones(1, 2, dtype=torch.uint8)), TypeError, "mask"),
    (dict(ks=()), ValueError, "ks"),
    (dict(ks=[]), ValueError, "ks"),
    (dict(ks=0), ValueError, "ks"),
    (dict(ks=(1, -2)), ValueError, "ks"),
    (dict(ks=(1, 2.0)), ValueError, "ks"),
    (dict(ks=1.5), ValueError, "ks"),
    (dict(ks=True), ValueError, "ks"),
    (dict(ks="4"), ValueError, "ks"),
    (dict(ks=None), ValueError, "ks"),
    (dict(tau=0.0), ValueError, "tau"),
    (dict(tau=-0.1), ValueError, "tau"),
    (dict(tau_k=0.0), ValueError, "tau_k"),
    (dict(tau_k=(1.0, 2.0)), ValueError, "tau_k"),
    (dict(ks=(1, 2), tau_k=(1.0, -1.0)), ValueError, r"tau_k\[1\]"),
    (dict(ks=(1, 2), tau_k=(1.0, 2.0, 3.0)), ValueError, "tau_k"),
    (dict(tau_k=float("nan")), ValueError, "tau_k"),
    (dict(direction="x2y"), ValueError, "direction"),
    (dict(reduction="avg"), ValueError, "reduction"),
    (dict(impl="fast"), ValueError, "impl"),
])
def test_bad_input(kwargs, exc, match):
    args = dict(sim=torch.tensor([[0.1, 0.2]]), positives=torch.tensor([[True, False]]), ks=(1,), tau=0.1)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        fastrank.recall_at_k_loss(**args)


# ---------------------------------------------------------------- native vs reference
def both_impls(sim, positives, ks, tau, tau_k, direction, reduction, mask=None, weight_seed=0, device="cpu"):
    """{impl: (loss, gradient)} of a weighted loss for impl native (on ``device``) and reference."""
    out = {}
    for impl, dev in (("native", device), ("reference", "cpu")):
        s = sim.detach().to(dev).clone().requires_grad_(True)
        loss = fastrank.recall_at_k_loss(s, positives.to(dev), ks, tau, tau_k, direction, reduction, impl=impl,
                                         mask=None if mask is None else mask.to(dev))
        w = torch.rand(loss.shape, dtype=loss.dtype, generator=torch.Generator().manual_seed(weight_seed))
        (g,) = torch.autograd.grad((loss * w.to(dev)).sum(), s)
        out[impl] = (loss.detach().cpu(), g.cpu())
    return out


NATIVE_CASES = [(0, False, 1.0, 0.01, None, (1, 2, 4, 8, 16), 1.0),
                (1, True, 1.0, 0.1, 0.5, (1, 3), (0.5, 2.0)),
                (2, False, 30.0, 1e-3, 0.9, 2, 0.3),
                (3, True, 0.3, 1.0, 0.3, (1, 100), (1.0, 4.0))]


@needs_kernel
# (80, 90): enough pairs for the OpenMP threads, column queries in tiles of 16
@pytest.mark.parametrize("n,m", SHAPES + [(33, 70), (64, 31), (80, 90)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_native_matches_reference(n, m, dtype):
    tol = dict(rtol=1e-9, atol=1e-11) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-6)
    for seed, ties, scale, tau, p_mask, ks, tau_k in NATIVE_CASES:
        sim, pos = rand_case(n, m, seed, dtype, ties=ties, scale=scale, p_pos=0.3)
        mask = None if p_mask is None else rand_mask(n, m, seed + 50, p_mask)
        for direction in ("i2t", "t2i", "both"):
            for reduction in ("mean", "sum", "none"):
                r = both_impls(sim, pos, ks, tau, tau_k, direction, reduction, mask, weight_seed=seed)
                torch.testing.assert_close(r["native"][0], r["reference"][0].to(r["native"][0].dtype), **tol)
                torch.testing.assert_close(r["native"][1], r["reference"][1].to(r["native"][1].dtype), **tol)
                if mask is not None:
                    assert torch.all(r["native"][1][~mask] == 0)


@needs_kernel
def test_native_deterministic_and_default_diagonal():
    sim, _ = rand_case(40, 40, seed=33, dtype=torch.float32)
    eye = torch.eye(40, dtype=torch.bool)
    a = both_impls(sim, eye, (1, 4), 0.01, 1.0, "both", "mean")["native"]
    b = both_impls(sim, eye, (1, 4), 0.01, 1.0, "both", "mean")["native"]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    torch.testing.assert_close(fastrank.recall_at_k_loss(sim, ks=(1, 4), impl="native"), a[0])


@needs_cuda_kernel
@pytest.mark.cuda
@pytest.mark.parametrize("n,m", [(1, 1), (5, 3), (17, 40), (130, 70)])
def test_cuda_matches_reference(n, m):
    sim, pos = rand_case(n, m, seed=34)
    mask = rand_mask(n, m, seed=35, p=0.7)
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("mean", "none"):
            r = both_impls(sim, pos, (1, 2, 4), 0.05, (1.0, 2.0, 4.0), direction, reduction, mask, device="cuda")
            torch.testing.assert_close(r["native"][0], r["reference"][0], rtol=1e-9, atol=1e-11)
            torch.testing.assert_close(r["native"][1], r["reference"][1], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[needs_cuda_kernel, pytest.mark.cuda])])
def test_cuda_graph_capture_equals_eager(device):
    # on the CPU: the same step run eagerly twice (a wrong call fails without a GPU)
    sim, pos = rand_case(40, 56, seed=36, p_pos=0.2)
    sim, pos = sim.float().to(device), pos.to(device)
    _cuda_checks.assert_graph_replay_equals_eager(lambda s, p: fastrank.recall_at_k_loss(s, p, tau=0.05), sim, pos)
