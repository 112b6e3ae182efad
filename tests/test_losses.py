"""Vectorised PyTorch losses (docs/spec.md §2.4-2.7) and CombinedLoss.

Every loss is compared, values and gradients, with a slow loop over queries and
positives written straight from docs/spec.md (float64, autograd through Python scalars).
"""
from __future__ import annotations

import math
import sys

import pytest
import torch

import fastrank
import fastrank.nn as fnn
from fastrank.losses.triplet import pair_hinge_sums

D64 = torch.float64


# ----------------------------------------------------------------------------- helpers

def rand_sim(n, m, seed=0, dtype=D64, grad=True):
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(n, m, generator=g, dtype=dtype) * 2 - 1
    return s.requires_grad_(grad)


def rand_pos(n, m, seed=0, p=0.3):
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.rand(n, m, generator=g) < p


def views(d, *mats):
    """(queries, candidates) views of each matrix for direction d."""
    return [None if x is None else (x if d == "i2t" else x.t()) for x in mats]


def dirs(direction):
    return ["i2t", "t2i"] if direction == "both" else [direction]


def ref_reduce(parts, reduction):
    """parts: one list of scalar tensors per direction."""
    if reduction == "none":
        return torch.stack([q for p in parts for q in p])
    if reduction == "sum":
        return sum(q for p in parts for q in p)
    return sum(sum(p) / len(p) for p in parts)


def relu(x):
    return torch.clamp(x, min=0)


def ref_triplet(sim, pos, margin=0.2, mining="hardest", gamma=50.0, direction="both", reduction="mean"):
    parts = []
    for d in dirs(direction):
        s, ps = views(d, sim, pos)
        losses = []
        for i in range(s.shape[0]):
            P = [j for j in range(s.shape[1]) if ps[i, j]]
            N = [j for j in range(s.shape[1]) if not ps[i, j]]
            if not P or not N:
                losses.append(s.sum() * 0)
                continue
            per = []
            for p in P:
                if mining == "hardest":
                    per.append(relu(margin + max(s[i, k] for k in N) - s[i, p]))
                elif mining == "soft":
                    lse = torch.log(sum(torch.exp(gamma * s[i, k]) for k in N)) / gamma
                    per.append(relu(margin + lse - s[i, p]))
                else:
                    per.append(sum(relu(margin + s[i, k] - s[i, p]) for k in N))
            losses.append(sum(per) / len(per))
        parts.append(losses)
    return ref_reduce(parts, reduction)


def ref_ladder(sim, rel, pos, thresholds=(0.63,), margins=(0.2, 0.01), weights=(1.0, 0.25),
               hard=True, direction="both", reduction="mean"):
    L = len(thresholds) + 1

    def level(r):
        if not thresholds or r >= thresholds[0]:
            return 1
        for l in range(2, L):
            if thresholds[l - 1] <= r < thresholds[l - 2]:
                return l
        return L

    parts = []
    for d in dirs(direction):
        s, r, ps = views(d, sim, rel, pos)
        losses = []
        for i in range(s.shape[0]):
            C = s.shape[1]
            P = [j for j in range(C) if ps[i, j]]
            N = [j for j in range(C) if not ps[i, j]]
            lev = {j: level(float(r[i, j])) for j in N}
            total = s.sum() * 0
            # rung 1: triplet with margin alpha_1
            if P and N:
                per = []
                for p in P:
                    if hard:
                        per.append(relu(margins[0] + max(s[i, k] for k in N) - s[i, p]))
                    else:
                        per.append(sum(relu(margins[0] + s[i, k] - s[i, p]) for k in N))
                total = total + weights[0] * sum(per) / len(per)
            for l in range(2, L + 1):
                Cs = [j for j in N if lev[j] == l - 1]
                Fs = [j for j in N if lev[j] >= l]
                if not Cs or not Fs:
                    continue
                if hard:
                    rung = relu(margins[l - 1] - min(s[i, c] for c in Cs) + max(s[i, f] for f in Fs))
                else:
                    rung = sum(relu(margins[l - 1] - s[i, c] + s[i, f]) for c in Cs for f in Fs)
                total = total + weights[l - 1] * rung
            losses.append(total)
        parts.append(losses)
    return ref_reduce(parts, reduction)


def ref_topk(sim, pos, k=5, margin=0.2, direction="both", reduction="mean"):
    parts = []
    for d in dirs(direction):
        s, ps = views(d, sim, pos)
        losses = []
        for i in range(s.shape[0]):
            P = [j for j in range(s.shape[1]) if ps[i, j]]
            N = [j for j in range(s.shape[1]) if not ps[i, j]]
            if not P or not N:
                losses.append(s.sum() * 0)
                continue
            negs = sorted((s[i, j] for j in N), key=lambda t: -float(t.detach()))[:min(k, len(N))]
            mean_top = sum(negs) / len(negs)
            losses.append(sum(relu(margin + mean_top - s[i, p]) for p in P) / len(P))
        parts.append(losses)
    return ref_reduce(parts, reduction)


def ref_variance_weighted(sub_sim, pos, margin=0.2, reduction="mean"):
    """DVSE Eq. 5-11, the mixed distribution of Eq. 7 = every candidate but the target."""
    K = sub_sim.shape[0]
    parts = []
    for d in ("i2t", "t2i"):
        losses = []
        ps = pos if d == "i2t" else pos.t()
        Q, C = ps.shape
        for i in range(Q):
            P = [j for j in range(C) if ps[i, j]]
            N = [j for j in range(C) if not ps[i, j]]
            if not P or not N:
                losses.append(sub_sim.sum() * 0)
                continue
            per = []
            for t in P:
                acc = 0
                for k in range(K):
                    s = sub_sim[k] if d == "i2t" else sub_sim[k].t()
                    p = torch.softmax(s[i], dim=0)
                    rest = torch.stack([p[j] for j in range(C) if j != t])
                    std = rest.std() if len(rest) >= 2 else p.sum() * 0
                    sigma = std + 1
                    hinge = relu(margin + max(s[i, j] for j in N) - s[i, t])
                    acc = acc + hinge / sigma ** 2 + torch.log(sigma)
                per.append(acc)
            losses.append(sum(per) / len(per))
        parts.append(losses)
    return ref_reduce(parts, reduction)


def ref_orthogonal(sub_emb, mask, beta=0.4, reduction="mean"):
    N, K, _ = sub_emb.shape
    out = []
    for n in range(N):
        tot = sub_emb.sum() * 0
        for a in range(K):
            for b in range(K):
                if a != b:
                    tot = tot + abs(mask[n, a] * mask[n, b] * torch.dot(sub_emb[n, a], sub_emb[n, b]))
        out.append(relu(tot - beta))
    out = torch.stack(out)
    return out if reduction == "none" else (out.sum() if reduction == "sum" else out.mean())


def assert_same(fn, ref, *inputs, atol=1e-10):
    """fn(*inputs) == ref(*inputs), values and gradients w.r.t. the float inputs."""
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    out, exp = fn(*inputs), ref(*inputs)
    torch.testing.assert_close(out, exp.to(out.dtype), atol=atol, rtol=1e-9)
    w = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)
    g1 = torch.autograd.grad((out * w).sum(), leaves, allow_unused=True)
    g2 = torch.autograd.grad((exp * w).sum(), leaves, allow_unused=True)
    for a, b in zip(g1, g2):
        a = torch.zeros_like(leaves[0]) if a is None else a
        b = torch.zeros_like(a) if b is None else b
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-9)


# ----------------------------------------------------------------------------- pair_hinge_sums

@pytest.mark.parametrize("margin", [0.0, 0.2, 1.6])
def test_pair_hinge_sums_matches_brute_force(margin):
    s = rand_sim(4, 9, seed=3)
    s = torch.round(s * 4) / 4                      # many ties
    s = s.detach().requires_grad_()
    mask = rand_pos(4, 9, seed=5, p=0.5)
    mask[0] = False                                 # an empty B set
    mask[1] = True                                  # a full one
    brute = (relu(margin - s.unsqueeze(2) + s.unsqueeze(1)) * mask.unsqueeze(1)).sum(2)
    got = pair_hinge_sums(s, mask, margin)
    torch.testing.assert_close(got, brute)
    g1, = torch.autograd.grad((got * torch.arange(36.).view(4, 9)).sum(), s)
    g2, = torch.autograd.grad((brute * torch.arange(36.).view(4, 9)).sum(), s)
    if margin > 0:   # margin 0 puts the ties on the kink (both are valid subgradients)
        torch.testing.assert_close(g1, g2)


# ----------------------------------------------------------------------------- triplet

def test_triplet_hand_computed():
    sim = torch.tensor([[0.5, 0.6], [0.1, 0.3]], dtype=D64)
    # i2t: row 0: .2 + .6 - .5 = .3 ; row 1: .2 + .1 - .3 = 0 ; t2i: col 0: 0 ; col 1: .2 + .6 - .3 = .5
    assert fastrank.triplet_loss(sim, reduction="sum").item() == pytest.approx(0.8)
    assert fastrank.triplet_loss(sim).item() == pytest.approx(0.15 + 0.25)
    torch.testing.assert_close(fastrank.triplet_loss(sim, reduction="none"),
                               torch.tensor([0.3, 0.0, 0.0, 0.5], dtype=D64))
    assert fastrank.triplet_loss(sim, direction="i2t", reduction="sum").item() == pytest.approx(0.3)


@pytest.mark.parametrize("mining", ["hardest", "soft", "all"])
@pytest.mark.parametrize("direction", ["i2t", "t2i", "both"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_triplet_matches_loop_multi_positive(mining, direction, reduction):
    sim = rand_sim(5, 7, seed=1)
    pos = rand_pos(5, 7, seed=1)
    pos[0] = False          # a query without positives
    pos[:, 3] = True        # a column without negatives
    assert_same(lambda s: fastrank.triplet_loss(s, 0.3, mining, 7.0, pos, direction, reduction),
                lambda s: ref_triplet(s, pos, 0.3, mining, 7.0, direction, reduction), sim)


@pytest.mark.parametrize("mining", ["hardest", "soft", "all"])
def test_triplet_diagonal_default_and_module(mining):
    sim = rand_sim(6, 6, seed=2)
    eye = torch.eye(6, dtype=torch.bool)
    assert_same(lambda s: fastrank.triplet_loss(s, mining=mining, gamma=10.0),
                lambda s: ref_triplet(s, eye, mining=mining, gamma=10.0), sim)
    mod = fnn.TripletLoss(margin=0.2, mining=mining, gamma=10.0)
    torch.testing.assert_close(mod(sim), fastrank.triplet_loss(sim, mining=mining, gamma=10.0))


@pytest.mark.parametrize("mining", ["hardest", "soft", "all"])
def test_triplet_edge_cases(mining):
    # N = 1: the i2t query has 1 positive and 3 negatives; t2i columns have 1 candidate
    sim = rand_sim(1, 4, seed=4)
    pos = torch.tensor([[True, False, False, False]])
    assert_same(lambda s: fastrank.triplet_loss(s, mining=mining, positives=pos, reduction="none"),
                lambda s: ref_triplet(s, pos, mining=mining, reduction="none"), sim)
    # all positives / no positives: loss 0, zero gradient, no NaN
    for p in (torch.ones(3, 3, dtype=torch.bool), torch.zeros(3, 3, dtype=torch.bool)):
        s = rand_sim(3, 3, seed=5)
        out = fastrank.triplet_loss(s, mining=mining, positives=p)
        out.backward()
        assert out.item() == 0 and torch.equal(s.grad, torch.zeros_like(s))
    # ties everywhere
    s = torch.full((4, 4), 0.5, dtype=D64, requires_grad=True)
    exp = {"hardest": 0.2, "soft": 0.2 + math.log(3) / 50, "all": 0.6}[mining]
    assert fastrank.triplet_loss(s, mining=mining, reduction="none").detach().tolist() == pytest.approx([exp] * 8)


def test_triplet_soft_tends_to_hardest_and_topk1_is_hardest():
    sim = rand_sim(5, 5, seed=6, grad=False)
    hard = fastrank.triplet_loss(sim)
    soft = fastrank.triplet_loss(sim, mining="soft", gamma=1e4)
    assert soft.item() == pytest.approx(hard.item(), abs=1e-3)
    torch.testing.assert_close(fastrank.topk_loss(sim, k=1), hard)


@pytest.mark.parametrize("mining", ["hardest", "soft", "all"])
def test_triplet_gradcheck(mining):
    sim = rand_sim(4, 5, seed=7)
    pos = rand_pos(4, 5, seed=7, p=0.4)
    assert torch.autograd.gradcheck(
        lambda s: fastrank.triplet_loss(s, 0.5, mining, 5.0, pos, reduction="none"), (sim,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triplet_low_precision(dtype):
    ref = rand_sim(6, 6, seed=8, grad=False)
    s = ref.to(dtype).requires_grad_()
    out = fastrank.triplet_loss(s, mining="soft", gamma=10.0)
    out.backward()
    assert out.dtype == torch.float32 and s.grad.dtype == dtype
    assert out.item() == pytest.approx(fastrank.triplet_loss(ref.to(dtype).double(), mining="soft",
                                                             gamma=10.0).item(), abs=1e-5)


def test_triplet_bad_input():
    sim = rand_sim(3, 4, seed=0, grad=False)
    with pytest.raises(ValueError, match="positives"):
        fastrank.triplet_loss(sim)                       # N != M and no positives
    sq = rand_sim(3, 3, seed=0, grad=False)
    with pytest.raises(ValueError, match="margin"):
        fastrank.triplet_loss(sq, margin=-0.1)
    with pytest.raises(ValueError, match="mining"):
        fastrank.triplet_loss(sq, mining="semi")
    with pytest.raises(ValueError, match="gamma"):
        fastrank.triplet_loss(sq, mining="soft", gamma=0.0)
    with pytest.raises(ValueError, match="direction"):
        fastrank.triplet_loss(sq, direction="x")
    with pytest.raises(ValueError, match="reduction"):
        fastrank.triplet_loss(sq, reduction="avg")
    with pytest.raises(TypeError, match="sim"):
        fastrank.triplet_loss(torch.zeros(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="sim"):
        fastrank.triplet_loss(torch.full((3, 3), float("nan")))
    with pytest.raises(TypeError, match="positives"):
        fastrank.triplet_loss(sq, positives=torch.eye(3))
    with pytest.raises(ValueError, match="mining"):
        fnn.TripletLoss(mining="semi")


# ----------------------------------------------------------------------------- ladder

LADDER_CASES = [
    dict(thresholds=(0.63,), margins=(0.2, 0.01), weights=(1.0, 0.25)),
    dict(thresholds=(0.7, 0.45, 0.2), margins=(0.2, 0.1, 0.05, 0.3), weights=(1.0, 0.5, 0.25, 2.0)),
    dict(thresholds=(), margins=(0.3,), weights=(1.5,)),
]


@pytest.mark.parametrize("case", LADDER_CASES)
@pytest.mark.parametrize("hard", [True, False])
@pytest.mark.parametrize("direction,reduction", [("both", "mean"), ("i2t", "sum"), ("t2i", "none"),
                                                 ("both", "none")])
def test_ladder_matches_loop(case, hard, direction, reduction):
    sim = rand_sim(5, 8, seed=11)
    g = torch.Generator().manual_seed(12)
    rel = torch.rand(5, 8, generator=g, dtype=D64)
    pos = rand_pos(5, 8, seed=11, p=0.2)
    pos[1] = False
    assert_same(lambda s: fastrank.ladder_loss(s, rel, hard=hard, positives=pos, direction=direction,
                                               reduction=reduction, **case),
                lambda s: ref_ladder(s, rel, pos, hard=hard, direction=direction,
                                     reduction=reduction, **case), sim)


@pytest.mark.parametrize("hard", [True, False])
def test_ladder_edge_cases(hard):
    sim = rand_sim(4, 4, seed=13)
    # all-zero relevance: Lev_1 is empty, so rung 2 adds 0 and the loss is the triplet rung
    zero = torch.zeros(4, 4, dtype=D64)
    torch.testing.assert_close(fastrank.ladder_loss(sim, zero, hard=hard),
                               fastrank.triplet_loss(sim, margin=0.2, mining="hardest" if hard else "all"))
    # all relevance 1: F is empty
    one = torch.ones(4, 4, dtype=D64)
    torch.testing.assert_close(fastrank.ladder_loss(sim, one, hard=hard),
                               fastrank.triplet_loss(sim, margin=0.2, mining="hardest" if hard else "all"))
    # weights (1, 0): exactly the triplet loss whatever the relevance
    rel = torch.rand(4, 4, dtype=D64)
    torch.testing.assert_close(fastrank.ladder_loss(sim, rel, weights=(1.0, 0.0), hard=hard),
                               fastrank.triplet_loss(sim, mining="hardest" if hard else "all"))
    # relevance exactly at the threshold belongs to the upper level (r >= theta_1)
    rel = torch.full((1, 3), 0.63, dtype=D64)
    rel[0, 2] = 0.1
    s = torch.tensor([[0.9, 0.1, 0.5]], dtype=D64)
    pos = torch.tensor([[True, False, False]])
    out = fastrank.ladder_loss(s, rel, positives=pos, direction="i2t", hard=hard, weights=(0.0, 1.0))
    assert out.item() == pytest.approx(0.01 - 0.1 + 0.5)
    out32 = fastrank.ladder_loss(s, rel.float(), positives=pos, direction="i2t", hard=hard, weights=(0.0, 1.0))
    assert out32.item() == pytest.approx(0.01 - 0.1 + 0.5)   # float32 0.63 is still >= theta_1
    # N = 1 and ties (the hard max/min split ties differently from the loop's first-max,
    # both valid subgradients: compare values there, gradients too for the pairwise sum)
    s = torch.full((1, 5), 0.3, dtype=D64, requires_grad=True)
    r = torch.tensor([[1.0, 0.9, 0.7, 0.2, 0.1]], dtype=D64)
    p = torch.tensor([[True, False, False, False, False]])
    fn = lambda x: fastrank.ladder_loss(x, r, hard=hard, positives=p, reduction="none")  # noqa: E731
    ref = lambda x: ref_ladder(x, r, p, hard=hard, reduction="none")  # noqa: E731
    if hard:
        torch.testing.assert_close(fn(s), ref(s))
    else:
        assert_same(fn, ref, s)


@pytest.mark.parametrize("hard", [True, False])
def test_ladder_gradcheck_and_module(hard):
    sim = rand_sim(4, 5, seed=14)
    rel = torch.rand(4, 5, dtype=D64, generator=torch.Generator().manual_seed(1))
    pos = torch.zeros(4, 5, dtype=torch.bool)
    pos[torch.arange(4), torch.arange(4)] = True
    kw = dict(thresholds=(0.7, 0.3), margins=(0.4, 0.3, 0.2), weights=(1.0, 0.5, 0.5), hard=hard)
    assert torch.autograd.gradcheck(
        lambda s: fastrank.ladder_loss(s, rel, positives=pos, reduction="none", **kw), (sim,))
    torch.testing.assert_close(fnn.LadderLoss(**kw)(sim, rel, positives=pos),
                               fastrank.ladder_loss(sim, rel, positives=pos, **kw))


def test_ladder_bad_input():
    sim = rand_sim(3, 3, grad=False)
    rel = torch.rand(3, 3, dtype=D64)
    with pytest.raises(ValueError, match="strictly decreasing"):
        fastrank.ladder_loss(sim, rel, thresholds=(0.3, 0.6), margins=(0.2, 0.1, 0.1), weights=(1, 1, 1))
    with pytest.raises(ValueError, match="margins"):
        fastrank.ladder_loss(sim, rel, margins=(0.2,))
    with pytest.raises(ValueError, match="weights"):
        fastrank.ladder_loss(sim, rel, weights=(1.0, 0.5, 0.1))
    with pytest.raises(ValueError, match="weights"):
        fastrank.ladder_loss(sim, rel, weights=(1.0, -0.5))
    with pytest.raises(ValueError, match="thresholds"):
        fastrank.ladder_loss(sim, rel, thresholds=0.5)
    with pytest.raises(ValueError, match="relevance"):
        fastrank.ladder_loss(sim, rel[:2])
    with pytest.raises(ValueError, match="hard"):
        fastrank.ladder_loss(sim, rel, hard="yes")
    with pytest.raises(ValueError, match="strictly decreasing"):
        fnn.LadderLoss(thresholds=(0.5, 0.5), margins=(1, 1, 1), weights=(1, 1, 1))


# ----------------------------------------------------------------------------- top-k

@pytest.mark.parametrize("k", [1, 2, 3, 10])
@pytest.mark.parametrize("direction,reduction", [("both", "mean"), ("i2t", "sum"), ("both", "none")])
def test_topk_matches_loop(k, direction, reduction):
    sim = rand_sim(5, 6, seed=21)
    pos = rand_pos(5, 6, seed=21, p=0.35)
    pos[2] = True            # no negatives
    pos[:, 0] = False        # a column with no positives
    assert_same(lambda s: fastrank.topk_loss(s, k, 0.3, pos, direction, reduction),
                lambda s: ref_topk(s, pos, k, 0.3, direction, reduction), sim)


def test_topk_edge_cases():
    sim = rand_sim(4, 4, seed=22)
    # k >= |Neg|: the mean of all negatives
    pos = torch.eye(4, dtype=torch.bool)
    row = sim[0].detach()
    exp = max(0.0, 0.2 + row[1:].mean().item() - row[0].item())
    assert fastrank.topk_loss(sim, k=100, direction="i2t", reduction="none")[0].item() == pytest.approx(exp)
    # N = 1 and ties
    s = torch.full((1, 4), 0.1, dtype=D64, requires_grad=True)
    p = torch.tensor([[False, True, False, False]])
    assert fastrank.topk_loss(s, k=2, positives=p, reduction="none").tolist() == pytest.approx([0.2, 0, 0, 0, 0])
    # module and gradcheck
    torch.testing.assert_close(fnn.TopKLoss(k=3, margin=0.1)(sim), fastrank.topk_loss(sim, 3, 0.1))
    assert torch.autograd.gradcheck(lambda x: fastrank.topk_loss(x, 2, 0.5, pos, reduction="none"), (sim,))


def test_topk_bad_input():
    sim = rand_sim(3, 3, grad=False)
    for k in (0, 1.5, True):
        with pytest.raises(ValueError, match="k"):
            fastrank.topk_loss(sim, k=k)
    with pytest.raises(ValueError, match="margin"):
        fastrank.topk_loss(sim, margin=float("inf"))
    with pytest.raises(ValueError, match="positives"):
        fastrank.topk_loss(rand_sim(2, 3, grad=False))
    with pytest.raises(ValueError, match="k"):
        fnn.TopKLoss(k=0)


# ----------------------------------------------------------------------------- DVSE

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_variance_weighted_matches_loop_multi_positive(reduction):
    g = torch.Generator().manual_seed(31)
    sub = (torch.rand(3, 5, 6, generator=g, dtype=D64) * 2 - 1).requires_grad_()
    pos = rand_pos(5, 6, seed=31, p=0.35)
    pos[0] = False            # no positive
    pos[1] = True             # no negative
    pos[2, :3] = True         # three positives: the variance of each excludes only its target
    assert_same(lambda s: fastrank.variance_weighted_loss(s, 0.3, pos, reduction),
                lambda s: ref_variance_weighted(s, pos, 0.3, reduction), sub, atol=1e-9)


def test_variance_weighted_diagonal_small_and_module():
    g = torch.Generator().manual_seed(32)
    sub = (torch.rand(2, 4, 4, generator=g, dtype=D64) * 2 - 1).requires_grad_()
    eye = torch.eye(4, dtype=torch.bool)
    assert_same(lambda s: fastrank.variance_weighted_loss(s),
                lambda s: ref_variance_weighted(s, eye), sub)
    # C = 2: one value left in the mixed distribution, std taken as 0, sigma = 1
    sub2 = (torch.rand(2, 2, 2, generator=g, dtype=D64) * 2 - 1).requires_grad_()
    torch.testing.assert_close(fastrank.variance_weighted_loss(sub2),
                               sum(fastrank.triplet_loss(sub2[k]) for k in range(2)))
    # K = 1, uniform similarities (zero variance): finite gradient
    flat = torch.zeros(1, 4, 4, dtype=D64, requires_grad=True)
    fastrank.variance_weighted_loss(flat).backward()
    assert torch.isfinite(flat.grad).all()
    torch.testing.assert_close(fnn.VarianceWeightedLoss(margin=0.1)(sub),
                               fastrank.variance_weighted_loss(sub, margin=0.1))
    assert torch.autograd.gradcheck(lambda s: fastrank.variance_weighted_loss(s, 0.5, reduction="none"), (sub,))


def test_variance_weighted_bad_input():
    with pytest.raises(ValueError, match="sub_sim"):
        fastrank.variance_weighted_loss(torch.rand(4, 4))
    with pytest.raises(ValueError, match="positives"):
        fastrank.variance_weighted_loss(torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match="positives"):
        fastrank.variance_weighted_loss(torch.rand(2, 3, 3), positives=torch.eye(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="margin"):
        fastrank.variance_weighted_loss(torch.rand(2, 3, 3), margin=-1.0)
    with pytest.raises(ValueError, match="reduction"):
        fastrank.variance_weighted_loss(torch.rand(2, 3, 3), reduction="max")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_orthogonal_matches_loop(reduction):
    g = torch.Generator().manual_seed(41)
    emb = torch.randn(5, 4, 3, generator=g, dtype=D64).requires_grad_()
    mask = (torch.rand(5, 4, generator=g) < 0.6).to(D64)
    assert_same(lambda e: fastrank.orthogonal_loss(e, mask, 0.4, reduction),
                lambda e: ref_orthogonal(e, mask, 0.4, reduction), emb)
    ones = torch.ones(5, 4, dtype=D64)
    assert_same(lambda e: fastrank.orthogonal_loss(e, None, 0.4, reduction),
                lambda e: ref_orthogonal(e, ones, 0.4, reduction), emb)


def test_orthogonal_edge_cases_gradcheck_module():
    # orthonormal sub-embeddings: 0 ; K = 1: 0 ; bool mask accepted
    e = torch.eye(3, dtype=D64).unsqueeze(0).repeat(2, 1, 1)
    assert fastrank.orthogonal_loss(e).item() == 0
    assert fastrank.orthogonal_loss(torch.randn(3, 1, 4, dtype=D64), beta=0.0).item() == 0
    same = torch.ones(1, 2, 2, dtype=D64)                 # <e_1, e_2> = 2, counted twice
    assert fastrank.orthogonal_loss(same, beta=0.5).item() == pytest.approx(3.5)
    assert fastrank.orthogonal_loss(same, torch.tensor([[True, False]]), beta=0.0).item() == 0
    g = torch.Generator().manual_seed(42)
    emb = torch.randn(3, 3, 4, generator=g, dtype=D64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: fastrank.orthogonal_loss(x, beta=0.1, reduction="none"), (emb,))
    torch.testing.assert_close(fnn.OrthogonalLoss(beta=0.1)(emb), fastrank.orthogonal_loss(emb, beta=0.1))


def test_orthogonal_bad_input():
    e = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="sub_emb"):
        fastrank.orthogonal_loss(torch.randn(3, 4))
    with pytest.raises(ValueError, match="mask"):
        fastrank.orthogonal_loss(e, torch.ones(2, 4))
    with pytest.raises(ValueError, match="mask"):
        fastrank.orthogonal_loss(e, torch.full((2, 3), 2.0))
    with pytest.raises(TypeError, match="mask"):
        fastrank.orthogonal_loss(e, [[1, 1, 1], [1, 1, 1]])
    with pytest.raises(ValueError, match="beta"):
        fastrank.orthogonal_loss(e, beta=-0.1)
    with pytest.raises(ValueError, match="beta"):
        fnn.OrthogonalLoss(beta=float("nan"))


@pytest.mark.parametrize("module,functional,inputs,hyper", [
    (fnn.VarianceWeightedLoss, fastrank.variance_weighted_loss, (torch.rand(2, 3, 3, dtype=D64),),
     {"margin": 0.1, "reduction": "sum"}),
    (fnn.OrthogonalLoss, fastrank.orthogonal_loss, (torch.randn(3, 2, 4, dtype=D64), torch.ones(3, 2)),
     {"beta": 0.1, "reduction": "none"})], ids=["variance_weighted", "orthogonal"])
def test_dvse_module_forms_check_their_hyper_parameters_once_not_per_call(module, functional, inputs, hyper,
                                                                          monkeypatch):
    """The module checks them when they are set, with its functional's own check; its call does
    not check them again, while the functional checks them at every call."""
    loss = module(**hyper)
    check = module._check_hyper
    home = sys.modules[functional.__module__]
    assert getattr(home, check.__name__, None) is check
    calls = []

    def counted(*args):
        calls.append(args)
        return check(*args)
    monkeypatch.setattr(home, check.__name__, counted)
    out = loss(*inputs)
    loss(*inputs)
    assert calls == [], "the module's call checked its hyper-parameters again"
    torch.testing.assert_close(out, functional(*inputs, **hyper), rtol=0, atol=0)
    functional(*inputs, **hyper)
    assert len(calls) == 2, "the functional checks them at every call, with the module's check"


# ----------------------------------------------------------------------------- docs/spec.md §1 for every loss
# Hyper-parameters: any real number (Python, numpy scalar, 0-d tensor); rejected only when
# out of range or not a number, with the argument and the type named. Structure before
# values. Relevance range (ladder: r >= 0).

def _np(x):
    import numpy as np
    return np.float32(x) if isinstance(x, float) else np.int64(x)


def _t(x):
    return torch.tensor(x)


HYPER_CALLS = [
    # (name, call(value) on fixed data, the plain value)
    ("margin", lambda v: fastrank.triplet_loss(rand_sim(4, 4, 60), margin=v), 0.25),
    ("gamma", lambda v: fastrank.triplet_loss(rand_sim(4, 4, 60), mining="soft", gamma=v), 10.0),
    ("k", lambda v: fastrank.topk_loss(rand_sim(4, 4, 61), k=v), 2),
    ("margin", lambda v: fastrank.topk_loss(rand_sim(4, 4, 61), margin=v), 0.5),
    ("margins", lambda v: fastrank.ladder_loss(rand_sim(4, 4, 62), torch.rand(4, 4, dtype=D64),
                                               margins=(v, 0.1)), 0.3),
    ("thresholds", lambda v: fastrank.ladder_loss(rand_sim(4, 4, 62), torch.rand(4, 4, dtype=D64),
                                                  thresholds=(v,)), 0.5),
    ("margin", lambda v: fastrank.variance_weighted_loss(rand_sim(4, 4, 63).unsqueeze(0), margin=v), 0.2),
    ("beta", lambda v: fastrank.orthogonal_loss(torch.randn(2, 3, 4, dtype=D64,
                                                            generator=torch.Generator().manual_seed(0)), beta=v), 0.1),
    ("gamma", lambda v: fastrank.fast_rerank(rand_sim(3, 4, 64), gamma=(v, 20.0))[0], 25.0),
    ("lam", lambda v: fastrank.fast_rerank(rand_sim(3, 4, 64), lam=(v, v))[1], 20.0),
    ("k", lambda v: fastrank.fast_rerank_topk(rand_sim(3, 4, 65, grad=False), rand_sim(5, 4, 66, grad=False),
                                              k=v).i2t_indices, 2),
]


@pytest.mark.parametrize("name,call,value", HYPER_CALLS, ids=[f"{i}-{c[0]}" for i, c in enumerate(HYPER_CALLS)])
def test_hyper_parameters_accept_numpy_scalars_and_0d_tensors(name, call, value):
    torch.manual_seed(0)
    want = call(value)
    for v in (_np(value), _t(value)):
        torch.manual_seed(0)
        torch.testing.assert_close(call(v), want, msg=f"{name}={v!r}")


@pytest.mark.parametrize("name,call,value", HYPER_CALLS, ids=[f"{i}-{c[0]}" for i, c in enumerate(HYPER_CALLS)])
def test_hyper_parameters_rejected_name_argument_and_type(name, call, value):
    for bad, kind in (("1", "(str)"), (True, "(bool)"), (torch.tensor([value, value]), "tensor of shape (2,)"),
                      (None, "(NoneType)")):
        with pytest.raises(ValueError, match=name) as info:
            call(bad)
        assert kind in str(info.value), str(info.value)
    if isinstance(value, int):         # integers: a float is not one, whatever its value
        with pytest.raises(ValueError, match=f"{name} must be an integer") as info:
            call(torch.tensor(float(value)))
        assert "0-d torch.float32 tensor" in str(info.value)
    elif name != "thresholds":         # out of range, as a 0-d tensor: the message names the type
        with pytest.raises(ValueError, match=name) as info:
            call(torch.tensor(-1.0))
        assert "-1.0 (a 0-d torch.float32 tensor)" in str(info.value)


def test_structure_is_checked_before_values():
    """A NaN in sim is not what gets reported when another argument is malformed."""
    nan = torch.full((3, 3), float("nan"), dtype=D64)
    with pytest.raises(TypeError, match="positives must have dtype torch.bool"):
        fastrank.triplet_loss(nan, positives=torch.eye(3))
    with pytest.raises(ValueError, match="positives is on meta but sim is on cpu"):
        fastrank.topk_loss(nan, positives=torch.ones(3, 3, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="margin"):
        fastrank.triplet_loss(nan, margin=-1.0)
    with pytest.raises(ValueError, match="relevance is on meta but sim is on cpu"):
        fastrank.ladder_loss(nan, torch.empty(3, 3, device="meta"))
    with pytest.raises(ValueError, match="thresholds"):
        fastrank.ladder_loss(nan, torch.rand(3, 3, dtype=D64), thresholds=(0.2, 0.5),
                             margins=(0.1, 0.1, 0.1), weights=(1, 1, 1))
    with pytest.raises(ValueError, match="positives must have shape"):
        fastrank.variance_weighted_loss(torch.full((2, 3, 3), float("nan")), positives=torch.eye(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must have shape"):
        fastrank.orthogonal_loss(torch.full((2, 3, 4), float("nan")), torch.ones(2, 4))
    with pytest.raises(ValueError, match="mask is on meta"):
        fastrank.orthogonal_loss(torch.full((2, 3, 4), float("nan")), torch.ones(2, 3, device="meta"))
    # values are still checked once the structure is right, under the data's own name
    with pytest.raises(ValueError, match="sub_sim contains NaN"):
        fastrank.variance_weighted_loss(torch.full((2, 3, 3), float("nan")))
    with pytest.raises(ValueError, match="sub_emb contains NaN"):
        fastrank.orthogonal_loss(torch.full((2, 3, 4), float("nan")))


def test_ladder_rejects_negative_relevance(monkeypatch):
    """Raw cosine in [-1, 1] instead of (1 + cos) / 2 would put every 'somewhat relevant'
    negative into the lowest level: bad input (docs/spec.md §1), checked where NaN is."""
    sim = rand_sim(4, 4, 67, grad=False)
    cos = torch.rand(4, 4, dtype=D64, generator=torch.Generator().manual_seed(3)) * 2 - 1
    with pytest.raises(ValueError, match=r"relevance must be >= 0 for ladder_loss.*minimum of -"):
        fastrank.ladder_loss(sim, cos)
    with pytest.raises(ValueError, match="relevance must be >= 0"):
        fnn.LadderLoss()(sim, cos)
    with pytest.raises(ValueError, match="relevance contains NaN"):
        fastrank.ladder_loss(sim, torch.full((4, 4), float("nan"), dtype=D64))
    fastrank.ladder_loss(sim, (1 + cos) / 2)
    fastrank.ladder_loss(sim, torch.zeros(4, 4, dtype=D64))
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    fastrank.ladder_loss(sim, cos)       # the switch turns the range check off with the NaN check


# ----------------------------------------------------------------------------- CombinedLoss

def test_combined_loss_string_spec():
    sim = rand_sim(5, 5, seed=51)
    rel = torch.rand(5, 5, dtype=D64, generator=torch.Generator().manual_seed(2))
    loss = fnn.CombinedLoss("triplet:1.0, smooth_ndcg:0.5,topk", options={"triplet": {"margin": 0.1},
                                                                       "smooth_ndcg": {"tau": 0.1}})
    total, parts = loss(sim, relevance=rel)
    t = fastrank.triplet_loss(sim, margin=0.1)
    n = fastrank.smooth_ndcg_loss(sim, rel, tau=0.1)
    k = fastrank.topk_loss(sim)
    torch.testing.assert_close(total, t + 0.5 * n + k)
    assert list(parts) == ["triplet", "smooth_ndcg", "topk"]
    torch.testing.assert_close(parts["smooth_ndcg"], n.detach())   # unweighted
    assert all(not v.requires_grad for v in parts.values())
    g1, = torch.autograd.grad(total, sim)
    g2, = torch.autograd.grad(t + 0.5 * n + k, sim)
    torch.testing.assert_close(g1, g2)


def test_combined_loss_positives_and_relevance_routing():
    sim = rand_sim(3, 5, seed=52)                          # N != M: triplet needs positives
    rel = torch.rand(3, 5, dtype=D64)
    pos = rand_pos(3, 5, seed=52, p=0.4)
    loss = fnn.CombinedLoss("triplet:2,ladder:1,smooth_ndcg:1")
    total, parts = loss(sim, rel, positives=pos)           # smooth_ndcg gets no positives
    exp = (2 * fastrank.triplet_loss(sim, positives=pos) + fastrank.ladder_loss(sim, rel, positives=pos)
           + fastrank.smooth_ndcg_loss(sim, rel))
    torch.testing.assert_close(total, exp)
    with pytest.raises(ValueError, match="ladder.*relevance"):
        loss(sim, positives=pos)
    # a spec without relevance-based terms needs none
    total, _ = fnn.CombinedLoss("triplet:1")(rand_sim(3, 3, seed=1))
    assert total.ndim == 0


def test_combined_loss_module_list():
    sim = rand_sim(4, 4, seed=53)
    loss = fnn.CombinedLoss([(fnn.TripletLoss(margin=0.1), 1.0), (fnn.TripletLoss(mining="all"), 0.5),
                             (fnn.TopKLoss(k=2), 2.0)])
    total, parts = loss(sim)
    assert list(parts) == ["triplet", "triplet_2", "topk"]
    torch.testing.assert_close(total, fastrank.triplet_loss(sim, margin=0.1)
                               + 0.5 * fastrank.triplet_loss(sim, mining="all") + 2 * fastrank.topk_loss(sim, k=2))


@pytest.mark.parametrize("name", ["triplet", "smooth_ndcg", "kendall", "kendall_sw", "ladder", "topk"])
def test_combined_loss_every_name(name):
    sim = rand_sim(4, 4, seed=54)
    rel = torch.rand(4, 4, dtype=D64, generator=torch.Generator().manual_seed(3))
    loss = fnn.CombinedLoss(f"{name}:0.5")
    total, parts = loss(sim, rel)
    fn = getattr(fastrank, name + "_loss")
    exp = fn(sim, rel) if name in ("smooth_ndcg", "kendall", "kendall_sw", "ladder") else fn(sim)
    torch.testing.assert_close(total, 0.5 * exp)
    torch.testing.assert_close(parts[name], exp.detach())


def test_combined_loss_bad_spec():
    for spec, msg in [("tripplet:1", "unknown loss"), ("triplet:abc", "number"), ("triplet:-1", "weight"),
                      ("triplet:1,,topk:1", "empty"), ("triplet:1,triplet:2", "once"),
                      ("triplet:nan", "weight"), ([], "non-empty"), ([(3, 1.0)], "pair")]:
        with pytest.raises(ValueError, match=msg):
            fnn.CombinedLoss(spec)
    with pytest.raises(ValueError, match="options"):
        fnn.CombinedLoss("triplet:1", options={"topk": {"k": 2}})
    with pytest.raises(ValueError, match="margin"):
        fnn.CombinedLoss("triplet:1", options={"triplet": {"margin": -1.0}})
