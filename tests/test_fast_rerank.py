"""fast_rerank (docs/spec.md §3; DVSE, Eq. 13-15): oracle, native vs reference, gradients,
compile/opcheck, bad input, determinism, CUDA, the CUDA test matrix."""
import math

import pytest
import torch

import fastrank
from fastrank._tolerance import low_precision_bound
from fastrank.ops.fast_rerank import fast_rerank_backward_op, fast_rerank_lse, fast_rerank_op
from fastrank.reference.fast_rerank import fast_rerank as reference

from _cuda_matrix import EMULATED, case, dry_run_launches, each_schedule, launches, layout

CUDA = fastrank.backends()["cuda_available"]
_skip_no_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")


def needs_cuda(f):
    return pytest.mark.cuda(_skip_no_cuda(f))


needs_cpu_native = pytest.mark.skipif(not fastrank.backends()["cpu"], reason="CPU module not built")

GAMMA, LAM = (25.0, 25.0), (20.0, 20.0)


# ---- the slow, obvious oracle (Python floats, float64) --------------------------------------
def _lse(values):
    mx = max(values)
    return mx + math.log(sum(math.exp(v - mx) for v in values))


def oracle(sim, gamma, lam):
    """Eq. 14-15 in log space, element by element."""
    s = sim.tolist()
    n, m = len(s), len(s[0])
    g1, g2 = gamma
    l1, l2 = lam
    col = [_lse([g1 * s[l][j] for l in range(n)]) for j in range(m)]
    row = [_lse([l1 * s[i][l] for l in range(m)]) for i in range(n)]
    i2t = [[g2 * s[i][j] - col[j] for j in range(m)] for i in range(n)]
    t2i = [[l2 * s[i][j] - row[i] for j in range(m)] for i in range(n)]
    return torch.tensor(i2t, dtype=torch.float64), torch.tensor(t2i, dtype=torch.float64)


def oracle_paper_matrix(sim, gamma, lam):
    """The paper's own (non-log) form of Eq. 14 for small magnitudes: exp(g2 A_ij) / sum_l exp(g1 A_lj)."""
    s = sim.tolist()
    n, m = len(s), len(s[0])
    g1, g2 = gamma
    l1, l2 = lam
    a = [[math.exp(g2 * s[i][j]) / sum(math.exp(g1 * s[l][j]) for l in range(n)) for j in range(m)]
         for i in range(n)]
    b = [[math.exp(l2 * s[i][j]) / sum(math.exp(l1 * s[i][l]) for l in range(m)) for j in range(m)]
         for i in range(n)]
    return torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _sim(n, m, scale=1.0, seed=0, dtype=torch.float64):
    return (torch.randn(n, m, generator=_gen(seed), dtype=torch.float64) * scale).to(dtype)


# ---- (1) reference vs oracle -------------------------------------------------------------------
@pytest.mark.parametrize("n,m", [(1, 1), (1, 4), (4, 1), (2, 2), (3, 5), (6, 4)])
@pytest.mark.parametrize("gamma,lam", [(GAMMA, LAM), ((2.0, 3.0), (0.5, 1.5))])
def test_reference_matches_oracle(n, m, gamma, lam):
    sim = _sim(n, m, 0.5, seed=n * 10 + m)
    i2t, t2i = reference(sim, gamma, lam)
    o1, o2 = oracle(sim, gamma, lam)
    torch.testing.assert_close(i2t, o1, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(t2i, o2, rtol=1e-12, atol=1e-10)


def test_reference_is_log_of_paper_matrix():
    sim = _sim(4, 5, 0.1, seed=3)
    gamma, lam = (2.0, 3.0), (1.5, 0.5)
    i2t, t2i = reference(sim, gamma, lam)
    a, b = oracle_paper_matrix(sim, gamma, lam)
    torch.testing.assert_close(i2t.exp(), a, rtol=1e-12, atol=0)
    torch.testing.assert_close(t2i.exp(), b, rtol=1e-12, atol=0)


def test_reference_large_magnitudes_oracle():
    # gamma1 * sim ~ 2500: a naive exp overflows, the log-space scores stay finite
    sim = _sim(5, 7, 100.0, seed=4)
    i2t, t2i = reference(sim, GAMMA, LAM)
    o1, o2 = oracle(sim, GAMMA, LAM)
    assert torch.isfinite(i2t).all() and torch.isfinite(t2i).all()
    torch.testing.assert_close(i2t, o1, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(t2i, o2, rtol=1e-12, atol=1e-9)


# ---- (2) native vs reference, values and gradients -------------------------------------------
def _cases():
    """(name, base, view): the case is view(base moved to a device/dtype), so strided layouts
    are rebuilt on each device."""
    same = lambda x: x  # noqa: E731
    yield "1x1", _sim(1, 1, seed=1), same
    yield "1xM", _sim(1, 9, seed=2), same
    yield "Nx1", _sim(9, 1, seed=3), same
    yield "Mx2", _sim(7, 2, seed=4), same
    yield "2xM", _sim(2, 7, seed=5), same
    yield "N!=M", _sim(13, 37, seed=6), same
    yield "tiles", _sim(530, 1100, 0.3, seed=7), same  # crosses CPU tile (512 x 1024) and strip edges
    yield "ties", torch.randint(-2, 3, (17, 23), generator=_gen(8)).double() * 0.25, same
    yield "all-equal", torch.full((6, 8), 0.7, dtype=torch.float64), same
    yield "all-zero", torch.zeros(5, 4, dtype=torch.float64), same
    yield "large", _sim(11, 19, 80.0, seed=9), same  # exp(25 * 80 * 3) overflows even float64
    yield "transposed", _sim(40, 29, seed=10), lambda x: x.t()
    yield "sliced", _sim(30, 60, seed=11), lambda x: x[3:, ::3]
    yield "expanded", _sim(1, 33, seed=12), lambda x: x.expand(21, 33)


CASES = list(_cases())
IDS = [c[0] for c in CASES]


def _grad(fn, sim, w1, w2):
    x = sim.detach().clone().requires_grad_()
    i2t, t2i = fn(x)
    ((i2t * w1).sum() + (t2i * w2).sum()).backward()
    return i2t.detach(), t2i.detach(), x.grad


@needs_cpu_native
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name,base,view", CASES, ids=IDS)
def test_native_matches_reference(name, base, view, dtype):
    sim = view(base)
    x = view(base.to(dtype))
    assert x.stride() == sim.stride()
    w1 = torch.randn(sim.shape, generator=_gen(20), dtype=torch.float64).to(dtype)
    w2 = torch.randn(sim.shape, generator=_gen(21), dtype=torch.float64).to(dtype)
    # truth: the float64 reference on the same (rounded) inputs
    r1, r2, rg = _grad(lambda v: reference(v, GAMMA, LAM), x.double(), w1.double(), w2.double())
    n1, n2, ng = _grad(lambda v: fastrank.fast_rerank(v, GAMMA, LAM, impl="native"), x, w1, w2)
    assert n1.dtype == dtype and ng.dtype == dtype and n1.is_contiguous()
    atol, gatol = _tolerances(x, rg, w1, w2, dtype)
    torch.testing.assert_close(n1.double(), r1, rtol=0, atol=atol)
    torch.testing.assert_close(n2.double(), r2, rtol=0, atol=atol)
    torch.testing.assert_close(ng.double(), rg, rtol=0, atol=gatol)


def _tolerances(x, rg, w1, w2, dtype):
    """(score atol, gradient atol) of an implementation in dtype against the float64 truth:
    rounding of exponents of size 25 * |sim| bounds what any implementation in dtype can do
    (relative error ~ eps * scale), and the gradient's error scales with its own magnitude
    too (|grad| ~ 610 at |sim| = 80 gives errors ~ 0.04 in float32 on CPU and CUDA alike)."""
    eps = torch.finfo(dtype).eps
    scale = 25 * float(x.abs().max()) + 1
    gscale = float(rg.abs().max()) + 25 * float(w1.abs().max() + w2.abs().max())
    return 8 * eps * scale, 8 * eps * scale * gscale


@needs_cpu_native
def test_native_single_output_gradients_and_expanded_grads():
    sim = _sim(12, 21, seed=30, dtype=torch.float64)
    for pick in (0, 1):
        x = sim.clone().requires_grad_()
        out = fastrank.fast_rerank(x, impl="native")[pick]
        out.sum().backward()  # the other output's gradient is None; this one is an expanded 1
        y = sim.clone().requires_grad_()
        reference(y)[pick].sum().backward()
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-12, atol=1e-10)


@needs_cpu_native
def test_native_half_inputs_on_cpu():
    sim = _sim(9, 14, 0.5, seed=31, dtype=torch.float32)
    for dt in (torch.float16, torch.bfloat16):
        x = sim.to(dt).requires_grad_()
        i2t, t2i = fastrank.fast_rerank(x, impl="native")
        assert i2t.dtype == dt and t2i.dtype == dt
        (i2t.float().sum() + t2i.float().sum()).backward()
        assert x.grad.dtype == dt
        r1, r2 = reference(x.detach().double())
        torch.testing.assert_close(i2t.double(), r1, rtol=1e-2, atol=0.5)
        torch.testing.assert_close(t2i.double(), r2, rtol=1e-2, atol=0.5)


def test_reference_impl_and_module():
    sim = _sim(6, 8, seed=32, dtype=torch.float32)
    a = fastrank.fast_rerank(sim, (3.0, 4.0), (5.0, 6.0), impl="reference")
    b = reference(sim, (3.0, 4.0), (5.0, 6.0))
    torch.testing.assert_close(a, b)
    mod = fastrank.nn.FastRerank(gamma=(3.0, 4.0), lam=(5.0, 6.0))
    assert "gamma=(3.0, 4.0)" in repr(mod)
    c = mod(sim)
    assert isinstance(c, tuple) and len(c) == 2
    torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-5)


@needs_cpu_native
def test_statistics_op():
    sim = _sim(40, 70, seed=33)
    cl, rl = fast_rerank_lse(sim, 3.0, 2.0)
    torch.testing.assert_close(cl, torch.logsumexp(3.0 * sim, 0), rtol=1e-13, atol=1e-12)
    torch.testing.assert_close(rl, torch.logsumexp(2.0 * sim, 1), rtol=1e-13, atol=1e-12)


@needs_cpu_native
def test_one_forward_and_one_backward_kernel_call(monkeypatch):
    # a call is one fused forward and one fused backward (both directions at once); every
    # kernel call goes through fastrank.ops._launch.call, which looks the module up there
    import fastrank.ops._launch as L
    real = L.cpu_module()
    calls = []

    class Counting:
        def __getattr__(self, name):
            fn = getattr(real, name)

            def wrapped(*args):
                calls.append(name)
                return fn(*args)
            return wrapped

    monkeypatch.setattr(L, "cpu_module", lambda: Counting())
    x = _sim(9, 13, seed=95).requires_grad_()
    i2t, t2i = fastrank.fast_rerank(x, impl="native")
    assert calls == ["fast_rerank_forward"]
    (i2t.sum() + t2i.sum()).backward()
    assert calls == ["fast_rerank_forward", "fast_rerank_backward"]
    y = _sim(9, 13, seed=95).requires_grad_()
    a, b = reference(y)
    (a.sum() + b.sum()).backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-12, atol=1e-10)


# ---- (3) gradcheck -------------------------------------------------------------------------
@needs_cpu_native
@pytest.mark.parametrize("n,m,gamma,lam", [(1, 1, GAMMA, LAM), (1, 5, GAMMA, LAM), (5, 1, GAMMA, LAM),
                                           (4, 7, (2.0, 3.0), (1.5, 0.5)), (9, 6, GAMMA, LAM)])
def test_gradcheck_native(n, m, gamma, lam):
    sim = _sim(n, m, 0.2, seed=n + 7 * m).requires_grad_()
    assert torch.autograd.gradcheck(lambda s: fastrank.fast_rerank(s, gamma, lam, impl="native"), (sim,))


@needs_cpu_native
def test_gradcheck_backward_op_inputs_none():
    # the backward op with one upstream gradient absent equals the full formula with zeros
    sim = _sim(5, 6, 0.3, seed=40)
    h = (2.0, 3.0, 1.5, 0.5)
    i2t, t2i, stats = fast_rerank_op(sim, *h)
    g = torch.randn(5, 6, generator=_gen(41), dtype=torch.float64)
    z = torch.zeros_like(g)
    torch.testing.assert_close(fast_rerank_backward_op(g, None, sim, stats, *h),
                               fast_rerank_backward_op(g, z, sim, stats, *h))
    torch.testing.assert_close(fast_rerank_backward_op(None, g, sim, stats, *h),
                               fast_rerank_backward_op(z, g, sim, stats, *h))
    assert fast_rerank_backward_op(None, None, sim, stats, *h).abs().max() == 0


@needs_cpu_native
def test_forward_op_statistics_and_eager_equals_op():
    # stats = (col_lse, row_lse); the eager autograd.Function and the custom op agree bit for bit
    sim = _sim(7, 11, 0.4, seed=42)
    h = (2.0, 3.0, 1.5, 0.5)
    i2t, t2i, stats = fast_rerank_op(sim, *h)
    assert stats.shape == (11 + 7,) and stats.dtype == torch.float64
    torch.testing.assert_close(stats[:11], torch.logsumexp(2.0 * sim, 0), rtol=1e-13, atol=1e-12)
    torch.testing.assert_close(stats[11:], torch.logsumexp(1.5 * sim, 1), rtol=1e-13, atol=1e-12)
    x1 = sim.clone().requires_grad_()
    a1, b1 = fastrank.fast_rerank(x1, (2.0, 3.0), (1.5, 0.5), impl="native")
    assert torch.equal(a1.detach(), i2t) and torch.equal(b1.detach(), t2i)
    w = torch.randn(7, 11, generator=_gen(43), dtype=torch.float64)
    ((a1 * w).sum() + (b1 * w.t().contiguous().t()).sum()).backward()
    x2 = sim.clone().requires_grad_()
    a2, b2, _ = fast_rerank_op(x2, *h)
    ((a2 * w).sum() + (b2 * w).sum()).backward()
    assert torch.equal(x1.grad, x2.grad)


# ---- (4) torch.compile and opcheck -------------------------------------------------------------
@needs_cpu_native
def test_compile_fullgraph():
    def f(s):
        i2t, t2i = fastrank.fast_rerank(s, (20.0, 22.0), (15.0, 16.0), impl="native")
        return (i2t * 0.5).sum() + t2i.logsumexp(dim=0).sum()

    torch._dynamo.reset()
    sim = _sim(8, 11, 0.3, seed=50, dtype=torch.float32)
    x1 = sim.clone().requires_grad_()
    x2 = sim.clone().requires_grad_()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    a = compiled(x1)
    b = f(x2)
    a.backward()
    b.backward()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(x1.grad, x2.grad)


@needs_cpu_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(dtype):
    sim = _sim(6, 9, 0.5, seed=51, dtype=dtype)
    h = (25.0, 24.0, 20.0, 21.0)
    torch.library.opcheck(fast_rerank_op, (sim.clone().requires_grad_(), *h))
    torch.library.opcheck(fast_rerank_op, (sim.t().contiguous().t().requires_grad_(), *h))
    torch.library.opcheck(fast_rerank_lse, (sim, 25.0, 20.0))
    _, _, stats = fast_rerank_op(sim, *h)
    g = torch.randn(6, 9, generator=_gen(52), dtype=torch.float64).to(dtype)
    torch.library.opcheck(fast_rerank_backward_op, (g, g.t().contiguous().t(), sim, stats, *h))
    torch.library.opcheck(fast_rerank_backward_op, (None, g, sim, stats, *h))


# ---- (5) bad input -------------------------------------------------------------------------------
BAD = [
    (lambda: [[0.1, 0.2]], {}, TypeError, "sim"),
    (lambda: torch.ones(3, 4, dtype=torch.int64), {}, TypeError, "sim"),
    (lambda: torch.ones(3), {}, ValueError, "sim"),
    (lambda: torch.ones(2, 3, 4), {}, ValueError, "sim"),
    (lambda: torch.ones(0, 4), {}, ValueError, "sim"),
    (lambda: torch.ones(3, 4), {"gamma": 25.0}, ValueError, "gamma"),
    (lambda: torch.ones(3, 4), {"gamma": (25.0, 25.0, 1.0)}, ValueError, "gamma"),
    (lambda: torch.ones(3, 4), {"gamma": (0.0, 25.0)}, ValueError, "gamma"),
    (lambda: torch.ones(3, 4), {"gamma": (25.0, -1.0)}, ValueError, "gamma"),
    (lambda: torch.ones(3, 4), {"gamma": (float("inf"), 1.0)}, ValueError, "gamma"),
    (lambda: torch.ones(3, 4), {"gamma": (float("nan"), 1.0)}, ValueError, "gamma"),
    (lambda: torch.ones(3, 4), {"gamma": (True, 1.0)}, ValueError, "gamma"),
    (lambda: torch.ones(3, 4), {"lam": (1.0, 0.0)}, ValueError, "lam"),
    (lambda: torch.ones(3, 4), {"lam": "20"}, ValueError, "lam"),
    (lambda: torch.ones(3, 4), {"impl": "fast"}, ValueError, "impl"),
]


@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("make,kwargs,err,name", BAD)
def test_bad_input(make, kwargs, err, name, impl):
    kwargs = dict(kwargs)
    kwargs.setdefault("impl", impl)
    if impl == "native" and not fastrank.backends()["cpu"]:
        pytest.skip("CPU module not built")
    with pytest.raises(err, match=name):
        fastrank.fast_rerank(make(), **kwargs)


@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [(0, 0), (2, 3), (600, 1500)])
def test_non_finite_sim(impl, bad, where):
    if impl == "native" and not fastrank.backends()["cpu"]:
        pytest.skip("CPU module not built")
    sim = torch.rand(601, 1501)
    sim[where] = bad
    with pytest.raises(ValueError, match="sim"):
        fastrank.fast_rerank(sim, impl=impl)
    with pytest.raises(ValueError, match="sim"):
        fastrank.fast_rerank(sim.t(), impl=impl)  # strided path


@needs_cpu_native
def test_overflowing_scale_is_an_error():
    sim = torch.full((3, 4), 3e37)  # finite, but 25 * sim overflows float32
    with pytest.raises(ValueError, match="sim"):
        fastrank.fast_rerank(sim, impl="native")


def _bad_sim(n, m, where, bad, device="cpu", dtype=torch.float32):
    sim = (torch.rand(n, m, generator=_gen(90), dtype=torch.float64) * 2 - 1).to(dtype).to(device)
    sim[where] = bad
    return sim


def _assert_propagates(sim, where, t=False):
    """Scores and gradient come back non-finite: at the bad element itself (its own scores
    and its gradient), whatever the rest of the row and column do."""
    x = sim.clone().requires_grad_()
    i2t, t2i = fastrank.fast_rerank(x.t() if t else x, impl="native")
    w = torch.randn(i2t.shape, generator=_gen(91), dtype=torch.float64).to(sim.dtype).to(sim.device)
    ((i2t * w).sum() + (t2i * w).sum()).backward()
    at = where[::-1] if t else where
    assert not torch.isfinite(i2t[at]) and not torch.isfinite(t2i[at])
    assert not torch.isfinite(x.grad[where])
    return i2t, t2i, x.grad


@needs_cpu_native
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("n,m,where", [(1, 1, (0, 0)), (3, 5, (2, 3)), (601, 1501, (600, 1500)),
                                       (601, 1501, (17, 1100))])
def test_non_finite_propagates_with_check_off(monkeypatch, bad, n, m, where):
    # docs/spec.md §1: FASTRANK_CHECK_FINITE=0 turns the CPU check off; the kernels must then
    # carry NaN/inf into the scores and the gradient (the path CUDA takes by default)
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    sim = _bad_sim(n, m, where, bad)
    _assert_propagates(sim, where)
    simt = _bad_sim(m, n, where[::-1], bad).t()  # strided (column-major) input, same bad element
    x = simt.clone().requires_grad_()
    assert x.stride() == (1, n)
    i2t, t2i = fastrank.fast_rerank(x, impl="native")
    assert not torch.isfinite(i2t[where]) and not torch.isfinite(t2i[where])
    (i2t.sum() + t2i.sum()).backward()
    assert not torch.isfinite(x.grad[where])
    # the Python switch does the same, and True brings the raising check back
    monkeypatch.delenv("FASTRANK_CHECK_FINITE")
    with pytest.raises(ValueError, match="sim"):
        fastrank.fast_rerank(sim, impl="native")
    fastrank._validation.set_check_finite(False)
    try:
        _assert_propagates(sim, where)
    finally:
        fastrank._validation.set_check_finite(None)


@needs_cpu_native
def test_non_finite_default_raises_float64_and_half():
    for dtype in (torch.float64, torch.float16):
        sim = _bad_sim(5, 7, (1, 2), float("nan"), dtype=dtype)
        with pytest.raises(ValueError, match="sim"):
            fastrank.fast_rerank(sim, impl="native")


def test_workspace_is_linear_in_n_plus_m():
    # besides the outputs (and the gradient), O(N + M) memory
    from fastrank._native import cpu_module, cuda_module
    for mod, bound in ((cpu_module(), 16), (cuda_module(), 128)):
        if mod is None:
            continue
        for n, m in [(1, 1), (4, 4), (1000, 5000), (5000, 25000), (100_000, 3), (3, 500_000), (20_000, 100_000)]:
            assert mod.fast_rerank_workspace(n, m) <= bound * (n + m), (mod.__name__, n, m)


def test_module_bad_hyper_parameters():
    with pytest.raises(ValueError, match="gamma"):
        fastrank.nn.FastRerank(gamma=(1.0, 0.0))
    with pytest.raises(ValueError, match="lam"):
        fastrank.nn.FastRerank(lam=(1.0,))
    with pytest.raises(ValueError, match="impl"):
        fastrank.nn.FastRerank(impl="gpu")


# ---- (6) determinism --------------------------------------------------------------------------------
@needs_cpu_native
def test_deterministic():
    sim = _sim(700, 2100, 0.4, seed=60, dtype=torch.float32)
    w = torch.randn(700, 2100, generator=_gen(61))
    outs = [_grad(lambda x: fastrank.fast_rerank(x, impl="native"), sim, w, w.t().contiguous().t())
            for _ in range(2)]
    for a, b in zip(*outs):
        assert torch.equal(a, b)


# ---- (7) CUDA ---------------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("name,base,view", CASES, ids=IDS)
def test_cuda_matches_reference_float32(name, base, view):
    sim = view(base)
    w1 = torch.randn(sim.shape, generator=_gen(70), dtype=torch.float64)
    w2 = torch.randn(sim.shape, generator=_gen(71), dtype=torch.float64)
    r1, r2, rg = _grad(lambda x: reference(x, GAMMA, LAM), sim, w1, w2)
    x = view(base.float().cuda())
    n1, n2, ng = _grad(lambda v: fastrank.fast_rerank(v, GAMMA, LAM, impl="native"), x, w1.float().cuda(),
                       w2.float().cuda())
    scale = float(sim.abs().max()) * 25 + 1
    torch.testing.assert_close(n1.double().cpu(), r1, rtol=1e-6, atol=1e-5 * scale)
    torch.testing.assert_close(n2.double().cpu(), r2, rtol=1e-6, atol=1e-5 * scale)
    # the gradient: the CPU test's rule (error relative to the exponent scale and the
    # gradient's magnitude), not an absolute bound that the float32 truth itself misses
    _, gatol = _tolerances(x, rg, w1, w2, torch.float32)
    torch.testing.assert_close(ng.double().cpu(), rg, rtol=0, atol=gatol)


@needs_cuda
def test_cuda_big_and_deterministic_and_memory():
    n, m = 1500, 7000
    sim = (torch.randn(n, m, device="cuda") * 0.3)
    w = torch.randn(n, m, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        i2t, t2i = fastrank.fast_rerank(sim, impl="native")
    torch.cuda.synchronize()
    one = n * m * 4
    assert torch.cuda.max_memory_allocated() - base <= 2 * one + 0.2 * one  # outputs + small stats
    r1, r2 = reference(sim.double())
    torch.testing.assert_close(i2t.double(), r1, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(t2i.double(), r2, rtol=1e-6, atol=1e-4)
    del i2t, t2i
    outs = [_grad(lambda x: fastrank.fast_rerank(x, impl="native"), sim, w, w) for _ in range(2)]
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_low_precision_error_bound(dtype):
    sim = (torch.randn(300, 700, generator=_gen(80)) * 0.3).to(dtype).cuda()
    w1 = torch.randn(300, 700, generator=_gen(81)).to(dtype).cuda()
    w2 = torch.randn(300, 700, generator=_gen(82)).to(dtype).cuda()
    t1, t2, tg = _grad(lambda x: reference(x), sim.double(), w1.double(), w2.double())
    n1, n2, ng = _grad(lambda x: fastrank.fast_rerank(x, impl="native"), sim, w1, w2)
    l1, l2, lg = _grad(lambda x: reference(x), sim, w1, w2)  # pure PyTorch in the same precision
    assert n1.dtype == dtype and ng.dtype == dtype
    for nat, low, truth in ((n1, l1, t1), (n2, l2, t2), (ng, lg, tg)):
        err_native = (nat.double() - truth).abs().max().item()
        err_low = (low.double() - truth).abs().max().item()
        assert err_native <= low_precision_bound(err_low), (err_native, err_low)


# ---- (8) CUDA: one cheap call, memory (two outputs + O(N + M)), docs/spec.md §1 -----------------------
def _fwd_bwd(x, g1, g2):
    """One native forward + backward with preallocated upstream gradients (no other op)."""
    i2t, t2i = fastrank.fast_rerank(x, impl="native")
    torch.autograd.backward((i2t, t2i), (g1, g2))
    return i2t, t2i


@needs_cuda
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_non_finite_propagates_by_default(monkeypatch, bad, dtype):
    # no check, no host sync by default on CUDA: NaN/inf must come back in scores and gradient
    monkeypatch.delenv("FASTRANK_CHECK_FINITE", raising=False)
    for n, m, where in [(3, 5, (2, 3)), (300, 700, (299, 1)), (130, 2100, (64, 2050))]:
        sim = _bad_sim(n, m, where, bad, device="cuda", dtype=dtype)
        _assert_propagates(sim, where)
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "1")  # the debugging switch: raises on CUDA too
    with pytest.raises(ValueError, match="sim"):
        fastrank.fast_rerank(sim, impl="native")


def _device_activity(prof):
    """(names of all device-side events, names of the kernels among them) of a profile."""
    from torch.autograd import DeviceType
    names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    kernels = [k for k in names if not k.startswith(("Memcpy", "Memset")) and "sync" not in k.lower()]
    return names, kernels


@needs_cuda
@pytest.mark.parametrize("n,m", [(8, 8), (256, 256), (100, 3000), (1000, 5000)])
def test_cuda_launch_count_and_no_host_copy(n, m):
    from torch.profiler import ProfilerActivity, profile
    x = (torch.randn(n, m, device="cuda") * 0.3).requires_grad_()
    g1, g2 = torch.randn(n, m, device="cuda"), torch.randn(n, m, device="cuda")
    _fwd_bwd(x, g1, g2)  # warm up (first-call allocations, lazy init)
    x.grad = None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _fwd_bwd(x, g1, g2)
        torch.cuda.synchronize()
    names, kernels = _device_activity(prof)
    assert not [k for k in names if "DtoH" in k or "Device -> Pageable" in k], names
    assert not [k for k in names if k.startswith("Memcpy")], names
    # 3 launches forward + 3 backward, the same at every size (nothing else: no dtype copies,
    # no checks, no torch ops around the kernels)
    assert 1 <= len(kernels) <= 6, kernels


@needs_cuda
def test_cuda_launch_count_equal_across_sizes_and_dtypes():
    from torch.profiler import ProfilerActivity, profile
    counts = {}
    for (n, m) in [(8, 8), (256, 256), (2000, 9000)]:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = (torch.randn(n, m, device="cuda") * 0.3).to(dtype).requires_grad_()
            g = torch.randn(n, m, device="cuda").to(dtype)
            _fwd_bwd(x, g, g)
            x.grad = None  # a second backward would add into x.grad: an extra (non-fastrank) kernel
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                _fwd_bwd(x, g, g)
                torch.cuda.synchronize()
            names, kernels = _device_activity(prof)
            assert not [k for k in names if k.startswith("Memcpy")], names
            counts[(n, m, dtype)] = len(kernels)
    assert len(set(counts.values())) == 1 and next(iter(counts.values())) <= 6, counts


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_graph_capture_replay_equals_eager(dtype):
    n, m = 96, 333
    static_x = (torch.randn(n, m, device="cuda") * 0.5).to(dtype).requires_grad_()
    w = torch.randn(n, m, device="cuda").to(dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as the CUDA-graph docs ask
        for _ in range(2):
            static_x.grad = None
            a, b = fastrank.fast_rerank(static_x, impl="native")
            ((a * w).sum() + b.logsumexp(0).sum()).backward()
    torch.cuda.current_stream().wait_stream(side)
    static_x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a, b = fastrank.fast_rerank(static_x, impl="native")
        loss = (a * w).sum() + b.logsumexp(0).sum()
        loss.backward()
    for seed in (1, 2):
        new = (torch.randn(n, m, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) * 0.5)
        with torch.no_grad():
            static_x.copy_(new.to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        y = static_x.detach().clone().requires_grad_()
        ea, eb = fastrank.fast_rerank(y, impl="native")
        el = (ea * w).sum() + eb.logsumexp(0).sum()
        el.backward()
        assert torch.equal(a, ea) and torch.equal(b, eb)  # deterministic kernels: bit-identical
        torch.testing.assert_close(loss, el)
        assert torch.equal(static_x.grad, y.grad)


@needs_cuda
def test_cuda_compile_reduce_overhead_training_step():
    torch._dynamo.reset()
    torch.manual_seed(0)
    img_model = torch.nn.Linear(32, 16).cuda()
    txt_model = torch.nn.Linear(32, 16).cuda()
    params = list(img_model.parameters()) + list(txt_model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    a, b = torch.randn(64, 32, device="cuda"), torch.randn(64, 32, device="cuda")

    def loss_fn(a, b):
        sim = torch.nn.functional.normalize(img_model(a), dim=1) @ torch.nn.functional.normalize(
            txt_model(b), dim=1).t()
        i2t, t2i = fastrank.fast_rerank(sim, impl="native")
        return -(i2t.diagonal().mean() + t2i.diagonal().mean())

    eager = loss_fn(a, b).detach().clone()
    compiled = torch.compile(loss_fn, mode="reduce-overhead")
    losses = []
    for _ in range(4):
        loss = compiled(a, b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    torch.testing.assert_close(torch.tensor(losses[0]), eager.cpu(), rtol=1e-4, atol=1e-4)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


@needs_cuda
def test_cuda_compile_fullgraph_and_opcheck():
    def f(s):
        i2t, t2i = fastrank.fast_rerank(s, (20.0, 22.0), (15.0, 16.0), impl="native")
        return (i2t * 0.5).sum() + t2i.logsumexp(dim=0).sum()

    torch._dynamo.reset()
    sim = (torch.randn(40, 70, device="cuda") * 0.3)
    x1, x2 = sim.clone().requires_grad_(), sim.clone().requires_grad_()
    a = torch.compile(f, fullgraph=True)(x1)
    b = f(x2)
    a.backward()
    b.backward()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(x1.grad, x2.grad)
    h = (25.0, 24.0, 20.0, 21.0)
    for dtype in (torch.float32, torch.float16):
        s = sim.to(dtype)
        torch.library.opcheck(fast_rerank_op, (s.clone().requires_grad_(), *h))
        _, _, stats = fast_rerank_op(s, *h)
        g = torch.randn(40, 70, device="cuda").to(dtype)
        torch.library.opcheck(fast_rerank_backward_op, (g, g.t().contiguous().t(), s, stats, *h))
        torch.library.opcheck(fast_rerank_backward_op, (None, g, s, stats, *h))


@needs_cuda
def test_cuda_backward_memory_is_one_gradient():
    # the backward allocates the gradient + O(N + M), nothing else (N, M)-sized
    n, m = 1500, 7000
    x = (torch.randn(n, m, device="cuda") * 0.3).requires_grad_()
    g1, g2 = torch.randn(n, m, device="cuda"), torch.randn(n, m, device="cuda")
    i2t, t2i = fastrank.fast_rerank(x, impl="native")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.autograd.backward((i2t, t2i), (g1, g2))
    torch.cuda.synchronize()
    one = n * m * 4
    assert torch.cuda.max_memory_allocated() - base <= one + 0.1 * one


# ---- CUDA test matrix (marked cuda_matrix) -------------------------------------------------------
# fast_rerank's CUDA kernels (lse_tile_kernel, lse_merge_kernel, scores_kernel,
# sums_tile_kernel, sums_merge_kernel, grad_kernel) against the reference,
# with the checks of tests/_cuda_matrix.py: on a GPU, or emulated on the CPU by
# tests/test_emulated.py; deselected where neither can run (tests/conftest.py).
MATRIX_GAMMA, MATRIX_LAM = (25.0, 20.0), (20.0, 15.0)
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
        i2t, t2i = fastrank.fast_rerank(s, MATRIX_GAMMA, MATRIX_LAM, impl=impl)
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


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, n, m, dtype):
    sim, _ = case(n, m, seed=n + m, scale=0.3)
    check(sim, device, dtype)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("which", [("i2t",), ("t2i",)])
def test_one_output_used(device, which):
    """The other output's gradient is None: the backward reads a null pointer for it."""
    sim, _ = case(40, 50, seed=2, scale=0.3)
    check(sim, device, torch.float64, which=which)


@pytest.mark.cuda_matrix
def test_expanded_grads(device):
    sim, _ = case(40, 50, seed=3, scale=0.3)
    check(sim, device, torch.float64, grad_layout="expanded")


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("how", ["transposed", "strided"])
def test_transposed_and_strided_inputs(device, how):
    sim, _ = case(45, 70, seed=4, scale=0.3)
    check(layout(sim, how, device), device, torch.float64)


@pytest.mark.cuda_matrix
def test_grid_strided_tiles(device):
    """More column tiles than the statistics grid's 32 block columns (m > 8192)."""
    sim, _ = case(3, 8300, seed=5, scale=0.3)
    check(sim, device, torch.float64)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_error_bound(device, dtype):
    sim, _ = case(40, 60, seed=6, scale=0.3)
    rounded = sim.to(dtype).double()
    want = run(rounded, torch.device("cpu"), torch.float64, impl="reference")
    got = run(rounded, device, dtype)
    lp = run(rounded.to(dtype), torch.device("cpu"), dtype, impl="reference")
    err = lambda x: max((a.double().cpu() - b).abs().max().item() for a, b in zip(x, want))
    assert got[0].dtype == dtype and got[2].dtype == dtype
    assert err(got) <= low_precision_bound(err(lp)), (err(got), err(lp))


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_propagates(device, no_finite_check, bad):
    sim, _ = case(9, 11, seed=7)
    sim[2, 3] = bad
    s = sim.to(device).requires_grad_(True)
    i2t, t2i = fastrank.fast_rerank(s, impl="native")
    (i2t.sum() + t2i.sum()).backward()
    assert not torch.isfinite(i2t).all() and not torch.isfinite(t2i).all() and not torch.isfinite(s.grad).all()


@pytest.mark.cuda_matrix
@pytest.mark.skipif(not EMULATED, reason="the launch log is the emulator's")
def test_launches_per_call(device):
    s = case(40, 30, seed=10)[0].requires_grad_(True)
    assert launches(lambda: sum(x.sum() for x in fastrank.fast_rerank(s, impl="native")).backward()) == \
        ["lse_tile_kernel", "lse_merge_kernel", "scores_kernel", "sums_tile_kernel", "sums_merge_kernel", "grad_kernel"]


@pytest.mark.cuda_matrix
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
