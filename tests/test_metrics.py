"""fastrank.metrics: loop oracles, scipy / sklearn, hand-made cases, blocks, bad input."""
import math

import numpy as np
import pytest
import scipy.stats
import torch
from sklearn.metrics import ndcg_score

import fastrank
import fastrank.metrics as M
from fastrank.metrics import _common, _kendall, graded

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")


# ---------------------------------------------------------------- data
def case(n_img, cpi=5, seed=0, ties=False, dtype=torch.float64):
    """sim (n_img, n_img * cpi), caption_to_image (caption j -> image j // cpi), relevance."""
    g = torch.Generator().manual_seed(seed)
    m = n_img * cpi
    sim = torch.randn(n_img, m, generator=g, dtype=torch.float64)
    rel = torch.rand(n_img, m, generator=g, dtype=torch.float64)
    if ties:
        sim = (sim * 2).round() / 2
        rel = (rel * 3).round() / 3
    return sim.to(dtype), torch.arange(m) // cpi, rel.to(dtype)


def rand_mats(n, m, seed, ties):
    g = torch.Generator().manual_seed(seed)
    sim = torch.randn(n, m, generator=g, dtype=torch.float64)
    rel = torch.rand(n, m, generator=g, dtype=torch.float64)
    if ties:
        sim = (sim * 2).round() / 2
        rel = (rel * 3).round() / 3
    return sim, rel


SHAPES = [(1, 2), (2, 1), (1, 1), (3, 5), (7, 4), (12, 30), (40, 9)]


# ---------------------------------------------------------------- oracles (loops, float64)
def oracle_ranks(sim, c2i):
    """VSE++ i2t / t2i ranks (1-based), ties counted against the query."""
    S = sim.tolist()
    c2i = c2i.tolist()
    n, m = len(S), len(S[0])
    r_i2t = []
    for i in range(n):
        pos = [j for j in range(m) if c2i[j] == i]
        best = max(S[i][j] for j in pos)
        r_i2t.append(1 + sum(1 for j in range(m) if c2i[j] != i and S[i][j] >= best))
    r_t2i = []
    for j in range(m):
        sp = S[c2i[j]][j]
        r_t2i.append(1 + sum(1 for i in range(n) if i != c2i[j] and S[i][j] >= sp))
    return r_i2t, r_t2i


def oracle_recall(sim, c2i, ks):
    r_i2t, r_t2i = oracle_ranks(sim, c2i)
    out = {}
    for d, r in (("i2t", r_i2t), ("t2i", r_t2i)):
        for k in ks:
            out[f"{d}_r{k}"] = 100.0 * sum(x <= k for x in r) / len(r)
    out["rsum"] = sum(v for v in out.values())
    for d, r in (("i2t", r_i2t), ("t2i", r_t2i)):
        r0 = np.array(r) - 1                         # VSE++ code: 0-based ranks
        out[f"{d}_medr"] = float(np.floor(np.median(r0)) + 1)
        out[f"{d}_meanr"] = float(r0.mean() + 1)
    return out


def oracle_sets(scores, pos):
    """mAP@R, R-P of one query: the list sorted by score descending, a negative before a
    positive of equal score. Returns None without positives."""
    R = sum(pos)
    if R == 0:
        return None
    order = sorted(range(len(scores)), key=lambda j: (-scores[j], pos[j]))
    top = [pos[j] for j in order[:R]]
    hits, ap = 0, 0.0
    for i, p in enumerate(top, start=1):
        if p:
            hits += 1
            ap += hits / i
    return ap / R, hits / R


def oracle_cs(scores, rel, k):
    order = sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:k]
    return scipy_tau([scores[j] for j in order], [rel[j] for j in order])


def mean_skip(values):
    vals = [v for v in values if v is not None]
    return (float(np.mean(vals)) if vals else 0.0), len(values) - len(vals)


def per_direction(sim, rel, fn):
    """{"i2t": [fn(row, rel_row)], "t2i": [fn(col, rel_col)]} as python lists."""
    S, R = sim.tolist(), rel.tolist()
    return {"i2t": [fn(s, r) for s, r in zip(S, R)],
            "t2i": [fn(list(s), list(r)) for s, r in zip(zip(*S), zip(*R))]}


def scipy_tau(s, r):
    if len(s) < 2:
        return None                                # scipy: NaN (too small)
    t = scipy.stats.kendalltau(s, r).statistic
    return None if np.isnan(t) else t


# ---------------------------------------------------------------- recall
@pytest.mark.parametrize("n_img,cpi", [(1, 1), (1, 5), (4, 1), (6, 5), (13, 3)])
@pytest.mark.parametrize("ties", [False, True])
def test_recall_matches_loop_oracle(n_img, cpi, ties):
    sim, c2i, _ = case(n_img, cpi, seed=n_img * 7 + cpi, ties=ties)
    for ks in [(1, 5, 10), (2,), (1, 3)]:
        got = M.recall_at_k(sim, c2i, ks)
        exp = oracle_recall(sim, c2i, ks)
        assert list(got) == list(exp)
        for key in exp:
            assert got[key] == pytest.approx(exp[key], abs=1e-9), key


def test_recall_any_caption_layout():
    g = torch.Generator().manual_seed(3)
    c2i = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0, 3])              # unsorted, 1-3 captions each
    sim = torch.randn(4, 9, generator=g, dtype=torch.float64)
    got = M.recall_at_k(sim, c2i, (1, 2))
    exp = oracle_recall(sim, c2i, (1, 2))
    for key in exp:
        assert got[key] == pytest.approx(exp[key]), key


def test_recall_hand_made():
    # 2 images x 4 captions, captions 0, 1 of image 0 and 2, 3 of image 1
    sim = torch.tensor([[0.1, 0.9, 0.5, 0.95],
                        [0.8, 0.2, 0.3, 0.1]])
    c2i = torch.tensor([0, 0, 1, 1])
    r = M.recall_at_k(sim, c2i, ks=(1, 2))
    # i2t: image 0 best own caption 0.9 ranks 2nd (0.95 above); image 1 best own 0.3 ranks 2nd
    # t2i: caption 0 -> image 0 (0.1 < 0.8): rank 2; caption 1: rank 1; caption 2: 0.3 < 0.5: rank 2;
    #      caption 3: 0.1 < 0.95: rank 2
    assert r["i2t_r1"] == 0.0 and r["i2t_r2"] == 100.0
    assert r["t2i_r1"] == 25.0 and r["t2i_r2"] == 100.0
    assert r["rsum"] == 225.0
    assert r["i2t_medr"] == 2.0 and r["i2t_meanr"] == 2.0
    assert r["t2i_medr"] == 2.0 and r["t2i_meanr"] == 1.75
    assert list(r) == ["i2t_r1", "i2t_r2", "t2i_r1", "t2i_r2", "rsum",
                       "i2t_medr", "i2t_meanr", "t2i_medr", "t2i_meanr"]


def test_recall_ties_count_against_the_query():
    sim = torch.zeros(3, 3)
    r = M.recall_at_k(sim, torch.arange(3), ks=(1,))
    assert r["i2t_r1"] == 0.0 and r["t2i_r1"] == 0.0
    assert r["i2t_meanr"] == 3.0 and r["t2i_medr"] == 3.0


def test_median_rank_even_count_floors_like_vsepp():
    # ranks 1 and 2 -> 0-based median 0.5 -> floor 0 -> medr 1
    sim = torch.tensor([[1.0, 0.0], [2.0, 0.5]])
    r = M.recall_at_k(sim, torch.arange(2), ks=(1,))
    assert r["i2t_medr"] == 1.0 and r["i2t_meanr"] == 1.5


def test_coco_5fold_1k_is_the_mean_of_the_folds():
    sim, c2i, rel = case(20, 5, seed=11)
    got = M.coco_5fold_1k(sim, c2i, rel, cs_k=(7,))
    folds = []
    for f in range(5):
        s = sim[4 * f:4 * f + 4, 20 * f:20 * f + 20]
        r = rel[4 * f:4 * f + 4, 20 * f:20 * f + 20]
        folds.append(M.evaluate(s, torch.arange(20) // 5, r, cs_k=(7,)))
        assert folds[-1]["i2t_r1"] == pytest.approx(oracle_recall(s, torch.arange(20) // 5, (1,))["i2t_r1"])
    assert list(got) == list(folds[0])
    for key in got:
        assert got[key] == pytest.approx(sum(fd[key] for fd in folds) / 5), key
    assert got.skipped == {k: sum(fd.skipped[k] for fd in folds) for k in folds[0].skipped}
    # recall-only folds equal recall_at_k on the fold
    got = M.coco_5fold_1k(sim, c2i)
    exp = [M.recall_at_k(sim[4 * f:4 * f + 4, 20 * f:20 * f + 20], torch.arange(20) // 5) for f in range(5)]
    assert got["rsum"] == pytest.approx(sum(e["rsum"] for e in exp) / 5)


def test_coco_5fold_1k_unsorted_captions():
    g = torch.Generator().manual_seed(5)
    c2i = torch.randperm(50, generator=g) % 10                  # 5 captions per image, shuffled
    sim = torch.randn(10, 50, generator=g, dtype=torch.float64)
    got = M.coco_5fold_1k(sim, c2i, ks=(1,))
    vals = []
    for f in range(5):
        cols = [j for j in range(50) if 2 * f <= int(c2i[j]) < 2 * f + 2]
        vals.append(oracle_recall(sim[2 * f:2 * f + 2, cols], c2i[cols] - 2 * f, (1,))["t2i_r1"])
    assert got["t2i_r1"] == pytest.approx(sum(vals) / 5)


# ---------------------------------------------------------------- NDCG
@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("ties", [False, True])
def test_ndcg_matches_sklearn(n, m, ties):
    sim, rel = rand_mats(n, m, seed=n * 13 + m, ties=ties)
    for k in (None, 1, 2, 5, 100):
        got = M.ndcg(sim, rel, k=k)
        # sklearn takes the gain as given: pass 2^r - 1 explicitly
        if m > 1:
            assert got["i2t"] == pytest.approx(ndcg_score((2 ** rel - 1).numpy(), sim.numpy(), k=k), abs=1e-12)
        if n > 1:
            assert got["t2i"] == pytest.approx(ndcg_score((2 ** rel.T - 1).numpy(), sim.T.numpy(), k=k), abs=1e-12)
        assert got.skipped == {"i2t": 0, "t2i": 0}


def test_ndcg_float32_and_half_inputs():
    sim, rel = rand_mats(9, 14, seed=2, ties=False)
    exp = ndcg_score((2 ** rel - 1).numpy(), sim.numpy())
    assert M.ndcg(sim.float(), rel.float())["i2t"] == pytest.approx(exp, abs=1e-6)
    sim_h = sim.half()
    exp_h = ndcg_score((2 ** rel - 1).numpy(), sim_h.double().numpy())
    assert M.ndcg(sim_h, rel)["i2t"] == pytest.approx(exp_h, abs=1e-9)


def test_ndcg_hand_made():
    rel = torch.tensor([[1.0, 0.5, 0.0]])
    assert M.ndcg(torch.tensor([[3.0, 2.0, 1.0]]), rel)["i2t"] == pytest.approx(1.0)
    g = [1.0, 2 ** 0.5 - 1, 0.0]
    dcg = g[0] / math.log2(4) + g[1] / math.log2(3)
    idcg = g[0] / math.log2(2) + g[1] / math.log2(3)
    assert M.ndcg(torch.tensor([[1.0, 2.0, 3.0]]), rel)["i2t"] == pytest.approx(dcg / idcg)
    # all three tied: each gets the mean discount of positions 1..3
    mean_d = (1 + 1 / math.log2(3) + 0.5) / 3
    assert M.ndcg(torch.zeros(1, 3), rel)["i2t"] == pytest.approx(sum(g) * mean_d / idcg)
    # all-zero gains score 0 (sklearn)
    assert M.ndcg(torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2))["i2t"] == 0.0
    # k=1: only the first position counts
    assert M.ndcg(torch.tensor([[1.0, 2.0, 3.0]]), rel, k=1)["i2t"] == pytest.approx(0.0)


# ---------------------------------------------------------------- Kendall tau
@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("impl", ["scipy", "torch"])
def test_kendall_tau_matches_scipy(n, m, ties, impl, monkeypatch):
    sim, rel = rand_mats(n, m, seed=n * 17 + m, ties=ties)
    monkeypatch.setattr(_kendall, "_scipy_kendall_dis", _kendall._scipy_kendall_dis if impl == "scipy" else None)
    got = M.kendall_tau(sim, rel)
    exp = per_direction(sim, rel, scipy_tau)
    for d in ("i2t", "t2i"):
        mean, skipped = mean_skip(exp[d])
        assert got[d] == pytest.approx(mean, abs=1e-12)
        assert got.skipped[d] == skipped


def test_kendall_tau_float32_heavy_ties():
    g = torch.Generator().manual_seed(9)
    sim = torch.randint(0, 4, (30, 50), generator=g).float()
    rel = torch.randint(0, 3, (30, 50), generator=g).float()
    sim[3] = 1.0                                   # a constant score row -> skipped
    rel[:, 7] = 0.5                                # a constant relevance column -> skipped
    got = M.kendall_tau(sim, rel)
    exp = per_direction(sim.double(), rel.double(), scipy_tau)
    for d in ("i2t", "t2i"):
        mean, skipped = mean_skip(exp[d])
        assert got[d] == pytest.approx(mean, abs=1e-12)
        assert got.skipped[d] == skipped
    assert got.skipped == {"i2t": 1, "t2i": 1}


def test_kendall_tau_hand_made_and_all_skipped():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert M.kendall_tau(x, x)["i2t"] == pytest.approx(1.0)
    assert M.kendall_tau(x, -x)["i2t"] == pytest.approx(-1.0)
    # one discordant pair out of 6, no ties: (5 - 1) / 6
    assert M.kendall_tau(x, torch.tensor([[1.0, 2.0, 4.0, 3.0]]))["i2t"] == pytest.approx(4 / 6)
    r = M.kendall_tau(torch.ones(3, 4), torch.rand(3, 4))
    assert r["i2t"] == 0.0 and r.skipped["i2t"] == 3      # every list constant: 0.0, never NaN
    assert r.skipped["t2i"] == 4


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 16, 17, 100, 1000])
def test_inversion_counter_vs_brute_force(n):
    g = torch.Generator().manual_seed(n)
    q = torch.stack([torch.randperm(n, generator=g) for _ in range(6)] + [torch.arange(n), torch.arange(n).flip(0)])
    got = _kendall.inversions(q)
    qn = q.numpy()
    exp = [int(sum((qn[r, i] > qn[r, i + 1:]).sum() for i in range(n))) for r in range(len(qn))]
    assert got.tolist() == exp
    assert got[-1] == n * (n - 1) // 2 and got[-2] == 0


@pytest.mark.parametrize("ties", [False, True])
def test_discordant_counters_agree(ties):
    g = torch.Generator().manual_seed(4)
    x = torch.randint(0, 6 if ties else 10 ** 6, (20, 300), generator=g).double()
    y = torch.randint(0, 6 if ties else 10 ** 6, (20, 300), generator=g).double()
    a = graded.graded_block(x, y, want_tau=True, tau_impl="scipy")
    b = graded.graded_block(x, y, want_tau=True, tau_impl="torch")
    assert torch.equal(a["tau"], b["tau"])


# ---------------------------------------------------------------- CS@K
@pytest.mark.parametrize("n,m", [(1, 5), (5, 1), (6, 9), (20, 31)])
@pytest.mark.parametrize("ties", [False, True])
def test_coherent_score_matches_oracle(n, m, ties):
    sim, rel = rand_mats(n, m, seed=n + 100 * m, ties=ties)
    for k in (1, 2, 4, 10, 1000):
        got = M.coherent_score(sim, rel, k)
        exp = per_direction(sim, rel, lambda s, r: oracle_cs(s, r, k))
        for d in ("i2t", "t2i"):
            mean, skipped = mean_skip(exp[d])
            assert got[d] == pytest.approx(mean, abs=1e-12), (k, d)
            assert got.skipped[d] == skipped


def test_coherent_score_inside_evaluate_with_ties():
    # evaluate takes the top-K from its full sort; ties at the cut must follow the same rule
    sim, c2i, rel = case(8, 5, seed=12, ties=True)
    sim = (sim * 2).round()                                         # many ties in the scores
    for k in (1, 3, 7, 40):
        out = M.evaluate(sim, c2i, rel, cs_k=(k,))
        exp = per_direction(sim, rel, lambda s, r: oracle_cs(s, r, k))
        for d in ("i2t", "t2i"):
            mean, skipped = mean_skip(exp[d])
            assert out[f"{d}_cs{k}"] == pytest.approx(mean, abs=1e-12), (k, d)
            assert out.skipped[f"{d}_cs{k}"] == skipped


def test_coherent_score_ties_at_the_cut_take_the_lower_index():
    sim = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0]])
    rel = torch.tensor([[0.9, 0.1, 0.5, 0.8, 1.0]])
    # top-2 = items 0 and 1 (index 1 beats 2, 3): scores (3, 1), relevance (0.9, 0.1): tau 1
    assert M.coherent_score(sim, rel, 2)["i2t"] == pytest.approx(1.0)
    # top-K with K >= M is Kendall tau over everything
    assert M.coherent_score(sim, rel, 5)["i2t"] == pytest.approx(M.kendall_tau(sim, rel)["i2t"])


# ---------------------------------------------------------------- mAP@R, R-Precision
@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("ties", [False, True])
def test_map_at_r_and_r_precision_bool_mask(n, m, ties):
    sim, _ = rand_mats(n, m, seed=n * 5 + m, ties=ties)
    g = torch.Generator().manual_seed(n + m)
    pos = torch.rand(n, m, generator=g) < 0.3
    got_map, got_rp = M.map_at_r(sim, pos), M.r_precision(sim, pos)
    P = pos.tolist()
    for d, (S, PP) in {"i2t": (sim.tolist(), P), "t2i": ([list(c) for c in zip(*sim.tolist())],
                                                       [list(c) for c in zip(*P)])}.items():
        res = [oracle_sets(s, p) for s, p in zip(S, PP)]
        mean_map, skipped = mean_skip([r and r[0] for r in res])
        mean_rp, _ = mean_skip([r and r[1] for r in res])
        assert got_map[d] == pytest.approx(mean_map, abs=1e-12)
        assert got_rp[d] == pytest.approx(mean_rp, abs=1e-12)
        assert got_map.skipped[d] == skipped == got_rp.skipped[d]


def test_map_at_r_caption_to_image_equals_mask():
    sim, c2i, _ = case(8, 5, seed=21, ties=True)
    mask = c2i.unsqueeze(0) == torch.arange(8).unsqueeze(1)
    for fn in (M.map_at_r, M.r_precision):
        a, b = fn(sim, c2i), fn(sim, mask)
        assert a == b and a.skipped == {"i2t": 0, "t2i": 0}


def test_map_at_r_image_without_captions_is_skipped():
    sim, c2i, _ = case(5, 3, seed=22)
    c2i = torch.where(c2i == 4, 0, c2i)                          # image 4 has no caption left
    mask = c2i.unsqueeze(0) == torch.arange(5).unsqueeze(1)
    got = M.map_at_r(sim, c2i)
    assert got.skipped == {"i2t": 1, "t2i": 0} and got == M.map_at_r(sim, mask)
    res = [oracle_sets(s, p) for s, p in zip(sim.tolist(), mask.tolist())]
    assert got["i2t"] == pytest.approx(mean_skip([r and r[0] for r in res])[0])


def test_map_at_r_hand_made():
    # ranking: pos, neg, pos, neg -> R = 2: top-2 = [pos, neg]: P@1 = 1 -> mAP@R = 1/2, R-P = 1/2
    sim = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    pos = torch.tensor([[True, False, True, False]])
    assert M.map_at_r(sim, pos)["i2t"] == pytest.approx(0.5)
    assert M.r_precision(sim, pos)["i2t"] == pytest.approx(0.5)
    # ranking: neg, pos, pos -> top-2 = [neg, pos]: P@2 = 1/2 -> mAP@R = 1/4
    sim = torch.tensor([[3.0, 2.0, 1.0]])
    pos = torch.tensor([[False, True, True]])
    assert M.map_at_r(sim, pos)["i2t"] == pytest.approx(0.25)
    # a positive tied with a negative ranks after it
    sim = torch.tensor([[1.0, 1.0]])
    pos = torch.tensor([[True, False]])
    assert M.map_at_r(sim, pos)["i2t"] == 0.0 and M.r_precision(sim, pos)["i2t"] == 0.0
    # perfect ranking
    assert M.map_at_r(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([[True, True, False]]))["i2t"] == 1.0


# ---------------------------------------------------------------- evaluate
SPEC_KEYS = ["i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum",
             "i2t_medr", "i2t_meanr", "t2i_medr", "t2i_meanr"]


def test_evaluate_keys_and_values():
    sim, c2i, rel = case(10, 5, seed=1)
    out = M.evaluate(sim, c2i)
    assert list(out) == SPEC_KEYS + ["i2t_map_r", "t2i_map_r", "i2t_rp", "t2i_rp"]
    out = M.evaluate(sim, c2i, rel, cs_k=(5, 20))
    assert list(out) == SPEC_KEYS + ["i2t_ndcg", "t2i_ndcg", "i2t_tau", "t2i_tau", "i2t_cs5", "t2i_cs5",
                                     "i2t_cs20", "t2i_cs20", "i2t_map_r", "t2i_map_r", "i2t_rp", "t2i_rp"]
    rec = M.recall_at_k(sim, c2i)
    for k in rec:
        assert out[k] == rec[k]
    for name, res in [("ndcg", M.ndcg(sim, rel)), ("tau", M.kendall_tau(sim, rel)),
                      ("cs5", M.coherent_score(sim, rel, 5)), ("cs20", M.coherent_score(sim, rel, 20)),
                      ("map_r", M.map_at_r(sim, c2i)), ("rp", M.r_precision(sim, c2i))]:
        for d in ("i2t", "t2i"):
            assert out[f"{d}_{name}"] == pytest.approx(res[d], abs=1e-12), name
            if name != "ndcg":
                assert out.skipped[f"{d}_{name}"] == res.skipped[d]
    assert "i2t_cs5" not in M.evaluate(sim, c2i, rel, cs_k=())


def spec3_rerank(sim, gamma=(25.0, 25.0), lam=(20.0, 20.0), impl="auto"):
    """Stand-in for fastrank.fast_rerank from the docs/spec.md §3 formula."""
    i2t = gamma[1] * sim - torch.logsumexp(gamma[0] * sim, dim=0, keepdim=True)
    t2i = lam[1] * sim - torch.logsumexp(lam[0] * sim, dim=1, keepdim=True)
    return i2t, t2i


def _check_rerank_result(out, sim, c2i, rel, gamma, lam, rerank_fn=None):
    i2t, t2i = (rerank_fn or spec3_rerank)(sim, gamma, lam)
    a, b = M.evaluate(i2t, c2i, rel), M.evaluate(t2i, c2i, rel)
    for key in out:
        src = a if key.startswith("i2t") else b
        if key == "rsum":
            continue
        assert out[key] == pytest.approx(src[key], abs=1e-12), key
    assert out["rsum"] == pytest.approx(sum(out[k] for k in SPEC_KEYS if "_r" in k and "mean" not in k
                                            and "med" not in k))


def test_evaluate_rerank_uses_i2t_and_t2i_scores(monkeypatch):
    sim, c2i, rel = case(12, 5, seed=8)
    monkeypatch.setattr(fastrank, "fast_rerank", spec3_rerank)
    out = M.evaluate(sim, c2i, rel, rerank=True)
    _check_rerank_result(out, sim, c2i, rel, (25.0, 25.0), (20.0, 20.0))
    out = M.evaluate(sim, c2i, rel, rerank={"gamma": (5.0, 10.0), "lam": (3.0, 1.0)})
    _check_rerank_result(out, sim, c2i, rel, (5.0, 10.0), (3.0, 1.0))
    assert M.evaluate(sim, c2i, rel, rerank=False) == M.evaluate(sim, c2i, rel)


def test_evaluate_rerank_with_the_real_fast_rerank():
    # The metrics of the real op's scores. (Against the formula of docs/spec.md, scores of an image
    # that dominates a column are ~0 and agree only to ~1e-14, which can reorder them and
    # move a ranking metric: the op itself is checked against the formula, to rounding,
    # in tests/test_fast_rerank.py.)
    sim, c2i, rel = case(6, 5, seed=2)
    out = M.evaluate(sim, c2i, rel, rerank=True)
    _check_rerank_result(out, sim, c2i, rel, (25.0, 25.0), (20.0, 20.0),
                         rerank_fn=lambda s, g, l: fastrank.fast_rerank(s, gamma=g, lam=l))
    assert out != M.evaluate(sim, c2i, rel)  # re-ranking changed something


def test_blocks_do_not_change_results(monkeypatch):
    sim, c2i, rel = case(9, 5, seed=30, ties=True)
    full = M.evaluate(sim, c2i, rel, cs_k=(4,))
    monkeypatch.setattr(_common, "BLOCK_ELEMS", 17)
    assert len(list(_common.blocks(9, 45))) == 9 and len(list(_common.blocks(45, 9))) == 45
    small = M.evaluate(sim, c2i, rel, cs_k=(4,))
    assert small == pytest.approx(full)
    assert small.skipped == full.skipped


def test_torch_path_matches_numpy_path(monkeypatch):
    # the pure-torch code path (what runs on a GPU) run on the CPU, ties everywhere
    sim, c2i, rel = case(9, 5, seed=31, ties=True)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(9, 45, generator=g) < 0.2
    ref = M.evaluate(sim, c2i, rel, cs_k=(3, 11))
    ref_sets = M.map_at_r(sim, mask), M.r_precision(sim, mask)
    ref_cs = M.coherent_score(sim, rel, 4)
    monkeypatch.setattr(_common, "NUMPY_ON_CPU", False)
    assert not _common.use_numpy(sim)
    out = M.evaluate(sim, c2i, rel, cs_k=(3, 11))
    assert out == pytest.approx(ref, abs=1e-12) and out.skipped == ref.skipped
    assert (M.map_at_r(sim, mask), M.r_precision(sim, mask)) == ref_sets
    assert M.coherent_score(sim, rel, 4) == pytest.approx(ref_cs, abs=1e-12)


def test_coco_sized_input_runs_in_blocks():
    # 1000 x 5000 (one COCO 1K fold): every metric, a few seconds on a CPU
    g = torch.Generator().manual_seed(0)
    sim = torch.randn(1000, 5000, generator=g)
    rel = torch.rand(1000, 5000, generator=g)
    out = M.evaluate(sim, torch.arange(5000) // 5, rel)
    assert abs(out["i2t_tau"]) < 0.01 and 0 <= out["i2t_ndcg"] <= 1
    exp = np.mean([scipy.stats.kendalltau(sim[i].numpy(), rel[i].numpy()).statistic for i in range(0, 1000, 97)])
    sub = M.kendall_tau(sim[::97].contiguous(), rel[::97].contiguous())
    assert sub["i2t"] == pytest.approx(exp, abs=1e-12)


@needs_cuda
def test_cuda_matches_cpu():
    sim, c2i, rel = case(10, 5, seed=3, ties=True)
    cpu = M.evaluate(sim, c2i, rel, cs_k=(6,))
    gpu = M.evaluate(sim.cuda(), c2i.cuda(), rel.cuda(), cs_k=(6,))
    assert gpu == pytest.approx(cpu)


# ---------------------------------------------------------------- bad input
def test_structure_is_checked_before_values():
    """Every argument's shape, dtype and device first, the values (NaN, ids' range) last."""
    sim, c2i, rel = case(4, 5, seed=0)
    nan = sim.clone()
    nan[0, 0] = float("nan")
    for fn in (M.recall_at_k, M.evaluate, M.map_at_r, M.r_precision, M.coco_5fold_1k):
        with pytest.raises(ValueError, match="caption_to_image must have shape"):
            fn(nan, c2i[:-1])
        with pytest.raises(ValueError, match="caption_to_image is on meta"):
            fn(nan, torch.zeros_like(c2i, device="meta"))
    for fn in (M.ndcg, M.kendall_tau, lambda s, r: M.coherent_score(s, r, 2),
               lambda s, r: M.evaluate(s, c2i, relevance=r)):
        with pytest.raises(ValueError, match="relevance is on meta but sim is on cpu"):
            fn(nan, torch.empty(sim.shape, device="meta"))
    with pytest.raises(ValueError, match="ks"):
        M.recall_at_k(nan, c2i, ks=())
    with pytest.raises(ValueError, match="k must be an integer"):
        M.coherent_score(nan, rel, 0)
    with pytest.raises(ValueError, match="caption_to_image values"):    # the ids' range is still checked
        M.recall_at_k(sim, torch.where(c2i == 3, 4, c2i), ks=(1,))
    # hyper-parameters: numpy and 0-d tensor integers work
    assert M.recall_at_k(sim, c2i, ks=(np.int64(1), torch.tensor(5))) == M.recall_at_k(sim, c2i, ks=(1, 5))
    assert M.coherent_score(sim, rel, np.int32(3)) == M.coherent_score(sim, rel, 3)


def test_ndcg_negative_relevance_with_the_value_check_off(monkeypatch):
    """ndcg's definition needs r >= 0: still refused with the value switch off (one pass)."""
    sim, c2i, rel = case(4, 5, seed=0)
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "0")
    with pytest.raises(ValueError, match="relevance must be >= 0 for ndcg"):
        M.ndcg(sim, rel - 0.5)


def test_bad_input():
    sim, c2i, rel = case(4, 5, seed=0)
    with pytest.raises(ValueError, match="caption_to_image"):
        M.recall_at_k(sim, c2i[:-1])                              # wrong length
    with pytest.raises(ValueError, match="caption_to_image"):
        M.recall_at_k(sim, torch.where(c2i == 3, 4, c2i))         # id out of range
    with pytest.raises(ValueError, match="caption_to_image"):
        M.recall_at_k(sim, torch.where(c2i == 3, -1, c2i))
    with pytest.raises(ValueError, match="image 3"):
        M.evaluate(sim, torch.where(c2i == 3, 0, c2i))            # image without a caption
    with pytest.raises(TypeError, match="caption_to_image"):
        M.recall_at_k(sim, c2i.float())
    bad = sim.clone()
    bad[1, 2] = float("nan")
    for fn in (lambda: M.recall_at_k(bad, c2i), lambda: M.ndcg(bad, rel), lambda: M.map_at_r(bad, c2i),
               lambda: M.evaluate(bad, c2i)):
        with pytest.raises(ValueError, match="sim contains NaN"):
            fn()
    bad_rel = rel.clone()
    bad_rel[0, 0] = float("inf")
    with pytest.raises(ValueError, match="relevance contains NaN"):
        M.kendall_tau(sim, bad_rel)
    with pytest.raises(ValueError, match="relevance must have the same shape"):
        M.ndcg(sim, rel[:, :-1])
    with pytest.raises(ValueError, match=">= 0"):
        M.ndcg(sim, rel - 0.5)
    with pytest.raises(ValueError, match="k must be an integer"):
        M.ndcg(sim, rel, k=0)
    with pytest.raises(ValueError, match="k must be an integer"):
        M.coherent_score(sim, rel, 0)
    with pytest.raises(ValueError, match="ks"):
        M.recall_at_k(sim, c2i, ks=())
    with pytest.raises(ValueError, match=r"ks\[1\]"):
        M.recall_at_k(sim, c2i, ks=(1, 0))
    with pytest.raises(TypeError, match="positives"):
        M.map_at_r(sim, rel)                                      # float matrix
    with pytest.raises(ValueError, match="positives must have the same shape"):
        M.map_at_r(sim, torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="rerank"):
        M.evaluate(sim, c2i, rerank="yes")
    with pytest.raises(ValueError, match="divisible by 5"):
        M.coco_5fold_1k(sim[:3], c2i % 3)
    with pytest.raises(ValueError, match="sim must be a 2-D"):
        M.recall_at_k(sim[0], c2i)
    with pytest.raises(TypeError, match="sim must be a torch.Tensor"):
        M.ndcg(sim.numpy(), rel)
