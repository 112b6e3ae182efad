"""kendall_loss (docs/spec.md §2.2; BCLS, Eq. 17): oracle, reference, native CPU/CUDA, the CUDA test matrix."""
import itertools

import pytest
import torch

import _cuda_checks
import fastrank
from _cuda_matrix import (EMULATED, SCHEDULES, GradedLossCases, SparseRelevanceCases, case, check_loss, dry_run_launches,
                          each_schedule, launches)
from fastrank._native import variant_codes
from fastrank.ops.kendall import kendall_op

PAIR_PASS = variant_codes()[1]  # the pair pass's field of a direct op call

CUDA = fastrank.backends()["cuda_available"]
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
DIRECTIONS = ("i2t", "t2i", "both")
REDUCTIONS = ("mean", "sum", "none")


# ---- oracle: plain Python loops in float64, written from docs/spec.md §2.2 -------------------
def oracle_query(s, r, alpha):
    """(loss, d loss / d s) of one query from lists of floats."""
    n = len(s)
    total, count, grad = 0.0, 0, [0.0] * n
    for j in range(n):
        for k in range(n):
            if r[j] > r[k] + alpha:
                count += 1
                if s[k] - s[j] > 0:
                    total += s[k] - s[j]
                    grad[k] += 1.0
                    grad[j] -= 1.0
    denom = max(count, 1)
    return total / denom, [g / denom for g in grad]


def oracle(sim, rel, alpha, direction="both", reduction="mean"):
    """(loss, grad) of kendall_loss, with loss a float or a list (reduction="none")."""
    sim_l, rel_l = sim.double().tolist(), rel.double().tolist()
    n, m = len(sim_l), len(sim_l[0])
    parts = []  # (losses, grads as (i, j) -> value), per direction
    for d in (["i2t", "t2i"] if direction == "both" else [direction]):
        losses, grads = [], {}
        n_q, n_c = (n, m) if d == "i2t" else (m, n)
        for q in range(n_q):
            if d == "i2t":
                s, r = sim_l[q], rel_l[q]
            else:
                s, r = [sim_l[i][q] for i in range(n)], [rel_l[i][q] for i in range(n)]
            loss, g = oracle_query(s, r, alpha)
            losses.append(loss)
            for c in range(n_c):
                grads[(q, c) if d == "i2t" else (c, q)] = g[c]
        parts.append((losses, grads))
    grad = torch.zeros(n, m, dtype=torch.float64)
    if reduction == "none":
        return [x for losses, _ in parts for x in losses], None
    for losses, grads in parts:
        w = 1.0 if reduction == "sum" else 1.0 / len(losses)
        for (i, j), v in grads.items():
            grad[i, j] += w * v
    total = sum((sum(l) if reduction == "sum" else sum(l) / len(l)) for l, _ in parts)
    return total, grad


def loss_and_grad(sim, rel, **kw):
    s = sim.detach().clone().requires_grad_(True)
    loss = fastrank.kendall_loss(s, rel, **kw)
    (loss.sum() if loss.dim() else loss).backward()
    return loss.detach(), s.grad


def rand_case(n, m, seed, kind="random", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    sim = torch.randn(n, m, generator=g, dtype=torch.float64)
    rel = torch.rand(n, m, generator=g, dtype=torch.float64)
    if kind == "ties":  # ties in sim and in relevance, relevance differences exactly alpha
        sim = torch.randint(-3, 4, (n, m), generator=g).double() * 0.25
        rel = torch.randint(0, 21, (n, m), generator=g).double() * 0.05
    elif kind == "equal_rel":
        rel = torch.full((n, m), 0.7, dtype=torch.float64)
    elif kind == "zero_rel":
        rel = torch.zeros(n, m, dtype=torch.float64)
    elif kind == "large":
        sim = sim * 1e4
    return sim.to(dtype), rel.to(dtype)


# ---- (1) reference vs oracle (float64) ----------------------------------------------
@pytest.mark.parametrize("direction,reduction", list(itertools.product(DIRECTIONS, REDUCTIONS)))
@pytest.mark.parametrize("kind", ["random", "ties"])
def test_reference_matches_oracle(direction, reduction, kind):
    sim, rel = rand_case(5, 7, 1, kind, torch.float64)
    want, want_grad = oracle(sim, rel, 0.1, direction, reduction)
    loss, grad = loss_and_grad(sim, rel, alpha=0.1, direction=direction, reduction=reduction,
                               impl="reference")
    torch.testing.assert_close(loss, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    if want_grad is not None:
        torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.3])
def test_native_matches_oracle(alpha):
    sim, rel = rand_case(6, 4, 2, "ties", torch.float64)
    want, want_grad = oracle(sim, rel, alpha)
    loss, grad = loss_and_grad(sim, rel, alpha=alpha, impl="native")
    torch.testing.assert_close(loss, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)


def test_oracle_hand_example():
    # one query, r = (1, 0.5, 0), s = (0, 1, 2), alpha = 0.1: all 3 pairs active and
    # violated: (s1 - s0) + (s2 - s0) + (s2 - s1) = 1 + 2 + 1 = 4, over 3 pairs
    loss, grad = oracle_query([0.0, 1.0, 2.0], [1.0, 0.5, 0.0], 0.1)
    assert loss == pytest.approx(4 / 3)
    assert grad == pytest.approx([-2 / 3, 0.0, 2 / 3])
    sim, rel = torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[1.0, 0.5, 0.0]])
    for impl in ("reference", "native"):
        out = fastrank.kendall_loss(sim, rel, direction="i2t", impl=impl)
        assert out.item() == pytest.approx(4 / 3)


# ---- (2) native vs reference ---------------------------------------------------------
# (150, 70), (70, 150): the t2i queries in more than one tile of 64 columns, the last one part
# full, split across threads (csrc/cpu/kendall.cpp, kColumnTile)
SHAPES = [(7, 5), (5, 7), (1, 6), (6, 1), (1, 1), (2, 2), (13, 2), (33, 40), (150, 70), (70, 150)]
KINDS = ["random", "ties", "equal_rel", "zero_rel", "large"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_matches_reference(shape, kind, dtype):
    sim, rel = rand_case(*shape, seed=hash((shape, kind)) % 1000, kind=kind, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    if kind == "large":
        tol = dict(rtol=1e-5, atol=1e-2) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-8)
    # every direction per query ("none"), and the two reductions of "both"
    for direction, reduction in (("i2t", "none"), ("t2i", "none"), ("both", "mean"), ("both", "sum")):
        kw = dict(alpha=0.1, direction=direction, reduction=reduction)
        l_n, g_n = loss_and_grad(sim, rel, impl="native", **kw)
        l_r, g_r = loss_and_grad(sim, rel, impl="reference", **kw)
        assert l_n.dtype == l_r.dtype and g_n.dtype == sim.dtype
        torch.testing.assert_close(l_n, l_r, **tol)
        torch.testing.assert_close(g_n, g_r, rtol=tol["rtol"], atol=1e-6 if dtype == torch.float32 else 1e-12)


def test_native_matches_reference_noncontiguous():
    g = torch.Generator().manual_seed(3)
    big_s = torch.randn(20, 30, generator=g)
    big_r = torch.rand(30, 20, generator=g)
    sim = big_s[::2, 1::3]            # (10, 10), strided
    rel = big_r.t()[1::2, ::3]        # (10, 10), transposed + strided
    assert not sim.is_contiguous() and not rel.is_contiguous()
    l_n, g_n = loss_and_grad(sim, rel, impl="native")
    l_r, g_r = loss_and_grad(sim.contiguous(), rel.contiguous(), impl="reference")
    torch.testing.assert_close(l_n, l_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_n, g_r, rtol=1e-5, atol=1e-7)


def test_half_inputs_on_cpu():
    sim, rel = rand_case(6, 9, 4)
    for dt in (torch.float16, torch.bfloat16):
        l_n, g_n = loss_and_grad(sim.to(dt), rel, impl="native")
        l_r, g_r = loss_and_grad(sim.to(dt).float(), rel, impl="reference")
        assert g_n.dtype == dt and l_n.dtype == torch.float32
        torch.testing.assert_close(l_n, l_r, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g_n.float(), g_r.to(dt).float(), rtol=1e-2, atol=1e-3)


def test_pair_test_rounding_matches_reference():
    # relevance differences exactly alpha in decimal, not in binary: r_j > r_k + alpha must
    # be decided identically (r_k + alpha rounded to float32) by kernel and reference
    vals = torch.arange(0, 21, dtype=torch.float32) * 0.05
    rel = vals.repeat(3, 1)
    sim = torch.linspace(2, -2, 21).repeat(3, 1)  # every active pair violated
    for alpha in (0.05, 0.1, 0.15, 0.3):
        loss_n = kendall_op(sim, rel, None, [], alpha, 1, 0, PAIR_PASS)[0]
        active = rel.unsqueeze(2) > (rel + alpha).unsqueeze(1)
        hinge = torch.relu(sim.unsqueeze(1) - sim.unsqueeze(2))
        loss_r = (hinge * active).sum((1, 2)) / active.sum((1, 2)).clamp(min=1)
        torch.testing.assert_close(loss_n, loss_r, rtol=1e-6, atol=0)
        ref = fastrank.kendall_loss(sim, rel, alpha, direction="i2t", reduction="none", impl="reference")
        torch.testing.assert_close(loss_n, ref, rtol=1e-6, atol=0)


def test_subgradient_at_ties_is_zero():
    sim = torch.zeros(1, 4, requires_grad=True)
    rel = torch.tensor([[1.0, 0.6, 0.3, 0.0]])
    for impl in ("native", "reference"):
        loss = fastrank.kendall_loss(sim, rel, direction="i2t", impl=impl)
        (g,) = torch.autograd.grad(loss, sim)
        assert loss.item() == 0.0 and torch.equal(g, torch.zeros_like(g))


def test_module_form():
    sim, rel = rand_case(5, 6, 5)
    mod = fastrank.nn.KendallLoss(alpha=0.2, direction="t2i", reduction="sum")
    assert "alpha=0.2" in repr(mod)
    torch.testing.assert_close(mod(sim, rel), fastrank.kendall_loss(sim, rel, 0.2, "t2i", "sum"))
    with pytest.raises(ValueError, match="alpha"):
        fastrank.nn.KendallLoss(alpha=-1.0)


# ---- (3) gradcheck --------------------------------------------------------------------
def test_gradcheck_native_float64():
    g = torch.Generator().manual_seed(6)
    n, m = 5, 6
    # distinct, well separated scores: no pair within 1e-3 of the hinge kink
    sim = (torch.randperm(n * m, generator=g).double() * 0.1).reshape(n, m).requires_grad_(True)
    rel = torch.rand(n, m, generator=g, dtype=torch.float64)
    for direction in DIRECTIONS:
        assert torch.autograd.gradcheck(
            lambda s: fastrank.kendall_loss(s, rel, direction=direction, reduction="none", impl="native"),
            (sim,), eps=1e-6, atol=1e-8)


# ---- (4) torch.compile and opcheck ------------------------------------------------------
def test_opcheck():
    sim, rel = rand_case(5, 7, 7)
    mask = torch.rand(sim.shape, generator=torch.Generator().manual_seed(1)) > 0.3
    for s, r in ((sim, rel), (sim.t(), rel.t()), (sim.double(), rel.double())):
        for mk in (None, mask if s.shape == mask.shape else mask.t()):
            for d, red in ((1, 0), (2, 1), (3, 2), (3, 0)):
                torch.library.opcheck(kendall_op, (s.clone().requires_grad_(True), r, mk, [], 0.1, d, red, PAIR_PASS))


def test_torch_compile_fullgraph():
    sim, rel = rand_case(6, 8, 8)

    def f(s, r):
        return fastrank.kendall_loss(s, r, alpha=0.1, impl="native") * 2.0

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
    sim, rel = rand_case(4, 4, 9)
    f = fastrank.kendall_loss
    with pytest.raises(TypeError, match="sim"):
        f(sim.tolist(), rel)
    with pytest.raises(TypeError, match="sim"):
        f(sim.long(), rel)
    with pytest.raises(TypeError, match="relevance"):
        f(sim, rel.long())
    with pytest.raises(ValueError, match="sim"):
        f(sim[0], rel[0])
    with pytest.raises(ValueError, match="sim"):
        f(sim[:0], rel[:0])
    with pytest.raises(ValueError, match="relevance"):
        f(sim, rel[:3])
    for bad in (float("nan"), float("inf")):
        s = sim.clone()
        s[1, 2] = bad
        with pytest.raises(ValueError, match="sim"):
            f(s, rel)
        r = rel.clone()
        r[0, 0] = bad
        with pytest.raises(ValueError, match="relevance"):
            f(sim, r)
    for alpha in (-0.1, float("nan"), float("inf"), True, "0.1", None):
        with pytest.raises(ValueError, match="alpha"):
            f(sim, rel, alpha=alpha)
    with pytest.raises(ValueError, match="direction"):
        f(sim, rel, direction="x2y")
    with pytest.raises(ValueError, match="reduction"):
        f(sim, rel, reduction="avg")
    with pytest.raises(ValueError, match="impl"):
        f(sim, rel, impl="fast")


@needs_cuda
def test_bad_device_mix():
    sim, rel = rand_case(4, 4, 9)
    with pytest.raises(ValueError, match="relevance"):
        fastrank.kendall_loss(sim.cuda(), rel)


def test_structure_before_values():
    sim, rel = rand_case(3, 3, 12)
    rel[1, 1] = float("nan")
    with pytest.raises(ValueError, match="relevance is on meta but sim is on cpu"):
        fastrank.kendall_loss(torch.where(torch.eye(3, dtype=torch.bool), float("nan"), sim),
                              torch.empty(3, 3, device="meta"))
    with pytest.raises(ValueError, match="mask must have the same shape"):
        fastrank.kendall_loss(sim, rel, mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="alpha"):
        fastrank.kendall_loss(sim, rel, alpha=-1.0)


def test_relevance_has_no_range():
    """docs/spec.md §1 names no range for kendall_loss: labels in [-1, 1] (the paper's) are fine,
    and shifting every label changes nothing (only differences count)."""
    sim, rel = rand_case(4, 5, 13)
    torch.testing.assert_close(fastrank.kendall_loss(sim, rel * 2 - 1, alpha=0.2),
                               fastrank.kendall_loss(sim, rel * 2, alpha=0.2))


def test_alpha_accepts_numpy_and_tensors():
    import numpy as np
    sim, rel = rand_case(4, 4, 14)
    want = fastrank.kendall_loss(sim, rel, alpha=0.25)
    for alpha in (np.float32(0.25), torch.tensor(0.25), np.array(0.25), torch.tensor(0.25).requires_grad_()):
        torch.testing.assert_close(fastrank.kendall_loss(sim, rel, alpha=alpha), want)
        torch.testing.assert_close(fastrank.nn.KendallLoss(alpha=alpha)(sim, rel), want)


# ---- (6) determinism --------------------------------------------------------------------
def test_deterministic():
    sim, rel = rand_case(67, 45, 10)
    l1, g1 = loss_and_grad(sim, rel, impl="native")
    l2, g2 = loss_and_grad(sim, rel, impl="native")
    assert torch.equal(l1, l2) and torch.equal(g1, g2)


# ---- (7) CUDA ---------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (1, 7), (7, 1), (37, 300), (300, 37), (1100, 1030)])
@pytest.mark.parametrize("kind", ["random", "ties", "zero_rel"])
def test_cuda_matches_cpu_reference(shape, kind):
    sim, rel = rand_case(*shape, seed=11, kind=kind)
    for direction in DIRECTIONS:
        l_c, g_c = loss_and_grad(sim.cuda(), rel.cuda(), direction=direction, reduction="none", impl="native")
        l_r, g_r = loss_and_grad(sim, rel, direction=direction, reduction="none", impl="reference")
        torch.testing.assert_close(l_c.cpu(), l_r, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g_c.cpu(), g_r, rtol=1e-5, atol=1e-7)


@needs_cuda
def test_cuda_float64_and_deterministic():
    sim, rel = rand_case(300, 200, 12, dtype=torch.float64)
    l_c, g_c = loss_and_grad(sim.cuda(), rel.cuda(), impl="native")
    l_2, g_2 = loss_and_grad(sim.cuda(), rel.cuda(), impl="native")
    l_r, g_r = loss_and_grad(sim, rel, impl="reference")
    torch.testing.assert_close(l_c.cpu(), l_r, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_c.cpu(), g_r, rtol=1e-10, atol=1e-14)
    assert torch.equal(l_c, l_2) and torch.equal(g_c, g_2)


@needs_cuda
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_cuda_low_precision_error(dt):
    from fastrank.reference.kendall import kendall_per_query

    def both(s, r):  # per-query losses of both directions, relevance (the pair test) in float32
        return torch.cat([kendall_per_query(s, r, 0.1), kendall_per_query(s.t(), r.t(), 0.1)])

    sim, rel = rand_case(96, 80, 13)
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


# ---- (8) masks: lists of different lengths (docs/spec.md §2.1a) --------------------------------
def rand_mask(n, m, seed, p=0.35):
    return torch.rand(n, m, generator=torch.Generator().manual_seed(seed)) > p


def masked_oracle(sim, rel, mask, alpha, direction="both", reduction="mean"):
    """Loop oracle: each list with its masked entries deleted (ragged lists)."""
    sim_l, rel_l, mask_l = sim.double().tolist(), rel.double().tolist(), mask.tolist()
    n, m = len(sim_l), len(sim_l[0])
    total, grad, losses = 0.0, torch.zeros(n, m, dtype=torch.float64), []
    for d in (["i2t", "t2i"] if direction == "both" else [direction]):
        n_q, n_c = (n, m) if d == "i2t" else (m, n)
        at = (lambda q, c: (q, c)) if d == "i2t" else (lambda q, c: (c, q))
        parts = []
        for q in range(n_q):
            keep = [c for c in range(n_c) if mask_l[at(q, c)[0]][at(q, c)[1]]]
            s = [sim_l[at(q, c)[0]][at(q, c)[1]] for c in keep]
            r = [rel_l[at(q, c)[0]][at(q, c)[1]] for c in keep]
            loss, g = oracle_query(s, r, alpha) if keep else (0.0, [])
            parts.append((loss, keep, g, bool(keep)))
        n_valid = max(1, sum(v for *_, v in parts))
        w = 1.0 if reduction in ("sum", "none") else 1.0 / n_valid
        for q, (loss, keep, g, _) in enumerate(parts):
            losses.append(loss)
            total += w * loss
            for c, gc in zip(keep, g):
                grad[at(q, c)] += w * gc
    return (losses if reduction == "none" else total), grad


def masked_loss_and_grad(sim, rel, mask, **kw):
    s = sim.detach().clone().requires_grad_(True)
    loss = fastrank.kendall_loss(s, rel, mask=mask, **kw)
    (loss.sum() if loss.dim() else loss).backward()
    return loss.detach(), s.grad


def test_all_true_mask_equals_no_mask():
    sim, rel = rand_case(9, 7, 20)
    full = torch.ones(9, 7, dtype=torch.bool)
    for impl in ("native", "reference"):
        for direction, reduction in (("both", "mean"), ("i2t", "none"), ("t2i", "sum")):
            kw = dict(direction=direction, reduction=reduction, impl=impl)
            l1, g1 = masked_loss_and_grad(sim, rel, full, **kw)
            l2, g2 = loss_and_grad(sim, rel, **kw)
            if impl == "native":  # the same kernel path, bit for bit
                assert torch.equal(l1, l2) and torch.equal(g1, g2)
            else:  # sum / count instead of mean: rounding only
                torch.testing.assert_close(l1, l2, rtol=1e-6, atol=0)
                torch.testing.assert_close(g1, g2, rtol=1e-6, atol=0)


@pytest.mark.parametrize("direction,reduction", list(itertools.product(DIRECTIONS, REDUCTIONS)))
@pytest.mark.parametrize("impl", ["native", "reference"])
def test_mask_equals_deleting_entries(direction, reduction, impl):
    sim, rel = rand_case(6, 8, 21, "ties", torch.float64)
    mask = rand_mask(6, 8, 22)
    mask[1] = False          # a fully masked row (an empty i2t list)
    mask[:, 3] = False       # a fully masked column (an empty t2i list)
    mask[4] = False
    mask[4, 0] = True        # a list of one item: no pair, loss 0, but counted by "mean"
    want, want_grad = masked_oracle(sim, rel, mask, 0.1, direction, reduction)
    loss, grad = masked_loss_and_grad(sim, rel, mask, alpha=0.1, direction=direction, reduction=reduction,
                                      impl=impl)
    torch.testing.assert_close(loss, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    if reduction != "none":
        torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))  # masked gradients exactly 0


def test_mask_native_vs_deleting_on_ragged_lists():
    # a list's loss and gradient do not depend on what is stored under its masked entries
    sim, rel = rand_case(12, 15, 23)
    mask = rand_mask(12, 15, 24, p=0.5)
    l1, g1 = masked_loss_and_grad(sim, rel, mask, reduction="none", impl="native")
    sim2, rel2 = sim.clone(), rel.clone()
    sim2[~mask] = 1e3
    rel2[~mask] = 0.99
    l2, g2 = masked_loss_and_grad(sim2, rel2, mask, reduction="none", impl="native")
    assert torch.equal(l1, l2) and torch.equal(g1, g2)
    assert (g1[~mask] == 0).all()


@pytest.mark.parametrize("shape", [(7, 5), (1, 6), (6, 1), (33, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mask_native_matches_reference(shape, dtype):
    sim, rel = rand_case(*shape, seed=25, dtype=dtype)
    mask = rand_mask(*shape, 26)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for direction, reduction in itertools.product(DIRECTIONS, REDUCTIONS):
        kw = dict(direction=direction, reduction=reduction)
        l_n, g_n = masked_loss_and_grad(sim, rel, mask, impl="native", **kw)
        l_r, g_r = masked_loss_and_grad(sim, rel, mask, impl="reference", **kw)
        torch.testing.assert_close(l_n, l_r, **tol)
        torch.testing.assert_close(g_n, g_r, **tol)
    # strided mask (a transposed view)
    mt = mask.t().contiguous().t()
    assert min(shape) == 1 or not mt.is_contiguous()
    l_n, g_n = masked_loss_and_grad(sim, rel, mt, impl="native")
    l_r, g_r = masked_loss_and_grad(sim, rel, mask, impl="reference")
    torch.testing.assert_close(l_n, l_r, **tol)
    torch.testing.assert_close(g_n, g_r, **tol)


def test_fully_masked():
    sim, rel = rand_case(4, 5, 27)
    none = torch.zeros(4, 5, dtype=torch.bool)
    for impl in ("native", "reference"):
        for reduction in REDUCTIONS:
            loss, grad = masked_loss_and_grad(sim, rel, none, reduction=reduction, impl=impl)
            assert torch.equal(loss, torch.zeros_like(loss)) and torch.equal(grad, torch.zeros_like(grad))


def test_gradcheck_with_mask_float64():
    g = torch.Generator().manual_seed(28)
    n, m = 5, 6
    sim = (torch.randperm(n * m, generator=g).double() * 0.1).reshape(n, m).requires_grad_(True)
    rel = torch.rand(n, m, generator=g, dtype=torch.float64)
    mask = rand_mask(n, m, 29)
    for impl in ("native", "reference"):
        for direction, reduction in (("both", "mean"), ("i2t", "none"), ("t2i", "sum")):
            assert torch.autograd.gradcheck(
                lambda s: fastrank.kendall_loss(s, rel, direction=direction, reduction=reduction, impl=impl,
                                                mask=mask), (sim,), eps=1e-6, atol=1e-8)


def test_module_mask():
    sim, rel = rand_case(5, 6, 30)
    mask = rand_mask(5, 6, 31)
    mod = fastrank.nn.KendallLoss()
    torch.testing.assert_close(mod(sim, rel, mask), fastrank.kendall_loss(sim, rel, mask=mask))
    torch.testing.assert_close(mod(sim, rel), fastrank.kendall_loss(sim, rel))


def test_bad_masks():
    sim, rel = rand_case(4, 5, 32)
    f = fastrank.kendall_loss
    with pytest.raises(TypeError, match="mask"):
        f(sim, rel, mask=torch.ones(4, 5))
    with pytest.raises(TypeError, match="mask"):
        f(sim, rel, mask=[[True] * 5] * 4)
    with pytest.raises(ValueError, match="mask"):
        f(sim, rel, mask=torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        f(sim, rel, mask=torch.ones(4, dtype=torch.bool))


# ---- (9) non-finite inputs (docs/spec.md §1) ------------------------------------------------------
@pytest.mark.parametrize("where", ["sim", "relevance"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nonfinite_propagates_with_check_off(monkeypatch, where, bad, reduction):
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    sim, rel = rand_case(5, 6, 33)
    (sim if where == "sim" else rel)[2, 3] = bad
    for direction in DIRECTIONS:
        for mask in (None, rand_mask(5, 6, 34) | (torch.arange(6) == 3)):
            loss, grad = masked_loss_and_grad(sim, rel, mask, direction=direction, reduction=reduction,
                                              impl="native")
            assert not torch.isfinite(loss).all(), (direction, mask is None)
            assert not torch.isfinite(grad).all(), (direction, mask is None)


def test_nonfinite_raises_by_default_on_cpu():
    sim, rel = rand_case(4, 4, 35)
    sim[0, 0] = float("nan")
    with pytest.raises(ValueError, match="sim"):
        fastrank.kendall_loss(sim, rel, impl="native")


def test_per_call_lean():
    # the eager native path: one forward and one backward kernel call, no reference ops
    sim, rel = rand_case(4, 4, 36)
    s = sim.clone().requires_grad_(True)
    with torch.autograd.profiler.profile() as prof:
        fastrank.kendall_loss(s, rel).backward()
    names = [e.name for e in prof.function_events]
    assert sum("_KendallFunction" in n for n in names) >= 1
    assert not any("relu" in n or "gather" in n for n in names)


# ---- (9b) relevance as lists: fastrank.TopKRelevance (docs/spec.md §2.1b) ------------------------
@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 6), (6, 1), (7, 30), (30, 7), (70, 150)])
@pytest.mark.parametrize("masked", [False, True])
def test_topk_relevance_equals_its_matrix(impl, shape, masked):
    """A TopKRelevance gives the loss and gradient of the (N, M) matrix it stands for: rows of
    at most 3 nonzero entries (ties among them), an all-zero row, unused slots, masks."""
    n, m = shape
    g = torch.Generator().manual_seed(17)
    sim = torch.randn(n, m, generator=g, dtype=torch.float64)
    rel = torch.zeros(n, m, dtype=torch.float64)
    for i in range(n):
        cols = torch.randperm(m, generator=g)[:3]
        rel[i, cols] = (torch.rand(len(cols), generator=g, dtype=torch.float64) * 4).ceil() / 4
    rel[n // 2] = 0.0
    top = fastrank.TopKRelevance.from_dense(rel, min(m, 4))
    mask = torch.rand(n, m, generator=g) < 0.7 if masked else None
    for direction, reduction in (("i2t", "none"), ("t2i", "none"), ("both", "mean")):
        kw = dict(alpha=0.1, direction=direction, reduction=reduction, impl=impl, mask=mask)
        l_a, g_a = loss_and_grad(sim, rel, **kw)
        l_b, g_b = loss_and_grad(sim, top, **kw)
        torch.testing.assert_close(l_b, l_a, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_b, g_a, rtol=1e-12, atol=1e-12)


# ---- (10) CUDA: fused-call properties (skipped without a GPU) --------------------------------
@needs_cuda
def test_cuda_nonfinite_default_propagates():
    for where in ("sim", "relevance"):
        sim, rel = rand_case(6, 7, 37)
        (sim if where == "sim" else rel)[1, 2] = float("nan")
        loss, grad = loss_and_grad(sim.cuda(), rel.cuda(), impl="native")
        assert not torch.isfinite(loss).all() and not torch.isfinite(grad).all()


@needs_cuda
@pytest.mark.parametrize("shape", [(37, 300), (300, 37), (64, 64)])
def test_cuda_mask_matches_reference(shape):
    sim, rel = rand_case(*shape, seed=38)
    mask = rand_mask(*shape, 39)
    mask[0] = False
    for direction, reduction in itertools.product(DIRECTIONS, REDUCTIONS):
        kw = dict(direction=direction, reduction=reduction)
        l_c, g_c = masked_loss_and_grad(sim.cuda(), rel.cuda(), mask.cuda(), impl="native", **kw)
        l_r, g_r = masked_loss_and_grad(sim, rel, mask, impl="reference", **kw)
        torch.testing.assert_close(l_c.cpu(), l_r, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g_c.cpu(), g_r, rtol=1e-5, atol=1e-7)


@needs_cuda
def test_cuda_graph_capture_replay():
    sim, rel = rand_case(64, 48, 40)
    loss, grad = _cuda_checks.graph_replay(fastrank.kendall_loss, sim.cuda(), rel.cuda())
    l_e, g_e = loss_and_grad(sim.cuda(), rel.cuda())
    torch.testing.assert_close(loss, l_e)
    torch.testing.assert_close(grad, g_e)


@needs_cuda
def test_cuda_compile_reduce_overhead_step():
    sim, rel = rand_case(32, 32, 41)
    assert torch.isfinite(_cuda_checks.reduce_overhead_steps(fastrank.kendall_loss, sim, rel))


@needs_cuda
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_cuda_launch_count_and_no_host_copy(direction):
    counts = []
    for n in (8, 256):
        sim, rel = rand_case(n, n, 42)
        kernels, copies = _cuda_checks.device_activity(
            lambda s, r: fastrank.kendall_loss(s, r, direction=direction), sim.cuda(), rel.cuda())
        assert copies == [], copies
        counts.append(len(kernels))
    assert counts[0] == counts[1] and counts[0] <= 6, counts


@needs_cuda
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_cuda_half_relevance_same_dtype(dt):
    sim, rel = rand_case(40, 30, 43)
    l_h, g_h = loss_and_grad(sim.to(dt).cuda(), rel.to(dt).cuda(), impl="native")
    l_r, g_r = loss_and_grad(sim.to(dt).float(), rel.to(dt).float(), impl="reference")
    torch.testing.assert_close(l_h.cpu(), l_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_h.float().cpu(), g_r.to(dt).float(), rtol=1e-2, atol=1e-3)


# ---- CUDA test matrix (marked cuda_matrix) -------------------------------------------------------
# kendall's CUDA kernels (kendall_kernel, reduce_queries_kernel, kendall_backward_kernel)
# against the reference, with the checks of tests/_cuda_matrix.py: on a GPU, or emulated on
# the CPU by tests/test_emulated.py; deselected where neither can run (tests/conftest.py).
ALPHA = 0.1


def native(s, r, direction, reduction, mask, alpha=ALPHA):
    return fastrank.kendall_loss(s, r, alpha, direction, reduction, impl="native", mask=mask)


def reference(s, r, direction, reduction, mask, alpha=ALPHA):
    return fastrank.kendall_loss(s, r, alpha, direction, reduction, impl="reference", mask=mask)


# one block of 256 threads a query (lists longer than that and than a 1024-candidate chunk:
# test_lists_longer_than_a_chunk)
MATRIX_SHAPES = [(1, 1), (1, 19), (19, 1), (33, 17)]


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("n,m", MATRIX_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients(device, n, m, dtype):
    sim, rel = case(n, m, seed=n * 100 + m, levels=5)
    for direction in DIRECTIONS:
        check_loss(native, reference, sim, rel, direction, "none", dtype=dtype, device=device)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("direction,shape", [("i2t", (2, 300)), ("i2t", (2, 1100)), ("t2i", (1100, 2))])
def test_lists_longer_than_a_chunk(device, direction, shape):
    sim, rel = case(*shape, seed=11, levels=6)
    check_loss(native, reference, sim, rel, direction, "none", dtype=torch.float64, device=device)


@pytest.mark.cuda_matrix
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_direction_and_reduction(device, direction, reduction):
    sim, rel = case(21, 18, seed=3, ties=True, levels=4)
    check_loss(native, reference, sim, rel, direction, reduction, dtype=torch.float64, device=device,
               schedules=SCHEDULES)


@pytest.mark.cuda_matrix
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


@pytest.mark.cuda_matrix
def test_relevance_in_the_accumulation_type(device):
    """bfloat16 scores with float32 labels: pairs are decided on the float32 labels."""
    sim, rel = case(15, 13, seed=12)
    s, r = sim.to(torch.bfloat16), rel.float()
    got = each_schedule(lambda: native(s.to(device), r.to(device), "both", "none", None))[0]
    want = reference(s.double(), r.double(), "both", "none", None)
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.cuda_matrix
@pytest.mark.skipif(not EMULATED, reason="the launch log is the emulator's")
def test_launches_per_call(device):
    sim, rel = case(40, 30, seed=10)
    s = sim.requires_grad_(True)
    assert launches(lambda: native(s, rel, "both", "mean", None).backward()) == \
        ["kendall_kernel", "reduce_queries_kernel", "kendall_backward_kernel"]


@pytest.mark.cuda_matrix
@pytest.mark.skipif(not EMULATED, reason="the emulator's dry run checks launch shapes without running them")
def test_many_queries_fit_the_grid(device, no_finite_check):
    """A block a list, at most 1024, grid-strided: the block count never passes gridDim.x's
    limit, and the backward's elementwise grid is capped. The forward's scratch is sized by
    each direction's own lists (1024 blocks of the 2-item rows, 2 of the 300,000-item
    columns), not 1024 blocks x the longest list. Dry run: shapes checked, nothing computed."""
    s, rel = torch.zeros(300_000, 2).requires_grad_(True), torch.zeros(300_000, 2)
    shapes = dry_run_launches(lambda: native(s, rel, "both", "mean", None).backward())
    assert [k for k, _, _ in shapes] == ["kendall_kernel", "reduce_queries_kernel", "kendall_backward_kernel"]
    assert shapes[0][1] == (1024, 1, 1) and shapes[2][1] == ((600_000 + 255) // 256, 1, 1)
    assert fastrank._native.emulated_cuda().kendall_partials_numel(300_000, 2, 3) < 10 * 300_000


class TestGradedLossMatrix(GradedLossCases):
    """The cases every graded loss shares (tests/_cuda_matrix.py), on kendall's calls."""
    native = staticmethod(native)
    reference = staticmethod(reference)
    levels = 5


class TestSparseRelevanceMatrix(SparseRelevanceCases):
    """Top-k relevance lists and the sparse pass (tests/_cuda_matrix.py), on kendall's calls."""
    native = staticmethod(native)
    reference = staticmethod(reference)
