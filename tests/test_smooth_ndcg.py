"""smooth_ndcg_loss: loop oracle, native vs reference, gradients, compile, bad input, the CUDA test matrix."""
import math

import numpy as np
import pytest
import torch

import _cuda_checks
import fastrank
from _cuda_matrix import (DIRECTIONS, EMULATED, REDUCTIONS, SCHEDULES, GradedLossCases, SparseRelevanceCases, case,
                          check_loss, dry_run_launches, each_schedule, launches)
from fastrank._native import variant_codes
from fastrank._tolerance import low_precision_bound
from fastrank.ops.smooth_ndcg import smooth_ndcg_backward_op, smooth_ndcg_op
from fastrank.reference.smooth_ndcg import smooth_ndcg_per_query

V = variant_codes()  # the kernel variant's fields of a direct op call (version, pair pass)

NATIVE_CPU = fastrank.backends()["cpu"]
CUDA = fastrank.backends()["cuda_available"]
needs_native = pytest.mark.skipif(not NATIVE_CPU, reason="native CPU module not built")
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")


# ---------------------------------------------------------------- slow loop oracle
def oracle_query(s, r, tau):
    """docs/spec.md §2.1 for one query, with Python floats and loops."""
    n = len(s)
    sig = lambda x: 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    pi = [1.0 + sum(sig((s[k] - s[j]) / tau) for k in range(n) if k != j) for j in range(n)]
    g = [2.0 ** rj - 1.0 for rj in r]
    dcg = sum(g[j] / math.log2(1.0 + pi[j]) for j in range(n))
    ideal = sum(gj / math.log2(1.0 + p) for p, gj in enumerate(sorted(g, reverse=True), start=1))
    return 0.0 if ideal <= 0 else 1.0 - dcg / ideal


def oracle(sim, rel, tau, direction="both", reduction="mean"):
    S, R = sim.tolist(), rel.tolist()
    parts = []
    if direction in ("i2t", "both"):
        parts.append([oracle_query(S[i], R[i], tau) for i in range(len(S))])
    if direction in ("t2i", "both"):
        cols = list(zip(*S)), list(zip(*R))
        parts.append([oracle_query(list(c), list(rc), tau) for c, rc in zip(*cols)])
    if reduction == "none":
        return torch.tensor([x for p in parts for x in p], dtype=torch.float64)
    if reduction == "sum":
        return torch.tensor(sum(sum(p) for p in parts), dtype=torch.float64)
    return torch.tensor(sum(sum(p) / len(p) for p in parts), dtype=torch.float64)


def rand_case(n, m, seed, dtype=torch.float64, ties=False, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    sim = torch.randn(n, m, generator=g, dtype=torch.float64) * scale
    rel = torch.rand(n, m, generator=g, dtype=torch.float64)
    if ties:
        sim = (sim * 2).round() / 2
        rel = (rel * 3).round() / 3
    return sim.to(dtype), rel.to(dtype)


SHAPES = [(1, 1), (1, 2), (2, 1), (1, 7), (5, 1), (3, 5), (6, 4), (8, 8), (17, 9)]


@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("direction", ["i2t", "t2i", "both"])
def test_reference_matches_loop_oracle(n, m, direction):
    sim, rel = rand_case(n, m, seed=n * 31 + m, ties=(n + m) % 2 == 0)
    for tau in (1e-3, 0.05, 1.0):
        for reduction in ("mean", "sum", "none"):
            got = fastrank.smooth_ndcg_loss(sim, rel, tau, direction, reduction, impl="reference")
            torch.testing.assert_close(got, oracle(sim, rel, tau, direction, reduction), rtol=1e-10, atol=1e-12)


def test_known_values():
    # perfect order with a huge margin: smooth NDCG = NDCG = 1 -> loss 0
    sim = torch.tensor([[3.0, 2.0, 1.0]], dtype=torch.float64)
    rel = torch.tensor([[1.0, 0.5, 0.0]], dtype=torch.float64)
    loss = fastrank.smooth_ndcg_loss(sim, rel, tau=1e-3, direction="i2t", impl="reference")
    assert loss.item() == pytest.approx(0.0, abs=1e-12)
    # reversed order: DCG uses ranks 3,2,1 -> loss = 1 - DCG/IDCG
    sim_rev = sim.flip(1)
    loss = fastrank.smooth_ndcg_loss(sim_rev, rel, tau=1e-3, direction="i2t", impl="reference")
    g = [1.0, 2 ** 0.5 - 1, 0.0]
    dcg = g[0] / math.log2(4) + g[1] / math.log2(3)
    idcg = g[0] / math.log2(2) + g[1] / math.log2(3)
    assert loss.item() == pytest.approx(1 - dcg / idcg, abs=1e-12)
    # all-zero relevance: loss 0 and zero gradient
    s = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    loss = fastrank.smooth_ndcg_loss(s, torch.zeros(4, 4, dtype=torch.float64))
    loss.backward()
    assert loss.item() == 0.0 and torch.all(s.grad == 0)


# ---------------------------------------------------------------- native vs reference
def both_impls(sim, rel, tau, direction, reduction, weight=None):
    out = {}
    for impl in ("native", "reference"):
        s = sim.detach().clone().requires_grad_(True)
        loss = fastrank.smooth_ndcg_loss(s, rel, tau, direction, reduction, impl=impl)
        w = torch.ones_like(loss) if weight is None else weight
        (g,) = torch.autograd.grad((loss * w).sum(), s)
        out[impl] = (loss.detach(), g)
    return out


@needs_native
@pytest.mark.parametrize("n,m", SHAPES + [(33, 70), (64, 31)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_native_matches_reference(n, m, dtype):
    tol = dict(rtol=1e-9, atol=1e-11) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-6)
    for seed, ties, scale, tau in [(0, False, 1.0, 0.01), (1, True, 1.0, 0.1), (2, False, 30.0, 1e-3),
                                   (3, True, 0.3, 1.0)]:
        sim, rel = rand_case(n, m, seed, dtype, ties=ties, scale=scale)
        for direction in ("i2t", "t2i", "both"):
            w = torch.rand(n * (direction in ("i2t", "both")) + m * (direction in ("t2i", "both")),
                           dtype=dtype, generator=torch.Generator().manual_seed(seed))
            r = both_impls(sim, rel, tau, direction, "none", weight=w)
            torch.testing.assert_close(r["native"][0], r["reference"][0], **tol)
            torch.testing.assert_close(r["native"][1], r["reference"][1], **tol)


@needs_native
@pytest.mark.parametrize("n,m", [(3, 511), (2, 512), (2, 513), (700, 2)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_native_matches_reference_long_lists_with_ties(n, m, dtype):
    """The CPU kernel's IDCG counts each gain's position up to 512 items and sorts above:
    both sides of the switch, with heavy ties (4 relevance levels) and a list of ties only."""
    tol = dict(rtol=1e-9, atol=1e-11) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-6)
    sim, rel = rand_case(n, m, seed=5, dtype=dtype, ties=True)
    rel[0] = 0.5  # one list whose gains all tie
    r = both_impls(sim, rel, 0.05, "both", "none")
    torch.testing.assert_close(r["native"][0], r["reference"][0], **tol)
    torch.testing.assert_close(r["native"][1], r["reference"][1], **tol)


@needs_native
def test_native_reductions_and_zero_rows():
    sim, rel = rand_case(7, 5, seed=4)
    rel[2] = 0.0          # an all-zero i2t query
    rel[:, 3] = 0.0       # an all-zero t2i query
    for reduction in ("mean", "sum", "none"):
        r = both_impls(sim, rel, 0.05, "both", reduction)
        torch.testing.assert_close(r["native"][0], r["reference"][0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(r["native"][1], r["reference"][1], rtol=1e-10, atol=1e-12)
    per_q = fastrank.smooth_ndcg_loss(sim, rel, 0.05, "both", "none", impl="native")
    assert per_q[2] == 0 and per_q[7 + 3] == 0


@needs_native
def test_native_noncontiguous_and_relevance_dtype():
    base, rel = rand_case(12, 20, seed=5)
    sim = base[::2, ::2]                              # non-contiguous view (6, 10)
    rel = rel[::2, ::2].float()                       # other dtype
    r = both_impls(sim, rel, 0.1, "both", "mean")
    torch.testing.assert_close(r["native"][0], r["reference"][0], rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(r["native"][1], r["reference"][1], rtol=1e-7, atol=1e-9)


@needs_native
@pytest.mark.parametrize("tau", [1e-3, 0.05, 1.0])
def test_gradcheck_native(tau):
    sim, rel = rand_case(5, 4, seed=6)
    sim = sim * (3 * tau)  # keep sigma' away from underflow so finite differences see it
    sim.requires_grad_(True)
    f = lambda s: fastrank.smooth_ndcg_loss(s, rel, tau, "both", "none", impl="native")
    assert torch.autograd.gradcheck(f, (sim,), eps=1e-6 * tau, atol=1e-6, rtol=1e-4)


@needs_native
def test_deterministic():
    sim, rel = rand_case(40, 50, seed=7, dtype=torch.float32)
    a = both_impls(sim, rel, 0.01, "both", "mean")["native"]
    b = both_impls(sim, rel, 0.01, "both", "mean")["native"]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@needs_native
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_cpu(dtype):
    sim, rel = rand_case(16, 12, seed=8)
    s = sim.to(dtype).requires_grad_(True)
    loss = fastrank.smooth_ndcg_loss(s, rel, 0.1, impl="native")
    loss.backward()
    assert loss.dtype == torch.float32 and s.grad.dtype == dtype
    ref = fastrank.smooth_ndcg_loss(s.detach().double(), rel, 0.1, impl="reference")
    assert abs(loss.item() - ref.item()) < 1e-5


@needs_native
@pytest.mark.parametrize("direction,reduction", [(3, 1), (1, 0), (2, 2), (3, 0)])
def test_opcheck(direction, reduction):
    sim, rel = rand_case(6, 5, seed=9)
    sim.requires_grad_(True)
    torch.library.opcheck(smooth_ndcg_op, (sim, rel, None, [], 0.1, direction, reduction, *V))
    loss, ws = smooth_ndcg_op(sim.detach(), rel, None, [], 0.1, direction, reduction, *V)
    g = torch.rand(loss.shape, dtype=torch.float64)
    torch.library.opcheck(smooth_ndcg_backward_op, (g, sim.detach(), None, ws, 0.1, direction, reduction, V[0]))
    # transposed view as input, and a mask
    mask = torch.rand(6, 5, generator=torch.Generator().manual_seed(1)) < 0.7
    torch.library.opcheck(smooth_ndcg_op, (sim.detach().t(), rel.t(), mask.t(), [], 0.1, direction, reduction, *V))
    torch.library.opcheck(smooth_ndcg_op, (sim, rel, mask, [], 0.1, direction, reduction, *V))
    # relevance as lists (a TopKRelevance: its rows and columns)
    from fastrank.ops._launch import relevance_lists
    lists = relevance_lists(fastrank.TopKRelevance.from_dense(rel, 3), "both")
    torch.library.opcheck(smooth_ndcg_op, (sim, None, mask, lists, 0.1, direction, reduction, *V))


@needs_native
def test_torch_compile_fullgraph():
    sim, rel = rand_case(9, 7, seed=10, dtype=torch.float32)

    def step(s, r):
        return fastrank.smooth_ndcg_loss(s, r, tau=0.05) * 2.0

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    s1 = sim.clone().requires_grad_(True)
    s2 = sim.clone().requires_grad_(True)
    l1, l2 = compiled(s1, rel), step(s2, rel)
    l1.backward()
    l2.backward()
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(s1.grad, s2.grad)


def test_module_form():
    sim, rel = rand_case(5, 5, seed=11)
    mod = fastrank.nn.SmoothNDCGLoss(tau=0.05, direction="t2i", reduction="sum")
    torch.testing.assert_close(mod(sim, rel), fastrank.smooth_ndcg_loss(sim, rel, 0.05, "t2i", "sum"))
    assert "tau=0.05" in repr(mod)
    with pytest.raises(ValueError, match="tau"):
        fastrank.nn.SmoothNDCGLoss(tau=0)


def test_impl_env_var(monkeypatch):
    sim, rel = rand_case(4, 4, seed=12)
    monkeypatch.setenv("FASTRANK_IMPL", "reference")
    assert fastrank.smooth_ndcg_loss(sim, rel).item() == pytest.approx(
        fastrank.smooth_ndcg_loss(sim, rel, impl="reference").item())
    monkeypatch.setenv("FASTRANK_IMPL", "bogus")
    with pytest.raises(ValueError, match="FASTRANK_IMPL"):
        fastrank.smooth_ndcg_loss(sim, rel)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(sim=[[1.0]]), TypeError, "sim"),
    (dict(sim=torch.ones(3, dtype=torch.int64).view(1, 3)), TypeError, "sim"),
    (dict(sim=torch.ones(3)), ValueError, "sim"),
    (dict(sim=torch.ones(0, 3)), ValueError, "sim"),
    (dict(sim=torch.tensor([[1.0, float("nan")]])), ValueError, "sim"),
    (dict(sim=torch.tensor([[1.0, float("inf")]])), ValueError, "sim"),
    (dict(relevance=torch.ones(2, 3)), ValueError, "relevance"),
    (dict(relevance=torch.tensor([[0.5, float("nan")]])), ValueError, "relevance"),
    (dict(relevance=torch.ones(1, 2, dtype=torch.int32)), TypeError, "relevance"),
    (dict(tau=0.0), ValueError, "tau"),
    (dict(tau=-1.0), ValueError, "tau"),
    (dict(tau=float("nan")), ValueError, "tau"),
    (dict(tau="0.1"), ValueError, "tau"),
    (dict(direction="x2y"), ValueError, "direction"),
    (dict(reduction="avg"), ValueError, "reduction"),
    (dict(impl="fast"), ValueError, "impl"),
])
def test_bad_input(kwargs, exc, match):
    args = dict(sim=torch.tensor([[0.1, 0.2]]), relevance=torch.tensor([[1.0, 0.0]]), tau=0.1)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        fastrank.smooth_ndcg_loss(**args)


def test_device_mismatch():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to build a mismatch")
    with pytest.raises(ValueError, match="relevance"):
        fastrank.smooth_ndcg_loss(torch.rand(2, 2, device="cuda"), torch.rand(2, 2))


# docs/spec.md §1: structure first (types, shapes, devices, hyper-parameters), then the values in one
# pass per tensor; relevance must be >= 0; hyper-parameters are any real number.
BOTH_IMPLS = ["reference"] + (["native"] if NATIVE_CPU else [])

@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_structure_is_checked_before_values(impl):
    """A relevance on another device (meta: any machine has it) is reported as such, even
    when sim holds a NaN: the value check never runs on mismatched input."""
    sim = torch.tensor([[0.1, float("nan")]])
    with pytest.raises(ValueError, match="relevance is on meta but sim is on cpu"):
        fastrank.smooth_ndcg_loss(sim, torch.empty(1, 2, device="meta"), impl=impl)
    with pytest.raises(ValueError, match="mask is on meta"):
        fastrank.smooth_ndcg_loss(sim, torch.rand(1, 2), mask=torch.ones(1, 2, dtype=torch.bool, device="meta"),
                                  impl=impl)
    with pytest.raises(ValueError, match="relevance must have the same shape"):
        fastrank.smooth_ndcg_loss(sim, torch.tensor([[float("nan")]]), impl=impl)
    with pytest.raises(ValueError, match="tau"):          # a bad hyper-parameter before a NaN in the data
        fastrank.smooth_ndcg_loss(sim, torch.rand(1, 2), tau=-1.0, impl=impl)


@pytest.mark.parametrize("impl", BOTH_IMPLS)
def test_negative_relevance_is_rejected(impl):
    """Raw cosine similarity in [-1, 1] instead of (1 + cos) / 2: gains 2^r - 1 < 0 would give
    losses above 1 and 0 for an all-negative row; it is bad input (docs/spec.md §1)."""
    sim, rel = rand_case(4, 5, seed=50)
    cos = rel * 2 - 1                                    # in [-1, 1], some negative
    assert float(cos.min()) < 0
    with pytest.raises(ValueError, match=r"relevance must be >= 0 for smooth_ndcg_loss.*minimum of -"):
        fastrank.smooth_ndcg_loss(sim, cos, impl=impl)
    with pytest.raises(ValueError, match="relevance must be >= 0"):
        fastrank.nn.SmoothNDCGLoss()(sim, cos)
    # masked entries are read too (the NaN check's convention: one pass, the mask is not read)
    mask = torch.ones(4, 5, dtype=torch.bool)
    bad = rel.clone()
    bad[1, 2], mask[1, 2] = -0.5, False
    with pytest.raises(ValueError, match="relevance must be >= 0"):
        fastrank.smooth_ndcg_loss(sim, bad, impl=impl, mask=mask)
    # relevance 0 (the bottom of the range) is fine, and so is the mapped cosine
    fastrank.smooth_ndcg_loss(sim, torch.zeros_like(rel), impl=impl)
    fastrank.smooth_ndcg_loss(sim, (1 + cos) / 2, impl=impl)


@pytest.mark.parametrize("impl", BOTH_IMPLS)
def test_range_check_follows_the_value_switch(impl, monkeypatch):
    """The range check is the finite check's pass: off with FASTRANK_CHECK_FINITE=0 (or
    set_check_finite(False)), like the NaN check."""
    sim, rel = rand_case(3, 3, seed=51)
    cos = rel * 2 - 1
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    assert torch.isfinite(fastrank.smooth_ndcg_loss(sim, cos, impl=impl))
    monkeypatch.delenv("FASTRANK_CHECK_FINITE")
    from fastrank import _validation as V
    V.set_check_finite(False)
    try:
        fastrank.smooth_ndcg_loss(sim, cos, impl=impl)
    finally:
        V.set_check_finite(None)
    with pytest.raises(ValueError, match="relevance must be >= 0"):
        fastrank.smooth_ndcg_loss(sim, cos, impl=impl)


@pytest.mark.parametrize("tau", [np.float32(0.05), np.float64(0.05), torch.tensor(0.05),
                                 torch.tensor(0.05, dtype=torch.float64), np.array(0.05), 0.05])
def test_tau_accepts_any_real_number(tau):
    sim, rel = rand_case(4, 4, seed=52)
    want = fastrank.smooth_ndcg_loss(sim, rel, tau=float(tau))
    torch.testing.assert_close(fastrank.smooth_ndcg_loss(sim, rel, tau=tau), want)
    torch.testing.assert_close(fastrank.nn.SmoothNDCGLoss(tau=tau)(sim, rel), want)


@pytest.mark.parametrize("tau,kind", [
    (torch.tensor(0.0), "0-d torch.float32 tensor"),
    (torch.tensor(-0.01), "0-d torch.float32 tensor"),
    (np.float32(-1.0), "numpy.float32"),
    (torch.tensor([0.01, 0.02]), "tensor of shape (2,)"),
    (torch.tensor(0.01 + 0j), "complex64"),
    (True, "bool"),
    ("0.01", "str"),
    (None, "NoneType"),
])
def test_bad_tau_names_argument_and_type(tau, kind):
    sim, rel = rand_case(2, 2, seed=53)
    with pytest.raises(ValueError, match="tau") as info:
        fastrank.smooth_ndcg_loss(sim, rel, tau=tau)
    assert kind in str(info.value)
    with pytest.raises(ValueError, match="tau"):
        fastrank.nn.SmoothNDCGLoss(tau=tau)


# ---------------------------------------------------------------- CUDA
@needs_cuda
@pytest.mark.parametrize("n,m", [(1, 1), (3, 5), (64, 300), (300, 1100)])
def test_cuda_matches_cpu_reference(n, m):
    sim, rel = rand_case(n, m, seed=13, dtype=torch.float32)
    w = torch.rand(n + m, dtype=torch.float32)
    ref = both_impls(sim, rel, 0.05, "both", "none", weight=w)["reference"]
    s = sim.cuda().requires_grad_(True)
    loss = fastrank.smooth_ndcg_loss(s, rel.cuda(), 0.05, "both", "none", impl="native")
    (loss * w.cuda()).sum().backward()
    torch.testing.assert_close(loss.cpu(), ref[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s.grad.cpu(), ref[1], rtol=1e-4, atol=1e-5)


@needs_cuda
def test_cuda_deterministic_and_noncontiguous():
    sim, rel = rand_case(50, 80, seed=14, dtype=torch.float32)
    s = sim.cuda().t()  # (80, 50) transposed view
    r = rel.cuda().t()
    outs = []
    for _ in range(2):
        x = s.detach().clone().t().t().requires_grad_(True)  # keep it a strided view
        loss = fastrank.smooth_ndcg_loss(x, r, 0.01, impl="native")
        loss.backward()
        outs.append((loss, x.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_low_precision_error_bound(dtype):
    sim, rel = rand_case(96, 80, seed=15)
    ref64 = both_impls(sim, rel, 0.05, "both", "none")["reference"]
    # error of the pure-PyTorch reference run in the same low precision
    s_lp = sim.to(dtype).cuda().requires_grad_(True)
    lp = smooth_ndcg_per_query(s_lp, rel.to(dtype).cuda(), 0.05).sum() + \
        smooth_ndcg_per_query(s_lp.t(), rel.to(dtype).cuda().t(), 0.05).sum()
    lp.backward()
    ref_err = (s_lp.grad.double().cpu() - ref64[1]).abs().max().item()
    s_k = sim.to(dtype).cuda().requires_grad_(True)
    loss = fastrank.smooth_ndcg_loss(s_k, rel.cuda(), 0.05, "both", "none", impl="native")
    loss.sum().backward()
    assert s_k.grad.dtype == dtype
    # the kernel sees the rounded inputs too: compare both against float64 on the original input
    kern_err = (s_k.grad.double().cpu() - ref64[1]).abs().max().item()
    assert kern_err <= low_precision_bound(ref_err)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_low_precision_error_bound(dtype):
    """The kernel's error vs float64 is at most 2x that of the pure-PyTorch reference run
    in the same low precision (both start from the same rounded inputs)."""
    sim, rel = rand_case(64, 48, seed=16)
    ref64 = both_impls(sim, rel, 0.05, "both", "none")["reference"]
    x = sim.to(dtype).requires_grad_(True)
    lp = smooth_ndcg_per_query(x, rel.to(dtype), 0.05).sum() + \
        smooth_ndcg_per_query(x.t(), rel.to(dtype).t(), 0.05).sum()
    lp.backward()
    ref_err = (x.grad.double() - ref64[1]).abs().max().item()
    y = sim.to(dtype).requires_grad_(True)
    fastrank.smooth_ndcg_loss(y, rel, 0.05, "both", "none", impl="native").sum().backward()
    assert y.grad.dtype == dtype
    assert (y.grad.double() - ref64[1]).abs().max().item() <= 2 * ref_err


# ---------------------------------------------------------------- masks (docs/spec.md §2.1a: lists of different lengths)
def rand_mask(n, m, seed, p=0.7):
    return torch.rand(n, m, generator=torch.Generator().manual_seed(seed)) < p


def oracle_masked(sim, rel, mask, tau, direction="both", reduction="mean"):
    """docs/spec.md §2.1a by deleting the masked entries: each list is a ragged Python list."""
    S, R, K = sim.tolist(), rel.tolist(), mask.tolist()
    parts = []
    if direction in ("i2t", "both"):
        lists = [([s for s, k in zip(S[i], K[i]) if k], [r for r, k in zip(R[i], K[i]) if k])
                 for i in range(len(S))]
        parts.append(lists)
    if direction in ("t2i", "both"):
        cols = [([S[i][j] for i in range(len(S)) if K[i][j]], [R[i][j] for i in range(len(S)) if K[i][j]])
                for j in range(len(S[0]))]
        parts.append(cols)
    losses = [[oracle_query(s, r, tau) if s else 0.0 for s, r in p] for p in parts]
    if reduction == "none":
        return torch.tensor([x for p in losses for x in p], dtype=torch.float64)
    if reduction == "sum":
        return torch.tensor(sum(sum(p) for p in losses), dtype=torch.float64)
    total = 0.0
    for p, lists in zip(losses, parts):
        n_valid = sum(1 for s, _ in lists if s)
        total += sum(p) / n_valid if n_valid else 0.0
    return torch.tensor(total, dtype=torch.float64)


IMPLS = ["reference"] + (["native"] if NATIVE_CPU else [])
MASK_SHAPES = [(1, 1), (1, 6), (5, 1), (3, 5), (6, 4), (9, 9), (17, 11)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,m", MASK_SHAPES)
def test_mask_equals_deleting_entries(impl, n, m):
    """Loop oracle on ragged lists: masking an entry == deleting it from its lists."""
    for seed, ties in [(0, False), (1, True)]:
        sim, rel = rand_case(n, m, seed=100 + seed, ties=ties)
        mask = rand_mask(n, m, seed, p=0.6)
        mask[0] = False                       # a fully masked row ...
        if m > 1:
            mask[:, -1] = False               # ... and a fully masked column
        for tau in (1e-3, 0.1):
            for direction in ("i2t", "t2i", "both"):
                for reduction in ("mean", "sum", "none"):
                    got = fastrank.smooth_ndcg_loss(sim, rel, tau, direction, reduction, impl=impl, mask=mask)
                    exp = oracle_masked(sim, rel, mask, tau, direction, reduction)
                    torch.testing.assert_close(got, exp, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_all_true_equals_no_mask(impl):
    sim, rel = rand_case(7, 9, seed=20)
    full = torch.ones(7, 9, dtype=torch.bool)
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("mean", "sum", "none"):
            outs = []
            for mask in (None, full):
                s = sim.clone().requires_grad_(True)
                loss = fastrank.smooth_ndcg_loss(s, rel, 0.05, direction, reduction, impl=impl, mask=mask)
                (g,) = torch.autograd.grad(loss.sum(), s)
                outs.append((loss, g))
            torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-12, atol=1e-14)


@needs_native
@pytest.mark.parametrize("n,m", MASK_SHAPES + [(33, 70), (64, 31)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mask_native_matches_reference(n, m, dtype):
    tol = dict(rtol=1e-9, atol=1e-11) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-6)
    for seed, ties, scale, tau, p in [(0, False, 1.0, 0.01, 0.7), (1, True, 1.0, 0.1, 0.3),
                                      (2, False, 30.0, 1e-3, 0.9), (3, True, 0.3, 1.0, 0.5)]:
        sim, rel = rand_case(n, m, seed, dtype, ties=ties, scale=scale)
        mask = rand_mask(n, m, seed + 50, p)
        if seed == 3:
            rel[:, 0] = 0.0                   # all-zero gains in one column
            mask = mask.t().contiguous().t()  # a column-major mask
        for direction in ("i2t", "t2i", "both"):
            for reduction in ("mean", "sum", "none"):
                out = {}
                for impl in ("native", "reference"):
                    s = sim.clone().requires_grad_(True)
                    loss = fastrank.smooth_ndcg_loss(s, rel, tau, direction, reduction, impl=impl, mask=mask)
                    w = torch.rand(loss.shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
                    (g,) = torch.autograd.grad((loss * w).sum(), s)
                    out[impl] = (loss.detach(), g)
                torch.testing.assert_close(out["native"][0], out["reference"][0], **tol)
                torch.testing.assert_close(out["native"][1], out["reference"][1], **tol)
                assert torch.all(out["native"][1][~mask] == 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_gradcheck(impl):
    tau = 0.1
    sim, rel = rand_case(5, 6, seed=21)
    sim = (sim * 3 * tau).requires_grad_(True)
    mask = rand_mask(5, 6, seed=22, p=0.6)
    mask[1] = False
    mask[:, 2] = False
    for direction, reduction in [("both", "none"), ("both", "mean"), ("i2t", "sum"), ("t2i", "mean")]:
        f = lambda s: fastrank.smooth_ndcg_loss(s, rel, tau, direction, reduction, impl=impl, mask=mask)
        assert torch.autograd.gradcheck(f, (sim,), eps=1e-6 * tau, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_fully_masked_rows_columns_and_all(impl):
    sim, rel = rand_case(5, 4, seed=23)
    mask = torch.ones(5, 4, dtype=torch.bool)
    mask[2] = False
    mask[:, 1] = False
    s = sim.clone().requires_grad_(True)
    per_q = fastrank.smooth_ndcg_loss(s, rel, 0.1, "both", "none", impl=impl, mask=mask)
    assert per_q[2] == 0 and per_q[5 + 1] == 0
    per_q.sum().backward()
    assert torch.all(s.grad[2] == 0) and torch.all(s.grad[:, 1] == 0)
    # "mean" averages over the non-empty lists only: 4 rows and 3 columns
    mean = fastrank.smooth_ndcg_loss(sim, rel, 0.1, "both", "mean", impl=impl, mask=mask)
    torch.testing.assert_close(mean, per_q[:5].sum() / 4 + per_q[5:].sum() / 3)
    # nothing valid at all: loss 0, gradient 0, for every reduction
    none = torch.zeros(5, 4, dtype=torch.bool)
    for reduction in ("mean", "sum", "none"):
        s = sim.clone().requires_grad_(True)
        loss = fastrank.smooth_ndcg_loss(s, rel, 0.1, "both", reduction, impl=impl, mask=none)
        loss.sum().backward()
        assert torch.all(loss == 0) and torch.all(s.grad == 0)
    # a single valid item per list: rank 1 = ideal, loss 0
    eye = torch.eye(5, 4, dtype=torch.bool)
    assert fastrank.smooth_ndcg_loss(sim, rel, 0.1, impl=impl, mask=eye).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_ignores_masked_values(impl, monkeypatch):
    """Masked entries are never read: garbage (even NaN) there changes nothing, and the
    gradient there is exactly 0."""
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    sim, rel = rand_case(6, 7, seed=24)
    mask = rand_mask(6, 7, seed=25, p=0.6)
    outs = []
    for fill in (0.0, 1e6, float("nan")):
        s = torch.where(mask, sim, torch.full_like(sim, fill)).requires_grad_(True)
        r = torch.where(mask, rel, torch.full_like(rel, fill))
        loss = fastrank.smooth_ndcg_loss(s, r, 0.05, "both", "none", impl=impl, mask=mask)
        loss.sum().backward()
        assert torch.all(s.grad[~mask] == 0)
        outs.append((loss.detach(), s.grad))
    for loss, grad in outs[1:]:
        torch.testing.assert_close(loss, outs[0][0], rtol=0, atol=0)
        torch.testing.assert_close(grad, outs[0][1], rtol=0, atol=0)


@needs_native
def test_mask_compat_call_i2t_none():
    """The call fastrank.compat.approxNDCGLoss makes: i2t, per-query, padded slates."""
    sim, rel = rand_case(8, 10, seed=26, dtype=torch.float32)
    lengths = torch.tensor([10, 3, 1, 0, 7, 10, 2, 5])
    mask = torch.arange(10).unsqueeze(0) < lengths.unsqueeze(1)
    s = sim.clone().requires_grad_(True)
    loss = fastrank.smooth_ndcg_loss(s, rel, 1.0, direction="i2t", reduction="none", mask=mask)
    assert loss.shape == (8,) and loss.dtype == torch.float32
    exp = oracle_masked(sim.double(), rel.double(), mask, 1.0, "i2t", "none")
    torch.testing.assert_close(loss.double(), exp, rtol=1e-5, atol=1e-6)
    loss.mean().backward()
    assert torch.all(s.grad[~mask] == 0) and loss[3] == 0


def test_mask_module_form():
    sim, rel = rand_case(5, 6, seed=27)
    mask = rand_mask(5, 6, seed=28)
    mod = fastrank.nn.SmoothNDCGLoss(tau=0.05, reduction="sum")
    torch.testing.assert_close(mod(sim, rel, mask=mask),
                               fastrank.smooth_ndcg_loss(sim, rel, 0.05, reduction="sum", mask=mask))


@pytest.mark.parametrize("mask,exc,match", [
    ([[True, False]], TypeError, "mask"),
    (torch.ones(1, 2), TypeError, "mask.*bool"),
    (torch.ones(1, 2, dtype=torch.uint8), TypeError, "mask.*bool"),
    (torch.ones(2, 2, dtype=torch.bool), ValueError, "mask.*shape"),
    (torch.ones(2, dtype=torch.bool), ValueError, "mask.*shape"),
])
@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_bad_mask(mask, exc, match, impl):
    with pytest.raises(exc, match=match):
        fastrank.smooth_ndcg_loss(torch.tensor([[0.1, 0.2]]), torch.tensor([[1.0, 0.0]]), 0.1, impl=impl, mask=mask)


def test_bad_mask_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to build a mismatch")
    with pytest.raises(ValueError, match="mask"):
        fastrank.smooth_ndcg_loss(torch.rand(2, 2), torch.rand(2, 2), mask=torch.ones(2, 2, dtype=torch.bool,
                                                                                      device="cuda"))


@needs_native
def test_torch_compile_fullgraph_mask_and_none():
    sim, rel = rand_case(9, 7, seed=29, dtype=torch.float32)
    mask = rand_mask(9, 7, seed=30)

    def step(s, r, k):
        return (fastrank.smooth_ndcg_loss(s, r, tau=0.05, reduction="none", mask=k) * 2.0).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    s1 = sim.clone().requires_grad_(True)
    s2 = sim.clone().requires_grad_(True)
    l1, l2 = compiled(s1, rel, mask), step(s2, rel, mask)
    l1.backward()
    l2.backward()
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(s1.grad, s2.grad)


# ---------------------------------------------------------------- non-finite input (docs/spec.md §1)
@needs_native
@pytest.mark.parametrize("where", ["sim", "relevance"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("direction", ["i2t", "t2i", "both"])
@pytest.mark.parametrize("masked", [False, True])
def test_nonfinite_propagates_on_cpu_without_check(monkeypatch, where, bad, direction, masked):
    """FASTRANK_CHECK_FINITE=0: the kernels themselves must turn NaN/inf into a non-finite
    loss and gradient (what the CUDA default relies on)."""
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    sim, rel = rand_case(5, 6, seed=31)
    if where == "sim":
        sim[2, 3] = bad
    else:
        rel[2, 3] = bad
    mask = rand_mask(5, 6, seed=32) | torch.eye(5, 6, dtype=torch.bool).roll(3, 1) if masked else None
    if mask is not None:
        mask[2, 3] = True
    for reduction in ("mean", "none"):
        s = sim.clone().requires_grad_(True)
        loss = fastrank.smooth_ndcg_loss(s, rel, 0.1, direction, reduction, impl="native", mask=mask)
        loss.sum().backward()
        assert not torch.isfinite(loss).all(), (loss,)
        assert not torch.isfinite(s.grad).all()


@needs_native
def test_nonfinite_raises_by_default_on_cpu():
    sim, rel = rand_case(3, 3, seed=33)
    sim[0, 0] = float("nan")
    with pytest.raises(ValueError, match="sim"):
        fastrank.smooth_ndcg_loss(sim, rel)


# ---------------------------------------------------------------- sparse gains (docs/spec.md §2.1b)
def sparse_case(n, m, seed, dtype=torch.float64, k=3, mask=False, ties=False):
    """Relevance with at most k nonzero entries a row (ties among them with ``ties``), and rows
    that are all zero and all nonzero; optionally a mask."""
    g = torch.Generator().manual_seed(seed)
    sim = torch.randn(n, m, generator=g, dtype=torch.float64)
    rel = torch.zeros(n, m, dtype=torch.float64)
    for i in range(n):
        cols = torch.randperm(m, generator=g)[:min(k, m)]
        rel[i, cols] = torch.rand(len(cols), generator=g, dtype=torch.float64)
    if ties:
        sim = (sim * 2).round() / 2
        rel = (rel * 3).ceil() / 3
    if n > 2:
        rel[1] = 0.0                                                     # an all-zero list
        rel[2] = torch.rand(m, generator=g, dtype=torch.float64) + 0.1   # an all-nonzero list
    msk = (torch.rand(n, m, generator=g) < 0.8) if mask else None
    return sim.to(dtype), rel.to(dtype), msk


def path_run(path, sim, rel, tau, direction, reduction, mask=None, weight=None, impl="native"):
    """(loss, gradient) with the kernels' pair pass forced (``fastrank.kernel_variant``)."""
    s = sim.detach().clone().requires_grad_(True)
    with fastrank.kernel_variant(pair_pass=path):
        loss = fastrank.smooth_ndcg_loss(s, rel, tau, direction, reduction, impl=impl, mask=mask)
        w = torch.ones_like(loss) if weight is None else weight
        (g,) = torch.autograd.grad((loss * w).sum(), s)
    return loss.detach(), g


@needs_native
@pytest.mark.parametrize("n,m", [(1, 1), (1, 9), (9, 1), (5, 40), (40, 5), (33, 70), (4, 600)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mask", [False, True])
def test_sparse_path_equals_dense_path(n, m, dtype, mask):
    """The same loss and gradient whichever pair pass a list takes (both forced, and auto):
    float64 to 1e-12; in float32 each path's error against the float64 reference is within
    twice the dense path's own."""
    for seed, ties, tau in [(0, False, 0.05), (1, True, 0.5), (2, False, 1e-3)]:
        sim, rel, msk = sparse_case(n, m, seed, dtype, k=3, mask=mask, ties=ties)
        for direction in ("i2t", "t2i", "both"):
            q = n * (direction != "t2i") + m * (direction != "i2t")
            w = torch.rand(q, dtype=dtype, generator=torch.Generator().manual_seed(seed))
            dense = path_run("dense", sim, rel, tau, direction, "none", msk, w)
            ref = path_run("auto", sim.double(), rel.double(), tau, direction, "none", msk, w.double(),
                           impl="reference")
            for path in ("sparse", "auto"):
                got = path_run(path, sim, rel, tau, direction, "none", msk, w)
                for i in range(2):
                    if dtype == torch.float64:
                        torch.testing.assert_close(got[i], dense[i], rtol=1e-12, atol=1e-12)
                        torch.testing.assert_close(dense[i], ref[i], rtol=1e-9, atol=1e-11)
                    else:
                        own = (dense[i].double() - ref[i]).abs().max().item()
                        err = (got[i].double() - ref[i]).abs().max().item()
                        assert err <= 2 * own + 1e-7, (path, i, err, own)


@needs_native
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_sparse_path_reductions_long_lists(reduction):
    """Past the IDCG's counting limit (512 items) and with many nonzero gains (the sparse
    IDCG counts where the dense one sorts)."""
    sim, rel, _ = sparse_case(3, 1100, seed=3, k=600)
    a = path_run("dense", sim, rel, 0.05, "both", reduction)
    b = path_run("sparse", sim, rel, 0.05, "both", reduction)
    torch.testing.assert_close(b[0], a[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b[1], a[1], rtol=1e-12, atol=1e-12)


@needs_native
@pytest.mark.parametrize("path", ["sparse", "auto"])
def test_sparse_path_gradcheck(path):
    sim, rel, msk = sparse_case(5, 9, seed=8, k=2, mask=True)
    sim = (sim * 0.3).requires_grad_(True)
    with fastrank.kernel_variant(pair_pass=path):
        f = lambda s: fastrank.smooth_ndcg_loss(s, rel, 0.1, "both", "none", impl="native", mask=msk)  # noqa: E731
        assert torch.autograd.gradcheck(f, (sim,), eps=1e-7, atol=1e-7, rtol=1e-5)


@needs_native
@pytest.mark.parametrize("where", ["zero-gain item", "nonzero-gain item"])
def test_sparse_path_propagates_nonfinite(monkeypatch, where):
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    sim, rel, _ = sparse_case(4, 30, seed=9, k=2)
    j = int((rel[0] == 0).nonzero()[0]) if where == "zero-gain item" else int((rel[0] != 0).nonzero()[0])
    sim[0, j] = float("nan")
    loss, grad = path_run("sparse", sim, rel, 0.1, "i2t", "none")
    assert torch.isnan(loss[0]) and torch.isfinite(loss[1:]).all()
    assert torch.isnan(grad[0]).any() and torch.isfinite(grad[1:]).all()


def topk_of(rel, k, pad=0):
    """rel's TopKRelevance with k slots a row and ``pad`` extra unused ones (index -1) in the middle."""
    t = fastrank.TopKRelevance.from_dense(rel, k)
    if pad:
        n = rel.shape[0]
        idx = torch.cat([t.indices[:, :1], torch.full((n, pad), -1, dtype=torch.int64), t.indices[:, 1:]], 1)
        val = torch.cat([t.values[:, :1], torch.full((n, pad), 7.0, dtype=t.values.dtype), t.values[:, 1:]], 1)
        t = fastrank.TopKRelevance(idx, val, t.num_columns)
    return t


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n,m", [(1, 1), (1, 6), (6, 1), (7, 30), (30, 7)])
@pytest.mark.parametrize("mask", [False, True])
def test_topk_relevance_equals_its_matrix(impl, n, m, mask):
    """A TopKRelevance gives the loss and gradient of the (N, M) matrix it stands for (rows with
    fewer entries than slots, unused slots of any value, masks, both directions)."""
    sim, rel, msk = sparse_case(n, m, seed=11, k=3, mask=mask)
    rel[2:3] = 0.0 if n > 2 else rel[2:3]
    top = topk_of(rel, min(4, m), pad=1)
    torch.testing.assert_close(top.to_dense(), rel)
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("none", "mean"):
            a = path_run("auto", sim, rel, 0.1, direction, reduction, msk, impl=impl)
            b = path_run("auto", sim, top, 0.1, direction, reduction, msk, impl=impl)
            torch.testing.assert_close(b[0], a[0], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(b[1], a[1], rtol=1e-12, atol=1e-12)


@needs_native
def test_topk_relevance_gradcheck_and_float32():
    sim, rel, _ = sparse_case(6, 11, seed=12, k=3)
    top = topk_of(rel, 3)
    s = (sim * 0.3).requires_grad_(True)
    f = lambda x: fastrank.smooth_ndcg_loss(x, top, 0.1, "both", "none", impl="native")  # noqa: E731
    assert torch.autograd.gradcheck(f, (s,), eps=1e-7, atol=1e-7, rtol=1e-5)
    a = path_run("auto", sim.float(), top.to_dense().float(), 0.1, "both", "mean")   # row 2 cut to its top 3
    b = path_run("auto", sim.float(), top.to(torch.float32), 0.1, "both", "mean")
    torch.testing.assert_close(b[0], a[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(b[1], a[1], rtol=1e-6, atol=1e-7)


def _bad_topk(sim, what):
    n, m = sim.shape
    idx = torch.tensor([[0, 2], [1, -1], [3, 4]])[:n]
    val = torch.tensor([[0.5, 1.0], [0.2, 0.0], [0.1, 0.3]], dtype=sim.dtype)[:n]
    T = fastrank.TopKRelevance
    return {"indices of floats": T(idx.double(), val, m), "values of ints": T(idx, idx, m),
            "another shape": T(idx[:, :1], val, m), "other columns": T(idx, val, m + 1),
            "other rows": T(idx[:2], val[:2], m),
            "index out of range": T(torch.where(idx == 4, m, idx), val, m),
            "a column twice": T(torch.where(idx == 2, 0, idx), val, m),
            "negative value": T(idx, val - 1, m),
            "NaN value": T(idx, torch.full_like(val, float("nan")), m)}[what]


@pytest.mark.parametrize("what,exc,match", [
    ("indices of floats", TypeError, "relevance.indices"), ("values of ints", TypeError, "relevance.values"),
    ("another shape", ValueError, "relevance.indices"), ("other columns", ValueError, "relevance must have"),
    ("other rows", ValueError, "relevance must have"), ("index out of range", ValueError, "relevance.indices"),
    ("a column twice", ValueError, "relevance.indices"), ("negative value", ValueError, "relevance.values"),
    ("NaN value", ValueError, "relevance.values")])
@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_bad_topk_relevance(what, exc, match, impl):
    sim = torch.randn(3, 5, dtype=torch.float64)
    with pytest.raises(exc, match=match):
        fastrank.smooth_ndcg_loss(sim, _bad_topk(sim, what), impl=impl)


# ---------------------------------------------------------------- CUDA: the fused-call contract
def _cuda_case(n, m, dtype=torch.float32, seed=40):
    sim, rel = rand_case(n, m, seed=seed, dtype=dtype)
    return sim.cuda(), rel.cuda()


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("n,m", [(1, 1), (5, 3), (17, 40), (130, 70)])
def test_cuda_mask_matches_reference(n, m):
    sim, rel = rand_case(n, m, seed=41)
    mask = rand_mask(n, m, seed=42, p=0.6)
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("mean", "sum", "none"):
            ref = fastrank.smooth_ndcg_loss(sim.requires_grad_(True), rel, 0.05, direction, reduction,
                                            impl="reference", mask=mask)
            (g_ref,) = torch.autograd.grad(ref.sum(), sim)
            s = sim.detach().cuda().requires_grad_(True)
            got = fastrank.smooth_ndcg_loss(s, rel.cuda(), 0.05, direction, reduction, impl="native",
                                            mask=mask.cuda())
            got.sum().backward()
            torch.testing.assert_close(got.cpu().double(), ref.detach(), rtol=1e-9, atol=1e-11)
            torch.testing.assert_close(s.grad.cpu().double(), g_ref, rtol=1e-9, atol=1e-11)
            assert torch.all(s.grad.cpu()[~mask] == 0)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_cuda_nonfinite_propagates_by_default(bad):
    sim, rel = _cuda_case(6, 5)
    sim[1, 2] = bad
    s = sim.requires_grad_(True)
    loss = fastrank.smooth_ndcg_loss(s, rel, 0.1)
    loss.backward()
    assert not torch.isfinite(loss).all() and not torch.isfinite(s.grad).all()


@needs_cuda
@pytest.mark.cuda
def test_cuda_relevance_range_only_with_the_check_on(monkeypatch):
    """docs/spec.md §1: the range check is the finite check's pass. On CUDA it is off by default (no
    host sync: the call copies nothing to the host) and raises once switched on."""
    sim, rel = _cuda_case(6, 5)
    cos = rel * 2 - 1
    monkeypatch.delenv("FASTRANK_CHECK_FINITE", raising=False)
    fastrank.smooth_ndcg_loss(sim, cos, 0.1)                                   # warm-up
    _, copies = _cuda_checks.call_activity(lambda: fastrank.smooth_ndcg_loss(sim, cos, 0.1))
    assert not any("Device -> " in c or "DtoH" in c for c in copies), copies
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "1")
    with pytest.raises(ValueError, match="relevance must be >= 0"):
        fastrank.smooth_ndcg_loss(sim, cos, 0.1)
    with pytest.raises(ValueError, match="relevance must lie in label_range"):
        fastrank.kendall_sw_loss(sim, cos)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[needs_cuda, pytest.mark.cuda])])
def test_cuda_graph_capture_equals_eager(device):
    # on the CPU: the same step run eagerly twice (a wrong call fails without a GPU)
    sim, rel = rand_case(32, 24, seed=40, dtype=torch.float32)
    sim, rel = sim.to(device), rel.to(device)
    _cuda_checks.assert_graph_replay_equals_eager(lambda x, r: fastrank.smooth_ndcg_loss(x, r, 0.05), sim, rel)


@needs_cuda
@pytest.mark.cuda
def test_cuda_compile_reduce_overhead_step():
    # the backward outside the compiled step, as torch's CUDA-graph trees expect: a step that
    # calls .backward() inside the compiled function replays its forward graph over the
    # tensors the previous step's backward still needs (seen on an H100 with torch 2.11)
    sim, rel = _cuda_case(24, 20)
    assert torch.isfinite(_cuda_checks.reduce_overhead_steps(
        lambda s, r: fastrank.smooth_ndcg_loss(s, r, 0.1), sim, rel))


@needs_cuda
@pytest.mark.cuda
def test_cuda_launch_count_and_no_host_copy():
    counts = {}
    for direction in ("i2t", "t2i", "both"):
        for n in (8, 256):
            sim, rel = _cuda_case(n, n)
            kernels, copies = _cuda_checks.device_activity(
                lambda x, r: fastrank.smooth_ndcg_loss(x, r, 0.05, direction), sim, rel)
            assert copies == [], (direction, n, copies)
            counts[(direction, n)] = len(kernels)
    assert len(set(counts.values())) == 1, counts
    assert max(counts.values()) <= 6, counts  # forward 2 + backward 1 (+ autograd's grad seed)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_mask_low_precision_runs(dtype):
    sim, rel = rand_case(40, 30, seed=43)
    mask = rand_mask(40, 30, seed=44)
    s = sim.to(dtype).cuda().requires_grad_(True)
    loss = fastrank.smooth_ndcg_loss(s, rel.to(dtype).cuda(), 0.05, mask=mask.cuda())
    loss.backward()
    ref = fastrank.smooth_ndcg_loss(sim.to(dtype).double(), rel.to(dtype).double(), 0.05, impl="reference",
                                    mask=mask)
    assert loss.dtype == torch.float32 and s.grad.dtype == dtype
    assert abs(loss.item() - ref.item()) < 1e-3
    assert torch.all(s.grad.cpu()[~mask] == 0)


# ---- CUDA test matrix (marked cuda_matrix) -------------------------------------------------------
# smooth_ndcg's CUDA kernels (version 2: forward_lists, finalize_lists and the smooth-rank
# engine's elementwise backward; version 1, fastrank.kernel_variant(version=1): forward_tiles, finalize,
# backward_tiles) against the reference,
# with the checks of tests/_cuda_matrix.py: on a GPU, or emulated on the CPU by
# tests/test_emulated.py; deselected where neither can run (tests/conftest.py).
TAU = 0.05


def native(s, r, direction, reduction, mask, tau=TAU):
    return fastrank.smooth_ndcg_loss(s, r, tau, direction, reduction, impl="native", mask=mask)


def reference(s, r, direction, reduction, mask, tau=TAU):
    return fastrank.smooth_ndcg_loss(s, r, tau, direction, reduction, impl="reference", mask=mask)


# sizes: one item, one list, tiles of 16 exactly and not, chunks of 32 candidates and not;
# version 2's lists of one tile of 32, two, three (an odd count: a bye each round) and 18 (nine
# tile pairs a round: a warp takes two)
MATRIX_SHAPES = [(1, 1), (1, 19), (19, 1), (16, 32), (33, 17), (20, 70), (2, 576)]


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("n,m", MATRIX_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, n, m, dtype):
    sim, rel = case(n, m, seed=n * 100 + m, levels=4)
    for direction in DIRECTIONS:
        check_loss(native, reference, sim, rel, direction, "none", dtype=dtype, device=device)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_direction_and_reduction(device, direction, reduction):
    sim, rel = case(21, 18, seed=3, ties=True)
    check_loss(native, reference, sim, rel, direction, reduction, dtype=torch.float64, device=device,
               schedules=SCHEDULES)


@pytest.mark.cuda_matrix
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


@pytest.mark.cuda_matrix
def test_ties_large_magnitudes_and_temperatures(device):
    for seed, (ties, scale, tau) in enumerate([(True, 1.0, 0.1), (False, 30.0, 1e-3), (True, 0.3, 1.0)]):
        sim, rel = case(19, 22, seed=seed + 10, ties=ties, scale=scale)
        fn = lambda s, r, d, red, mk, t=tau: native(s, r, d, red, mk, t)
        ref = lambda s, r, d, red, mk, t=tau: reference(s, r, d, red, mk, t)
        check_loss(fn, ref, sim, rel, "both", "none", dtype=torch.float64, device=device)


@pytest.mark.cuda_matrix
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


KERNELS = {"v2": ["forward_lists", "forward_lists", "finalize_lists", "subset_backward_kernel"],  # a launch a direction
           "v1": ["forward_tiles", "finalize", "backward_tiles"]}


@pytest.mark.cuda_matrix
@pytest.mark.skipif(not EMULATED, reason="the launch log is the emulator's")
@pytest.mark.parametrize("version", ["v2", "v1"])
def test_one_launch_pair_forward_one_backward(device, version):
    with fastrank.kernel_variant(version=int(version[1:])):
        sim, rel = case(40, 30, seed=10)
        s = sim.requires_grad_(True)
        assert launches(lambda: native(s, rel, "both", "mean", None).backward()) == KERNELS[version]


@pytest.mark.cuda_matrix
@pytest.mark.skipif(not EMULATED, reason="the emulator's dry run checks launch shapes without running them")
@pytest.mark.parametrize("version", ["v2", "v1"])
def test_many_short_lists_fit_the_grid(device, version):
    """More than 65535 row tiles (1,048,560 rows of one item): the tiles go on gridDim.x, the
    launches are valid (version 2: a launch a direction, at most 1024 blocks each, a list at a
    time; the scratch is sized by each direction's own lists, not 1024 blocks x the longest).
    Dry run: shapes are checked, nothing is computed."""
    with fastrank.kernel_variant(version=int(version[1:])):
        n = 65536 * 16 + 1
        s, rel = torch.zeros(n, 1).requires_grad_(True), torch.zeros(n, 1)
        shapes = dry_run_launches(lambda: native(s, rel, "both", "mean", None).backward())
        assert [k for k, _, _ in shapes] == KERNELS[version]
        if version == "v1":
            assert shapes[0][1] == ((n + 15) // 16, 1, 1) and shapes[2][1] == shapes[0][1]
        else:
            assert shapes[0][1] == (1024, 1, 1) and shapes[1][1] == (1, 1, 1)
            assert fastrank._native.emulated_cuda().smooth_ndcg_partials_numel(n, 1, 3) < 10 * n  # flags + 4 (2^21 + 32)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("n,m", [(33, 17), (20, 70)])
def test_version_1_values_and_gradients(device, n, m):
    """Version 1 stays in the build (the GPU run times both): it is still checked, masks included."""
    with fastrank.kernel_variant(version=1):
        sim, rel = case(n, m, seed=n * 100 + m, levels=4)
        mask = torch.rand(n, m, generator=torch.Generator().manual_seed(n)) > 0.3
        for dtype in (torch.float64, torch.float32):
            check_loss(native, reference, sim, rel, "both", "none", dtype=dtype, device=device)
            check_loss(native, reference, sim, rel, "both", "mean", mask, dtype=dtype, device=device)


@pytest.mark.cuda_matrix
def test_version_1_takes_lists_as_their_matrix(device):
    """Version 1 reads the relevance matrix only: given top-k lists, the op makes their (N, M)
    matrix for it (version 2 never does), with the same values."""
    with fastrank.kernel_variant(version=1):
        sim, rel = case(12, 20, seed=27, levels=4)
        rel[:, ::2] = 0.0
        top = fastrank.TopKRelevance.from_dense(rel, 20)
        mask = torch.rand(12, 20, generator=torch.Generator().manual_seed(27)) > 0.3
        want = check_loss(native, reference, sim, rel, "both", "none", mask, dtype=torch.float64, device=device)
        got = check_loss(lambda s, r, d, red, mk: native(s, top.to(s.device), d, red, mk), reference, sim, rel, "both",
                         "none", mask, dtype=torch.float64, device=device)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


class TestGradedLossMatrix(GradedLossCases):
    """The cases every graded loss shares (tests/_cuda_matrix.py), on smooth_ndcg's calls."""
    native = staticmethod(native)
    reference = staticmethod(reference)


class TestSparseRelevanceMatrix(SparseRelevanceCases):
    """Top-k relevance lists and the sparse pass (tests/_cuda_matrix.py), on smooth_ndcg's calls."""
    native = staticmethod(native)
    reference = staticmethod(reference)
