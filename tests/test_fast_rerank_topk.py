"""fast_rerank_topk (docs/spec.md §3): blocked top-k of the fast re-ranking scores from embeddings,
against fast_rerank on the full matrix + torch.topk, and against a loop oracle; its case of the
CUDA test matrix."""
import math

import pytest
import torch

import _cuda_checks
import fastrank
from _cuda_matrix import each_schedule
from fastrank.ops.fast_rerank_topk import RerankTopK

CUDA = fastrank.backends()["cuda_available"]
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
IMPLS = ["native", "reference"] if fastrank.backends()["cpu"] else ["reference"]


def _emb(n, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1).to(dtype)


def _full_topk(img, txt, k, gamma=(25.0, 25.0), lam=(20.0, 20.0)):
    """fast_rerank on the whole matrix, then torch.topk per query (float64 truth)."""
    sim = img.double() @ txt.double().t()
    i2t, t2i = fastrank.fast_rerank(sim, gamma, lam, impl="reference")
    vi, ii = i2t.topk(min(k, sim.shape[1]), dim=1)
    vt, it = t2i.t().topk(min(k, sim.shape[0]), dim=1)
    return vi, ii, vt, it


def _assert_topk_equal(val, idx, ref_val, ref_idx, tol):
    """Scores equal within tol; indices equal wherever the score is not within tol of a
    neighbour in the ranking (elsewhere ties may order either way)."""
    torch.testing.assert_close(val.double(), ref_val, rtol=0, atol=tol)
    gaps = ref_val[:, :-1] - ref_val[:, 1:]
    clear = torch.ones_like(ref_val, dtype=torch.bool)
    clear[:, :-1] &= gaps > 4 * tol
    clear[:, 1:] &= gaps > 4 * tol
    assert clear.float().mean() > 0.5  # the comparison is not vacuous
    assert torch.equal(idx[clear], ref_idx[clear])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("block", [None, 1, 7, 64, 10_000])
def test_matches_full_matrix(impl, block):
    img, txt = _emb(53, 16, 1), _emb(97, 16, 2)
    r = fastrank.fast_rerank_topk(img, txt, 5, block=block, impl=impl)
    assert isinstance(r, RerankTopK)
    vi, ii, vt, it = _full_topk(img, txt, 5)
    assert r.i2t_indices.shape == (53, 5) and r.t2i_indices.shape == (97, 5)
    assert r.i2t_indices.dtype == torch.int64 and r.i2t_scores.dtype == torch.float32
    _assert_topk_equal(r.i2t_scores, r.i2t_indices, vi, ii, 2e-4)
    _assert_topk_equal(r.t2i_scores, r.t2i_indices, vt, it, 2e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_float64_hyper_parameters_and_loop_oracle(impl):
    img, txt = _emb(6, 4, 3, torch.float64), _emb(9, 4, 4, torch.float64)
    gamma, lam = (3.0, 5.0), (2.0, 7.0)
    r = fastrank.fast_rerank_topk(img, txt, 3, gamma, lam, block=2, impl=impl)
    s = (img @ txt.t()).tolist()
    n, m = 6, 9

    def lse(v):
        mx = max(v)
        return mx + math.log(sum(math.exp(x - mx) for x in v))

    col = [lse([gamma[0] * s[l][j] for l in range(n)]) for j in range(m)]
    row = [lse([lam[0] * s[i][l] for l in range(m)]) for i in range(n)]
    for i in range(n):
        sc = sorted(((gamma[1] * s[i][j] - col[j], j) for j in range(m)), reverse=True)[:3]
        assert r.i2t_indices[i].tolist() == [j for _, j in sc]
        torch.testing.assert_close(r.i2t_scores[i], torch.tensor([v for v, _ in sc], dtype=torch.float64))
    for j in range(m):
        sc = sorted(((lam[1] * s[i][j] - row[i], i) for i in range(n)), reverse=True)[:3]
        assert r.t2i_indices[j].tolist() == [i for _, i in sc]
        torch.testing.assert_close(r.t2i_scores[j], torch.tensor([v for v, _ in sc], dtype=torch.float64))


@pytest.mark.parametrize("impl", IMPLS)
def test_ties_compare_scores(impl):
    img = _emb(20, 8, 5)
    txt = _emb(10, 8, 6).repeat(3, 1)  # every text three times: tied scores
    r = fastrank.fast_rerank_topk(img, txt, 6, block=3, impl=impl)
    vi, _, vt, it = _full_topk(img, txt, 6)
    torch.testing.assert_close(r.i2t_scores.double(), vi, rtol=0, atol=2e-4)
    torch.testing.assert_close(r.t2i_scores.double(), vt, rtol=0, atol=2e-4)
    # the three copies of a text have the same t2i ranking
    assert torch.equal(r.t2i_indices[:10], r.t2i_indices[10:20])
    # tied i2t entries are copies of one text
    assert torch.equal(r.i2t_indices[:, 0::3] % 10, r.i2t_indices[:, 1::3] % 10)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("direction", ["i2t", "t2i", "both"])
def test_direction_and_k_capped(impl, direction):
    img, txt = _emb(4, 8, 7), _emb(11, 8, 8)
    r = fastrank.fast_rerank_topk(img, txt, 50, direction=direction, impl=impl)
    vi, ii, vt, it = _full_topk(img, txt, 50)
    if direction == "t2i":
        assert r.i2t_indices is None and r.i2t_scores is None
    else:
        assert r.i2t_indices.shape == (4, 11)  # k capped at M
        torch.testing.assert_close(r.i2t_scores.double(), vi, rtol=0, atol=2e-4)
        assert sorted(r.i2t_indices[0].tolist()) == list(range(11))
    if direction == "i2t":
        assert r.t2i_indices is None and r.t2i_scores is None
    else:
        assert r.t2i_indices.shape == (11, 4)  # k capped at N
        torch.testing.assert_close(r.t2i_scores.double(), vt, rtol=0, atol=2e-4)


def test_single_image_and_single_text():
    img, txt = _emb(1, 8, 9), _emb(1, 8, 10)
    r = fastrank.fast_rerank_topk(img, txt, 3)
    assert r.i2t_indices.tolist() == [[0]] and r.t2i_indices.tolist() == [[0]]
    # one image: column normalisation leaves (g2 - g1) * s; one text: (l2 - l1) * s
    s = float(img[0] @ txt[0])
    assert r.i2t_scores.item() == pytest.approx(0.0 * s, abs=1e-5)
    r = fastrank.fast_rerank_topk(img, txt, 1, gamma=(2.0, 5.0), lam=(1.0, 4.0))
    assert r.i2t_scores.item() == pytest.approx(3.0 * s, abs=1e-5)
    assert r.t2i_scores.item() == pytest.approx(3.0 * s, abs=1e-5)


def test_half_embeddings():
    img, txt = _emb(30, 16, 11), _emb(40, 16, 12)
    r = fastrank.fast_rerank_topk(img.half(), txt.half(), 4)
    assert r.i2t_scores.dtype == torch.float16 and r.i2t_indices.dtype == torch.int64
    vi, _, vt, _ = _full_topk(img.half().float(), txt.half().float(), 4)
    torch.testing.assert_close(r.i2t_scores.double(), vi, rtol=1e-2, atol=5e-2)


def test_deterministic():
    img, txt = _emb(300, 32, 13), _emb(900, 32, 14)
    a = fastrank.fast_rerank_topk(img, txt, 10, block=37)
    b = fastrank.fast_rerank_topk(img, txt, 10, block=37)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


BAD = [
    (lambda i, t: (i[0], t), {}, ValueError, "img_emb"),
    (lambda i, t: (i, t[:, :3]), {}, ValueError, "txt_emb"),
    (lambda i, t: (i, t.double()), {}, TypeError, "txt_emb"),
    (lambda i, t: (i.long(), t), {}, TypeError, "img_emb"),
    (lambda i, t: (i[:0], t), {}, ValueError, "img_emb"),
    (lambda i, t: (i, t.unsqueeze(0)), {}, ValueError, "txt_emb"),
    (lambda i, t: (i.clone().fill_(float("nan")), t), {}, ValueError, "img_emb"),
    (lambda i, t: (i, t), {"k": 0}, ValueError, "k"),
    (lambda i, t: (i, t), {"k": 2.5}, ValueError, "k"),
    (lambda i, t: (i, t), {"block": 0}, ValueError, "block"),
    (lambda i, t: (i, t), {"direction": "up"}, ValueError, "direction"),
    (lambda i, t: (i, t), {"gamma": (1.0, 0.0)}, ValueError, "gamma"),
    (lambda i, t: (i, t), {"lam": (-1.0, 1.0)}, ValueError, "lam"),
    (lambda i, t: (i, t), {"impl": "x"}, ValueError, "impl"),
    # finite embeddings whose products overflow: named as the product the user's arguments make
    (lambda i, t: (i * 1e30, t * 1e30), {}, ValueError, r"^img_emb @ txt_emb\.T contains NaN or infinite values"),
]


@pytest.mark.parametrize("make,kwargs,err,name", BAD)
def test_bad_input(make, kwargs, err, name):
    img, txt = make(_emb(5, 8, 15), _emb(7, 8, 16))
    kwargs = dict(kwargs)
    k = kwargs.pop("k", 3)
    with pytest.raises(err, match=name):
        fastrank.fast_rerank_topk(img, txt, k, **kwargs)


def test_structure_before_values():
    """A NaN embedding is reported under its own name, after every structure and
    hyper-parameter check."""
    img, txt = _emb(5, 8, 15), _emb(7, 8, 16)
    img[2, 3] = float("nan")
    with pytest.raises(TypeError, match="txt_emb must have img_emb's dtype"):
        fastrank.fast_rerank_topk(img, txt.double(), 3)
    with pytest.raises(ValueError, match="txt_emb is on meta"):
        fastrank.fast_rerank_topk(img, torch.empty(7, 8, device="meta"), 3)
    with pytest.raises(ValueError, match="k must be an integer"):
        fastrank.fast_rerank_topk(img, txt, 0)
    with pytest.raises(ValueError, match="^img_emb contains NaN"):
        fastrank.fast_rerank_topk(img, txt, 3)
    with pytest.raises(ValueError, match="^txt_emb contains NaN"):
        fastrank.fast_rerank_topk(txt[:5], img, 3)



@needs_cuda
def test_cuda_matches_cpu():
    img, txt = _emb(333, 32, 17), _emb(1200, 32, 18)
    r = fastrank.fast_rerank_topk(img.cuda(), txt.cuda(), 7, block=100)
    vi, ii, vt, it = _full_topk(img, txt, 7)
    _assert_topk_equal(r.i2t_scores.cpu(), r.i2t_indices.cpu(), vi, ii, 5e-4)
    _assert_topk_equal(r.t2i_scores.cpu(), r.t2i_indices.cpu(), vt, it, 5e-4)
    with pytest.raises(ValueError, match="txt_emb"):
        fastrank.fast_rerank_topk(img.cuda(), txt, 3)


@needs_cuda
def test_cuda_default_path_has_no_host_sync(monkeypatch):
    """docs/spec.md §1 on CUDA: no finiteness check by default, so no device-to-host copy (the
    O(N + M) statistics are not read), and a NaN embedding comes back as NaN scores."""
    monkeypatch.delenv("FASTRANK_CHECK_FINITE", raising=False)
    img, txt = _emb(300, 32, 19).cuda(), _emb(700, 32, 20).cuda()
    fastrank.fast_rerank_topk(img, txt, 5, block=64)     # warm up
    _, copies = _cuda_checks.call_activity(lambda: fastrank.fast_rerank_topk(img, txt, 5, block=64))
    assert copies == [], copies
    bad = img.clone()
    bad[3, 0] = float("nan")
    r = fastrank.fast_rerank_topk(bad, txt, 5, block=64)
    assert not torch.isfinite(r.i2t_scores).all() and not torch.isfinite(r.t2i_scores).all()
    monkeypatch.setenv("FASTRANK_CHECK_FINITE", "1")    # the debugging switch raises on CUDA too
    with pytest.raises(ValueError, match="img_emb"):
        fastrank.fast_rerank_topk(bad, txt, 5, block=64)


# ---- CUDA test matrix (marked cuda_matrix) -------------------------------------------------------
# fast_rerank_topk's statistics kernel (fast_rerank_lse) against the reference,
# with the checks of tests/_cuda_matrix.py: on a GPU, or emulated on the CPU by
# tests/test_emulated.py; deselected where neither can run (tests/conftest.py).
@pytest.mark.cuda_matrix
def test_topk_statistics_path(device):
    """fast_rerank_topk's statistics kernel (fast_rerank_lse) in tiles of rows."""
    g = torch.Generator().manual_seed(8)
    img = torch.nn.functional.normalize(torch.randn(37, 16, generator=g, dtype=torch.float64), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(53, 16, generator=g, dtype=torch.float64), dim=1)
    got = each_schedule(lambda: tuple(fastrank.fast_rerank_topk(img.to(device), txt.to(device), 5, block=10,
                                                                impl="native")))
    want = fastrank.fast_rerank_topk(img, txt, 5, block=10, impl="reference")
    for a, b in zip(got, want):
        if a.is_floating_point():
            torch.testing.assert_close(a.cpu(), b, rtol=1e-9, atol=1e-9)
        else:
            assert torch.equal(a.cpu(), b)
