"""smooth_ndcg_loss: loop oracle, native vs reference, gradients, compile, bad input."""
import math

import pytest
import torch

import fastrank
from fastrank.ops.smooth_ndcg import smooth_ndcg_backward_op, smooth_ndcg_op
from fastrank.reference.smooth_ndcg import smooth_ndcg_per_query

NATIVE_CPU = fastrank.backends()["cpu"]
CUDA = fastrank.backends()["cuda_available"]
needs_native = pytest.mark.skipif(not NATIVE_CPU, reason="native CPU module not built")
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")


# ---------------------------------------------------------------- slow loop oracle
def oracle_query(s, r, tau):
    """SPEC 2.1 for one query, with Python floats and loops."""
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
    torch.library.opcheck(smooth_ndcg_op, (sim, rel, None, 0.1, direction, reduction))
    loss, ws = smooth_ndcg_op(sim.detach(), rel, None, 0.1, direction, reduction)
    g = torch.rand(loss.shape, dtype=torch.float64)
    torch.library.opcheck(smooth_ndcg_backward_op, (g, sim.detach(), None, ws, 0.1, direction, reduction))
    # transposed view as input, and a mask
    mask = torch.rand(6, 5, generator=torch.Generator().manual_seed(1)) < 0.7
    torch.library.opcheck(smooth_ndcg_op, (sim.detach().t(), rel.t(), mask.t(), 0.1, direction, reduction))
    torch.library.opcheck(smooth_ndcg_op, (sim, rel, mask, 0.1, direction, reduction))


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
    assert kern_err <= 2 * ref_err + 1e-12


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
