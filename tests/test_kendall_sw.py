"""kendall_sw_loss (docs/spec.md §2.3; BCLS, Eq. 18-20, SW-HS): oracle, reference, native, the CUDA
test matrix."""
import itertools

import pytest
import torch

import _cuda_checks
import fastrank
from _cuda_matrix import EMULATED, SCHEDULES, GradedLossCases, case, check_loss, dry_run_launches
from fastrank.ops.kendall_sw import kendall_sw_backward_op, kendall_sw_op
from fastrank.reference.kendall_sw import edge_tensors, kendall_sw_per_query, sw_edges


def n_windows(alpha, beta, label_range):
    return round((label_range[1] - label_range[0] - alpha) / beta)


def sw_fwd(s, r, alpha=0.1, beta=0.05, label_range=(0.0, 1.0)):
    """The fused op on the rows of s (i2t, reduction none): (per-query loss, idx, aux)."""
    return kendall_sw_op(s, r, alpha, beta, label_range[1], n_windows(alpha, beta, label_range), 1, 0)


def sw_bwd(grad_loss, s, idx, aux):
    return kendall_sw_backward_op(grad_loss, s, idx, aux, 1, 0)

CUDA = fastrank.backends()["cuda_available"]
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
DIRECTIONS = ("i2t", "t2i", "both")
REDUCTIONS = ("mean", "sum", "none")


# ---- oracle: plain Python loops in float64, written from docs/spec.md §2.3 -------------------
def oracle_query(s, r, alpha, beta, label_range):
    """(loss, d loss / d s, [(j*, k*) per window, -1 for empty]) of one query."""
    lo, hi = label_range
    n_w = round((hi - lo - alpha) / beta)
    n = len(s)
    total, grad, pairs = 0.0, [0.0] * n, []
    for m in range(1, n_w + 1):
        u = hi - (m - 1) * beta
        l = u - alpha
        pos = [j for j in range(n) if r[j] >= u]
        neg = [k for k in range(n) if r[k] < l]
        j = min(pos, key=lambda c: (s[c], c)) if pos else -1   # lowest score, then lowest index
        k = min(neg, key=lambda c: (-s[c], c)) if neg else -1  # highest score, then lowest index
        pairs.append((j, k))
        if j >= 0 and k >= 0 and s[k] - s[j] > 0:
            total += s[k] - s[j]
            grad[k] += 1.0 / n_w
            grad[j] -= 1.0 / n_w
    return total / n_w, grad, pairs


def oracle(sim, rel, alpha=0.1, beta=0.05, label_range=(0.0, 1.0), direction="both", reduction="mean"):
    sim_l, rel_l = sim.double().tolist(), rel.double().tolist()
    n, m = len(sim_l), len(sim_l[0])
    parts = []
    for d in (["i2t", "t2i"] if direction == "both" else [direction]):
        losses, grads = [], {}
        n_q, n_c = (n, m) if d == "i2t" else (m, n)
        for q in range(n_q):
            if d == "i2t":
                s, r = sim_l[q], rel_l[q]
            else:
                s, r = [sim_l[i][q] for i in range(n)], [rel_l[i][q] for i in range(n)]
            loss, g, _ = oracle_query(s, r, alpha, beta, label_range)
            losses.append(loss)
            for c in range(n_c):
                grads[(q, c) if d == "i2t" else (c, q)] = g[c]
        parts.append((losses, grads))
    if reduction == "none":
        return [x for losses, _ in parts for x in losses], None
    grad = torch.zeros(n, m, dtype=torch.float64)
    for losses, grads in parts:
        w = 1.0 if reduction == "sum" else 1.0 / len(losses)
        for (i, j), v in grads.items():
            grad[i, j] += w * v
    total = sum((sum(l) if reduction == "sum" else sum(l) / len(l)) for l, _ in parts)
    return total, grad


def loss_and_grad(sim, rel, **kw):
    s = sim.detach().clone().requires_grad_(True)
    loss = fastrank.kendall_sw_loss(s, rel, **kw)
    (loss.sum() if loss.dim() else loss).backward()
    return loss.detach(), s.grad


def rand_case(n, m, seed, kind="random", dtype=torch.float32, alpha=0.1, beta=0.05, label_range=(0.0, 1.0)):
    g = torch.Generator().manual_seed(seed)
    sim = torch.randn(n, m, generator=g, dtype=torch.float64)
    lo, hi = label_range
    rel = lo + (hi - lo) * torch.rand(n, m, generator=g, dtype=torch.float64)
    if kind == "ties":  # ties in sim and in relevance
        sim = torch.randint(-2, 3, (n, m), generator=g).double() * 0.5
        rel = lo + (hi - lo) * torch.randint(0, 11, (n, m), generator=g).double() / 10
    elif kind == "edges":  # every relevance exactly on a window edge (as the dtype rounds it)
        upper, lower = sw_edges(alpha, beta, label_range)
        edges = torch.tensor(upper + lower, dtype=torch.float64).to(dtype).double()
        rel = edges[torch.randint(0, len(edges), (n, m), generator=g)]
    elif kind == "equal_rel":
        rel = torch.full((n, m), lo + 0.5 * (hi - lo), dtype=torch.float64)
    elif kind == "zero_rel":
        rel = torch.full((n, m), lo, dtype=torch.float64)
    elif kind == "large":
        sim = sim * 1e4
    return sim.to(dtype), rel.to(dtype)


# ---- windows ---------------------------------------------------------------------------
def test_windows():
    upper, lower = sw_edges(0.1, 0.05, (0.0, 1.0))
    assert len(upper) == 18 and upper[0] == 1.0 and lower[0] == pytest.approx(0.9)
    assert upper[-1] == pytest.approx(0.15) and lower[-1] == pytest.approx(0.05)
    upper, lower = sw_edges(0.2, 0.1, (-1.0, 1.0))  # the paper's (2 - alpha) / beta
    assert len(upper) == 18
    assert all(a >= b for a, b in zip(upper, upper[1:])) and all(a >= b for a, b in zip(lower, lower[1:]))
    assert len(sw_edges(0.5, 0.5, (0.0, 1.0))[0]) == 1


def test_argmin_argmax_first_occurrence():
    # the reference's tie rule relies on it
    x = torch.tensor([[3.0, 1.0, 1.0, 5.0, 5.0]])
    assert x.argmin(dim=1).item() == 1 and x.argmax(dim=1).item() == 3


# ---- (1) reference vs oracle (float64) ----------------------------------------------
@pytest.mark.parametrize("direction,reduction", list(itertools.product(DIRECTIONS, REDUCTIONS)))
@pytest.mark.parametrize("kind", ["random", "ties", "edges"])
def test_reference_matches_oracle(direction, reduction, kind):
    sim, rel = rand_case(6, 9, 1, kind, torch.float64)
    want, want_grad = oracle(sim, rel, direction=direction, reduction=reduction)
    loss, grad = loss_and_grad(sim, rel, direction=direction, reduction=reduction, impl="reference")
    torch.testing.assert_close(loss, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    if want_grad is not None:
        torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("params", [(0.1, 0.05, (0.0, 1.0)), (0.2, 0.1, (-1.0, 1.0)), (0.0, 0.3, (0.0, 1.0)),
                                    (0.05, 0.001, (0.0, 1.0))])
@pytest.mark.parametrize("kind", ["random", "ties", "edges"])
def test_native_matches_oracle_with_indices(params, kind):
    alpha, beta, label_range = params
    sim, rel = rand_case(5, 11, 2, kind, torch.float64, alpha, beta, label_range)
    want, want_grad = oracle(sim, rel, alpha, beta, label_range)
    loss, grad = loss_and_grad(sim, rel, alpha=alpha, beta=beta, label_range=label_range, impl="native")
    torch.testing.assert_close(loss, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    # the recorded hard pairs are the oracle's (lowest index on ties, -1 when empty)
    for s, r in ((sim, rel), (sim.t(), rel.t())):
        _, idx, _ = sw_fwd(s, r, alpha, beta, label_range)
        for q in range(s.shape[0]):
            _, _, pairs = oracle_query(s[q].tolist(), r[q].tolist(), alpha, beta, label_range)
            assert idx[q].tolist() == [list(p) for p in pairs]


def test_hand_example():
    # r = (1.0, 0.5, 0.0), s = (0, 1, 2); alpha = 0.1, beta = 0.05: 18 windows, u_m = 1 - 0.05 (m-1).
    # window 1 (u=1, l=0.9): P={0}, N={1,2}: k*=2 -> [2 - 0]+ = 2. Windows 2..10 (u in [0.55, 0.95]):
    # P={0}, N={1,2} or {2} as l passes 0.5 -> always k* = 2: +2 each. Windows 11..18 (u <= 0.5):
    # P={0,1}, j*=0, N={2} (l = u - 0.1 > 0) -> +2. Loss = 2.
    sim, rel = torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[1.0, 0.5, 0.0]])
    for impl in ("reference", "native"):
        assert fastrank.kendall_sw_loss(sim, rel, direction="i2t", impl=impl).item() == pytest.approx(2.0)


# ---- (2) native vs reference ---------------------------------------------------------
SHAPES = [(7, 5), (5, 7), (1, 6), (6, 1), (1, 1), (2, 2), (13, 2), (33, 40)]
KINDS = ["random", "ties", "edges", "equal_rel", "zero_rel", "large"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_matches_reference(shape, kind, dtype):
    sim, rel = rand_case(*shape, seed=hash((shape, kind)) % 1000, kind=kind, dtype=dtype)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    if kind == "large":
        tol = dict(rtol=1e-6, atol=1e-2) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-9)
    # every direction per query ("none"), and the two reductions of "both"
    for direction, reduction in (("i2t", "none"), ("t2i", "none"), ("both", "mean"), ("both", "sum")):
        kw = dict(direction=direction, reduction=reduction)
        l_n, g_n = loss_and_grad(sim, rel, impl="native", **kw)
        l_r, g_r = loss_and_grad(sim, rel, impl="reference", **kw)
        assert l_n.dtype == l_r.dtype and g_n.dtype == sim.dtype
        torch.testing.assert_close(l_n, l_r, **tol)
        torch.testing.assert_close(g_n, g_r, rtol=tol["rtol"], atol=1e-7 if dtype == torch.float32 else 1e-14)


@pytest.mark.parametrize("params", [(0.2, 0.1, (-1.0, 1.0)), (0.1, 0.04, (0.0, 1.0)), (0.6, 0.4, (0.0, 1.0)),
                                    (0.1, 0.001, (0.0, 1.0)), (0.0, 0.25, (2.0, 3.0))])
@pytest.mark.parametrize("kind", ["random", "ties", "edges"])
def test_native_matches_reference_hyperparameters(params, kind):
    alpha, beta, label_range = params
    sim, rel = rand_case(9, 14, 3, kind, torch.float32, alpha, beta, label_range)
    kw = dict(alpha=alpha, beta=beta, label_range=label_range, reduction="none")
    l_n, g_n = loss_and_grad(sim, rel, impl="native", **kw)
    l_r, g_r = loss_and_grad(sim, rel, impl="reference", **kw)
    torch.testing.assert_close(l_n, l_r, rtol=1e-6, atol=1e-6)
    # the reference adds 1 / M_w once per window in float32 (M_w = 900 here at most): 1e-5
    torch.testing.assert_close(g_n, g_r, rtol=1e-4, atol=1e-7)


def test_empty_windows_give_zero():
    sim = torch.randn(4, 6)
    for rel in (torch.zeros(4, 6), torch.ones(4, 6), torch.full((4, 6), 0.5)):
        # no positive in any window / no negative in any window / all in the same band
        for impl in ("native", "reference"):
            loss, grad = loss_and_grad(sim, rel, reduction="none", impl=impl)
            assert torch.equal(loss, torch.zeros(10)) and torch.equal(grad, torch.zeros(4, 6))
    sim2 = torch.tensor([[0.0, 1.0]])
    rel2 = torch.tensor([[1.0, 0.0]])
    _, idx, _ = sw_fwd(sim2[:, :1], rel2[:, :1])  # one positive, no negative
    assert (idx[..., 0] == 0).all() and (idx[..., 1] == -1).all()


def test_relevance_on_edges_membership():
    # r exactly u_m is a positive of window m, r exactly l_m is not a negative of it
    upper, lower = sw_edges(0.1, 0.05, (0.0, 1.0))
    m = 4
    rel = torch.tensor([[upper[m], lower[m], lower[m] - 0.01]], dtype=torch.float32)
    sim = torch.tensor([[0.0, 5.0, 1.0]])
    u_t, l_t = edge_tensors(0.1, 0.05, (0.0, 1.0), torch.float32, sim.device)
    _, idx, _ = sw_fwd(sim, rel)
    assert idx[0, m].tolist() == [0, 2]
    ref = kendall_sw_per_query(sim, rel, u_t, l_t)
    torch.testing.assert_close(fastrank.kendall_sw_loss(sim, rel, direction="i2t", reduction="none"), ref)


def test_ties_lowest_index():
    sim = torch.tensor([[1.0, 0.0, 0.0, 3.0, 3.0, 2.0]])
    rel = torch.tensor([[1.0, 0.95, 0.95, 0.1, 0.1, 0.0]])
    _, idx, _ = sw_fwd(sim, rel)
    assert idx[0, 0].tolist() == [0, 3]   # window 1 (u=1, l=0.9): P={0}, N={3,4,5}, max 3.0 at 3 and 4
    assert idx[0, 1].tolist() == [1, 3]   # window 2 (u=0.95): P={0,1,2}, min 0.0 at 1 and 2


def test_native_matches_reference_noncontiguous():
    g = torch.Generator().manual_seed(4)
    sim = torch.randn(20, 30, generator=g)[::2, 1::3]
    rel = torch.rand(30, 20, generator=g).t()[1::2, ::3]
    assert not sim.is_contiguous() and not rel.is_contiguous()
    l_n, g_n = loss_and_grad(sim, rel, impl="native")
    l_r, g_r = loss_and_grad(sim.contiguous(), rel.contiguous(), impl="reference")
    torch.testing.assert_close(l_n, l_r)
    torch.testing.assert_close(g_n, g_r)


def test_half_inputs_on_cpu():
    sim, rel = rand_case(6, 9, 5)
    for dt in (torch.float16, torch.bfloat16):
        l_n, g_n = loss_and_grad(sim.to(dt), rel, impl="native")
        l_r, g_r = loss_and_grad(sim.to(dt).float(), rel, impl="reference")
        assert g_n.dtype == dt and l_n.dtype == torch.float32
        torch.testing.assert_close(l_n, l_r, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(g_n.float(), g_r.to(dt).float(), rtol=1e-2, atol=1e-4)  # 1 ulp of dt


def test_module_form():
    sim, rel = rand_case(5, 6, 6)
    mod = fastrank.nn.KendallSWLoss(alpha=0.2, beta=0.1, label_range=(0.0, 1.0), reduction="sum")
    assert "beta=0.1" in repr(mod)
    torch.testing.assert_close(mod(sim, rel), fastrank.kendall_sw_loss(sim, rel, 0.2, 0.1, reduction="sum"))
    with pytest.raises(ValueError, match="beta"):
        fastrank.nn.KendallSWLoss(beta=0.0)


# ---- (3) gradcheck --------------------------------------------------------------------
def test_gradcheck_native_float64():
    g = torch.Generator().manual_seed(7)
    n, m = 5, 7
    sim = (torch.randperm(n * m, generator=g).double() * 0.1).reshape(n, m).requires_grad_(True)
    rel = torch.rand(n, m, generator=g, dtype=torch.float64)
    for direction in DIRECTIONS:
        assert torch.autograd.gradcheck(
            lambda s: fastrank.kendall_sw_loss(s, rel, direction=direction, reduction="none", impl="native"),
            (sim,), eps=1e-6, atol=1e-8)


# ---- (4) torch.compile and opcheck ------------------------------------------------------
def test_opcheck():
    sim, rel = rand_case(5, 7, 8)
    for s, r in ((sim, rel), (sim.t(), rel.t()), (sim.double(), rel.double())):
        for d, red in ((1, 0), (2, 1), (3, 2), (3, 0)):
            args = (0.1, 0.05, 1.0, 18, d, red)
            torch.library.opcheck(kendall_sw_op, (s.clone().requires_grad_(True), r) + args)
            loss, idx, aux = kendall_sw_op(s, r, *args)
            grad_loss = torch.rand(loss.shape, dtype=r.dtype)
            torch.library.opcheck(kendall_sw_backward_op, (grad_loss, s, idx, aux, d, red))


def test_torch_compile_fullgraph():
    sim, rel = rand_case(6, 8, 9)

    def f(s, r):
        return fastrank.kendall_sw_loss(s, r, alpha=0.1, beta=0.05, impl="native") * 2.0

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    s1 = sim.clone().requires_grad_(True)
    s2 = sim.clone().requires_grad_(True)
    out_c, out_e = compiled(s1, rel), f(s2, rel)
    torch.testing.assert_close(out_c, out_e)
    out_c.backward()
    out_e.backward()
    torch.testing.assert_close(s1.grad, s2.grad)


# ---- (5) bad inputs -----------------------------------------------------------------
def test_bad_inputs():
    sim, rel = rand_case(4, 4, 10)
    f = fastrank.kendall_sw_loss
    with pytest.raises(TypeError, match="sim"):
        f(sim.numpy(), rel)
    with pytest.raises(TypeError, match="sim"):
        f(sim.int(), rel)
    with pytest.raises(TypeError, match="relevance"):
        f(sim, rel.bool())
    with pytest.raises(ValueError, match="sim"):
        f(sim.unsqueeze(0), rel.unsqueeze(0))
    with pytest.raises(ValueError, match="sim"):
        f(sim[:, :0], rel[:, :0])
    with pytest.raises(ValueError, match="relevance"):
        f(sim, rel.t()[:, :3])
    for bad in (float("nan"), float("-inf")):
        s = sim.clone()
        s[0, 3] = bad
        with pytest.raises(ValueError, match="sim"):
            f(s, rel)
        r = rel.clone()
        r[2, 1] = bad
        with pytest.raises(ValueError, match="relevance"):
            f(sim, r)
    for alpha in (-0.01, float("nan"), float("inf"), None):
        with pytest.raises(ValueError, match="alpha"):
            f(sim, rel, alpha=alpha)
    for beta in (0.0, -0.05, float("nan"), float("inf"), "0.05"):
        with pytest.raises(ValueError, match="beta"):
            f(sim, rel, beta=beta)
    for lr in ((1.0, 0.0), (0.5, 0.5), (0.0,), (0.0, 1.0, 2.0), (0.0, float("inf")), (float("nan"), 1.0),
               "01", None, (0.0, "1")):
        with pytest.raises(ValueError, match="label_range"):
            f(sim, rel, label_range=lr)
    # fewer than one window: M_w = round((hi - lo - alpha) / beta) < 1
    for alpha, beta in ((1.0, 0.05), (0.9, 0.3), (2.0, 0.1)):
        with pytest.raises(ValueError, match="M_w"):
            f(sim, rel, alpha=alpha, beta=beta)
    with pytest.raises(ValueError, match="direction"):
        f(sim, rel, direction="both_ways")
    with pytest.raises(ValueError, match="reduction"):
        f(sim, rel, reduction="max")
    with pytest.raises(ValueError, match="impl"):
        f(sim, rel, impl="cuda")


@needs_cuda
def test_bad_device_mix():
    sim, rel = rand_case(4, 4, 9)
    with pytest.raises(ValueError, match="relevance"):
        fastrank.kendall_sw_loss(sim.cuda(), rel)


@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_relevance_outside_label_range(impl, monkeypatch):
    """docs/spec.md §1: values outside label_range are bad input, from the finite check's pass and
    under its switch."""
    sim, rel = rand_case(4, 5, 20)
    f = fastrank.kendall_sw_loss
    cos = rel * 2 - 1                                  # [-1, 1] labels with the default (0, 1) range
    with pytest.raises(ValueError, match=r"relevance must lie in label_range \[0, 1\].*values in \[-"):
        f(sim, cos, impl=impl)
    with pytest.raises(ValueError, match="relevance must lie in label_range"):
        f(sim, rel + 0.5, impl=impl)                   # above hi
    with pytest.raises(ValueError, match="relevance must lie in label_range"):
        fastrank.nn.KendallSWLoss()(sim, cos)
    f(sim, cos, label_range=(-1.0, 1.0), impl=impl)    # the paper's [-1, 1] labels, declared
    f(sim, torch.ones_like(rel), impl=impl)            # the ends of the range are inside
    f(sim, torch.zeros_like(rel), impl=impl)
    with pytest.raises(ValueError, match="relevance contains NaN"):   # NaN before the range
        f(sim, torch.full_like(rel, float("nan")), impl=impl)
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    f(sim, cos, impl=impl)


def test_structure_before_values():
    sim, rel = rand_case(3, 3, 21)
    sim[0, 0] = float("nan")
    with pytest.raises(ValueError, match="relevance is on meta but sim is on cpu"):
        fastrank.kendall_sw_loss(sim, torch.empty(3, 3, device="meta"))
    with pytest.raises(ValueError, match="label_range"):   # hyper-parameters before the data
        fastrank.kendall_sw_loss(sim, rel, label_range=(1.0, 0.0))


def test_hyper_parameters_accept_numpy_and_tensors():
    import numpy as np
    sim, rel = rand_case(5, 5, 22)
    want = fastrank.kendall_sw_loss(sim, rel, alpha=0.2, beta=0.1, label_range=(0.0, 1.0))
    for kw in (dict(alpha=np.float64(0.2), beta=torch.tensor(0.1, dtype=torch.float64)),
               dict(alpha=torch.tensor(0.2, dtype=torch.float64), beta=np.float64(0.1),
                    label_range=(np.float32(0.0), torch.tensor(1.0))),
               dict(alpha=0.2, beta=0.1, label_range=np.array([0.0, 1.0]))):
        kw = {"label_range": (0.0, 1.0), **kw}
        torch.testing.assert_close(fastrank.kendall_sw_loss(sim, rel, **kw), want)
    with pytest.raises(ValueError, match=r"beta must be a finite number > 0, got 0.0 \(a 0-d torch.float32 tensor\)"):
        fastrank.kendall_sw_loss(sim, rel, beta=torch.tensor(0.0))


# ---- (6) determinism --------------------------------------------------------------------
def test_deterministic():
    sim, rel = rand_case(97, 61, 11, kind="ties")
    l1, g1 = loss_and_grad(sim, rel, impl="native")
    l2, g2 = loss_and_grad(sim, rel, impl="native")
    assert torch.equal(l1, l2) and torch.equal(g1, g2)


# ---- (7) CUDA ---------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (1, 7), (7, 1), (37, 300), (300, 37), (1100, 1030)])
@pytest.mark.parametrize("kind", ["random", "ties", "edges", "zero_rel"])
def test_cuda_matches_cpu_reference(shape, kind):
    sim, rel = rand_case(*shape, seed=12, kind=kind)
    for direction in DIRECTIONS:
        l_c, g_c = loss_and_grad(sim.cuda(), rel.cuda(), direction=direction, reduction="none", impl="native")
        l_r, g_r = loss_and_grad(sim, rel, direction=direction, reduction="none", impl="reference")
        torch.testing.assert_close(l_c.cpu(), l_r, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(g_c.cpu(), g_r, rtol=1e-6, atol=1e-7)


@needs_cuda
@pytest.mark.parametrize("params", [(0.1, 0.05, (0.0, 1.0)), (0.05, 0.0005, (0.0, 1.0)), (0.2, 0.1, (-1.0, 1.0))])
def test_cuda_indices_match_cpu(params):
    # (0.05, 0.0005) gives 1900 windows: several window chunks per block
    alpha, beta, label_range = params
    sim, rel = rand_case(50, 70, 13, "ties", torch.float32, alpha, beta, label_range)
    for s, r in ((sim, rel), (sim.t(), rel.t())):
        l_cpu, idx_cpu, aux_cpu = sw_fwd(s, r, alpha, beta, label_range)
        l_gpu, idx_gpu, aux_gpu = sw_fwd(s.cuda(), r.cuda(), alpha, beta, label_range)
        assert torch.equal(idx_gpu.cpu(), idx_cpu)
        torch.testing.assert_close(l_gpu.cpu(), l_cpu)
        gl = torch.rand(s.shape[0])
        torch.testing.assert_close(sw_bwd(gl.cuda(), s.cuda(), idx_gpu, aux_gpu).cpu(), sw_bwd(gl, s, idx_cpu, aux_cpu))


@needs_cuda
def test_cuda_float64_and_deterministic():
    sim, rel = rand_case(300, 200, 14, dtype=torch.float64)
    l_c, g_c = loss_and_grad(sim.cuda(), rel.cuda(), impl="native")
    l_2, g_2 = loss_and_grad(sim.cuda(), rel.cuda(), impl="native")
    l_r, g_r = loss_and_grad(sim, rel, impl="reference")
    torch.testing.assert_close(l_c.cpu(), l_r, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_c.cpu(), g_r, rtol=1e-12, atol=1e-14)
    assert torch.equal(l_c, l_2) and torch.equal(g_c, g_2)


@needs_cuda
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_cuda_low_precision_error(dt):
    def both(s, r):  # per-query losses of both directions, window membership in float32
        upper, lower = edge_tensors(0.1, 0.05, (0.0, 1.0), torch.float32, s.device)
        return torch.cat([kendall_sw_per_query(s, r, upper, lower), kendall_sw_per_query(s.t(), r.t(), upper, lower)])

    sim, rel = rand_case(96, 80, 15)
    sim_lp = sim.to(dt)
    # exact: float64 arithmetic on the low-precision inputs
    s64 = sim_lp.double().requires_grad_(True)
    exact_l = both(s64, rel)
    exact_l.sum().backward()
    exact_l, exact_g = exact_l.detach(), s64.grad
    l_k, g_k = loss_and_grad(sim_lp.cuda(), rel.cuda(), reduction="none", impl="native")
    # the pure-PyTorch reference run in the same low precision, as a user would
    s = sim_lp.cuda().requires_grad_(True)
    l_ref = both(s, rel.cuda())
    l_ref.sum().backward()
    err = lambda a, b: (a.double().cpu() - b).abs().max().item()
    assert g_k.dtype == dt
    assert err(l_k, exact_l) <= 2 * err(l_ref, exact_l) + 1e-6
    assert err(g_k, exact_g) <= 2 * err(s.grad, exact_g) + 1e-6


# ---- (8) non-finite inputs (docs/spec.md §1) and the fused call -----------------------------------
@pytest.mark.parametrize("where", ["sim", "relevance"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nonfinite_propagates_with_check_off(monkeypatch, where, bad, reduction):
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    sim, rel = rand_case(5, 6, 20)
    (sim if where == "sim" else rel)[2, 3] = bad
    for direction in DIRECTIONS:
        loss, grad = loss_and_grad(sim, rel, direction=direction, reduction=reduction, impl="native")
        assert not torch.isfinite(loss).all(), direction
        assert not torch.isfinite(grad).all(), direction


def test_edges_from_scalars_match_reference_edges():
    # the kernels compute the edges themselves: membership must match the float64-then-
    # rounded edges of the reference exactly, also for strides that are not exact in binary
    for alpha, beta, lr in ((0.1, 0.05, (0.0, 1.0)), (0.07, 0.013, (-0.3, 0.9)), (0.2, 0.1, (-1.0, 1.0))):
        for dtype in (torch.float32, torch.float64):
            sim, rel = rand_case(7, 30, 21, "edges", dtype, alpha, beta, lr)
            upper, lower = edge_tensors(alpha, beta, lr, dtype, sim.device)
            _, idx, _ = sw_fwd(sim, rel, alpha, beta, lr)
            for q in range(sim.shape[0]):
                for mw in range(upper.shape[0]):
                    pos = (rel[q] >= upper[mw]).nonzero().flatten()
                    neg = (rel[q] < lower[mw]).nonzero().flatten()
                    j = pos[sim[q, pos].argmin()].item() if len(pos) else -1
                    k = neg[sim[q, neg].argmax()].item() if len(neg) else -1
                    assert idx[q, mw].tolist() == [j, k]


@needs_cuda
def test_cuda_nonfinite_default_propagates():
    for where in ("sim", "relevance"):
        sim, rel = rand_case(6, 7, 22)
        (sim if where == "sim" else rel)[1, 2] = float("nan")
        loss, grad = loss_and_grad(sim.cuda(), rel.cuda(), impl="native")
        assert not torch.isfinite(loss).all() and not torch.isfinite(grad).all()


@needs_cuda
def test_cuda_graph_capture_replay():
    sim, rel = rand_case(64, 48, 23)
    loss, grad = _cuda_checks.graph_replay(fastrank.kendall_sw_loss, sim.cuda(), rel.cuda())
    l_e, g_e = loss_and_grad(sim.cuda(), rel.cuda())
    torch.testing.assert_close(loss, l_e)
    torch.testing.assert_close(grad, g_e)


@needs_cuda
def test_cuda_compile_reduce_overhead_step():
    sim, rel = rand_case(32, 32, 24)
    assert torch.isfinite(_cuda_checks.reduce_overhead_steps(fastrank.kendall_sw_loss, sim, rel))


@needs_cuda
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_cuda_launch_count_and_no_host_copy(direction):
    counts = []
    for n in (8, 256):
        sim, rel = rand_case(n, n, 25)
        kernels, copies = _cuda_checks.device_activity(
            lambda s, r: fastrank.kendall_sw_loss(s, r, direction=direction), sim.cuda(), rel.cuda())
        assert copies == [], copies
        counts.append(len(kernels))
    assert counts[0] == counts[1] and counts[0] <= 6, counts


# ---- CUDA test matrix (marked cuda_matrix) -------------------------------------------------------
# kendall_sw's CUDA kernels (sw_forward_kernel, reduce_queries_kernel, sw_backward_kernel)
# against the reference, with the checks of tests/_cuda_matrix.py: on a GPU, or emulated on
# the CPU by tests/test_emulated.py; deselected where neither can run (tests/conftest.py).
def native(s, r, direction, reduction, mask, alpha=0.1, beta=0.05, label_range=(0.0, 1.0)):
    assert mask is None
    return fastrank.kendall_sw_loss(s, r, alpha, beta, label_range, direction, reduction, impl="native")


def reference(s, r, direction, reduction, mask, alpha=0.1, beta=0.05, label_range=(0.0, 1.0)):
    return fastrank.kendall_sw_loss(s, r, alpha, beta, label_range, direction, reduction, impl="reference")


# backward tiles of 8 rows x 32 columns: shapes on and off the tiles
MATRIX_SHAPES = [(1, 1), (1, 19), (19, 1), (8, 32), (33, 17), (9, 70)]


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("n,m", MATRIX_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, n, m, dtype):
    sim, rel = case(n, m, seed=n * 100 + m)
    for direction in DIRECTIONS:
        check_loss(native, reference, sim, rel, direction, "none", dtype=dtype, device=device)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_direction_and_reduction(device, direction, reduction):
    sim, rel = case(21, 18, seed=3, ties=True, levels=7)
    check_loss(native, reference, sim, rel, direction, reduction, dtype=torch.float64, device=device,
               schedules=SCHEDULES)


@pytest.mark.cuda_matrix
def test_many_windows(device):
    """More windows than one shared-memory chunk of the forward (512) and of the backward (64)."""
    sim, rel = case(6, 40, seed=13)
    fn = lambda s, r, d, red, mk: native(s, r, d, red, mk, alpha=0.05, beta=0.001)
    ref = lambda s, r, d, red, mk: reference(s, r, d, red, mk, alpha=0.05, beta=0.001)
    check_loss(fn, ref, sim, rel, "both", "none", dtype=torch.float64, device=device)


@pytest.mark.cuda_matrix
def test_label_range_and_ties(device):
    sim, rel = case(14, 16, seed=14, ties=True, levels=5)
    rel = rel * 2 - 1
    fn = lambda s, r, d, red, mk: native(s, r, d, red, mk, alpha=0.2, beta=0.1, label_range=(-1.0, 1.0))
    ref = lambda s, r, d, red, mk: reference(s, r, d, red, mk, alpha=0.2, beta=0.1, label_range=(-1.0, 1.0))
    check_loss(fn, ref, sim, rel, "both", "mean", dtype=torch.float64, device=device)


@pytest.mark.cuda_matrix
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


class TestGradedLossMatrix(GradedLossCases):
    """The cases every graded loss shares (tests/_cuda_matrix.py), on kendall_sw's calls."""
    native = staticmethod(native)
    reference = staticmethod(reference)
    masks = False  # no mask argument
