"""fastrank.relevance's top-k relevance (docs/spec.md §4): relevance_topk and BatchRelevance.topk
give each query's k best entries of the dense relevance (relevance_matrix, BatchRelevance) as a
fastrank.TopKRelevance, the ground truth kept, ties to the lower column, computed in blocks of
queries that never hold the (n, m) matrix (teacher_relevance_topk: tests/test_relevance_teacher.py)."""
import pytest
import torch
from _largest_tensor import LargestTensor

import fastrank
import fastrank.relevance as R
from fastrank.relevance import BatchRelevance, relevance_matrix, relevance_topk


def emb(n, d=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)


def assert_same_entries(got: fastrank.TopKRelevance, want: fastrank.TopKRelevance, atol=1e-12):
    """The same columns in the same order, the same values (to the rounding of a blocked matmul)."""
    assert got.shape == want.shape and got.indices.dtype == torch.int64
    assert torch.equal(got.indices, want.indices)
    torch.testing.assert_close(got.values, want.values, rtol=0, atol=atol)


# ---------------------------------------------------------------- relevance_topk
@pytest.mark.parametrize("k", [1, 2, 5, 40, 41, 60])
@pytest.mark.parametrize("block_size", [None, 1, 7, 40])
def test_pairs_mode_is_the_dense_matrix_top_k(k, block_size):
    q, c = emb(40, seed=1), emb(40, seed=2)
    want = fastrank.TopKRelevance.from_dense(relevance_matrix(q, c), k)
    got = relevance_topk(q, c, k, block_size=block_size)
    assert_same_entries(got, want)
    assert got.k == min(k, 40) and got.values.dtype == torch.float64
    assert bool((got.indices[:, 0] == torch.arange(40)).all()) and bool((got.values[:, 0] == 1).all())
    torch.testing.assert_close(got.to_dense(), want.to_dense(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("block_size", [None, 1, 3, 12])
def test_index_mode_is_the_dense_matrix_top_k(block_size):
    e = emb(60, seed=3, dtype=torch.float32)
    idx = torch.arange(60).view(12, 5)
    dense = relevance_matrix(e, e, idx)
    for k in (5, 9, 60):
        got = relevance_topk(e, e, k, idx, block_size=block_size)
        assert_same_entries(got, fastrank.TopKRelevance.from_dense(dense, k), atol=1e-6)
        assert got.values.dtype == torch.float32
        assert torch.equal(got.indices[:, :5].sort(dim=1).values, idx) and bool((got.values[:, :5] == 1).all())


def test_ground_truth_is_kept_past_k():
    """k below the captions per image: the row is its own captions (all of them, at 1) and
    nothing else; k = 6 keeps them and the best other caption."""
    e = emb(20, seed=4)
    idx = torch.arange(20).view(4, 5)
    dense = relevance_matrix(e, e, idx)
    got = relevance_topk(e, e, 2, idx)
    assert got.k == 5 and torch.equal(got.indices.sort(dim=1).values, idx) and bool((got.values == 1).all())
    six = relevance_topk(e, e, 6, idx)
    best_other = dense.masked_fill(dense == 1, -1).max(dim=1)
    assert torch.equal(six.indices[:, 5], best_other.indices)
    torch.testing.assert_close(six.values[:, 5], best_other.values, rtol=0, atol=1e-12)
    # ragged lists (padded by repeating a caption): a caption listed once, the spare slot unused
    got = relevance_topk(e, e, 1, [[0, 1], [2], [3, 4]])
    assert got.k == 2 and got.indices.tolist() == [[0, 1], [2, -1], [3, 4]]
    assert got.values[1, 1] == 0


def test_ties_go_to_the_lower_column_and_the_ground_truth_first():
    """One-hot queries make each cosine the first coordinate of the normalised document: exact
    ties, whatever the summation order. Documents 1, 2 and 4 tie (cos 1/sqrt(2)); document 3
    ties with documents 0 at cos 1, the ground truth of row 0."""
    docs = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, -1.0]],
                        dtype=torch.float64)
    queries = torch.tensor([[1.0, 0.0, 0.0]] * 5, dtype=torch.float64)
    got = relevance_topk(queries, docs, 3)
    assert got.indices[0].tolist() == [0, 3, 1]          # the ground truth, the tie at 1, the lowest tie below
    assert got.indices[1].tolist() == [1, 0, 3]          # its own pair first, then the two 1s in column order
    assert got.indices[4].tolist() == [4, 0, 3]
    assert int((got.values == 1).sum()) == 13 and bool((got.values > 0.85).all())
    for block_size in (1, 2, 5):
        assert torch.equal(relevance_topk(queries, docs, 3, block_size=block_size).indices, got.indices)


def test_blocks_never_hold_the_matrix():
    """Every tensor made while the top k of 64 x 300 are computed in blocks of 8 rows is at most
    a block of the (rows x captions_per_image x M) product; relevance_matrix makes the (n, m)."""
    e = emb(300, seed=5, dtype=torch.float32)
    idx = torch.arange(300).view(60, 5)
    with LargestTensor() as dense:
        relevance_matrix(e[:64], e[:64])
    assert dense.numel >= 64 * 64
    with LargestTensor() as pairs:
        relevance_topk(e[:64], e[:64], 4, block_size=8)
    assert pairs.numel <= 8 * 64
    with LargestTensor() as index:
        got = relevance_topk(e, e, 8, idx, block_size=4)
    assert index.numel <= 4 * 5 * 300 < 60 * 300
    assert_same_entries(got, fastrank.TopKRelevance.from_dense(relevance_matrix(e, e, idx), 8), atol=1e-6)


def test_bad_input():
    e = emb(10)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        relevance_topk(e, e, 0)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        relevance_topk(e, e, 2, block_size=0)
    with pytest.raises(ValueError, match="same number of rows"):
        relevance_topk(e[:4], e, 2)
    with pytest.raises(ValueError, match=r"image_caption_index holds caption ids in \[1, 10\]"):
        relevance_topk(e, e, 2, torch.arange(10).view(2, 5) + 1)
    with pytest.raises(ValueError, match="query_caption_emb contains NaN"):
        relevance_topk(torch.full_like(e, float("nan")), e, 2)


# ---------------------------------------------------------------- BatchRelevance.topk
def test_batch_topk_is_the_batch_matrix_top_k():
    e = emb(30, seed=7, dtype=torch.float32)
    idx = torch.arange(30).view(6, 5)
    br = BatchRelevance(e, idx)
    img = torch.tensor([0, 3, 3, 5, 1, 2, 4, 0])
    cap = torch.tensor([2, 15, 17, 29, 9, 11, 20, 3])
    for k in (5, 8):
        got = br.topk(img, cap, k)
        assert got.shape == (8, 8) and got.k == k
        assert_same_entries(got, fastrank.TopKRelevance.from_dense(br(img, cap), k), atol=0)
    got = br.topk(img, cap, 1)                 # k = 1: the ground truth alone (two captions of image 3, of 0)
    assert got.k == 5
    assert got.indices[:, 0].tolist() == [0, 1, 1, 3, 4, 5, 6, 0]
    assert got.indices[1, :2].tolist() == [1, 2] and got.indices[0, :2].tolist() == [0, 7]
    assert int((got.indices >= 0).sum()) == 12 and bool((got.values[got.indices >= 0] == 1).all())


def test_batch_topk_pairs_mode():
    e = emb(8, seed=8)
    br = BatchRelevance(e)
    cap = torch.tensor([1, 4, 6, 7])
    assert_same_entries(br.topk(None, cap, 2), fastrank.TopKRelevance.from_dense(br(None, cap), 2), atol=0)
    got = br.topk(torch.tensor([0, 2, 0, 0]), cap, 1)   # three captions of image 0: all kept
    assert got.k == 3
    assert got.indices[0].tolist() == [0, 2, 3] and got.indices[1].tolist() == [1, -1, -1]
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        br.topk(None, cap, 0)


# ---------------------------------------------------------------- the selection itself
def test_largest_against_a_stable_sort():
    """_largest (O(b * m)) against the stable sort of TopKRelevance.from_dense, on values with
    many exact ties."""
    g = torch.Generator().manual_seed(10)
    key = torch.randint(0, 4, (50, 30), generator=g).double() / 4
    for w in (1, 3, 17, 30):
        vals, cols = R._largest(key, w)
        want_vals, want_cols = torch.sort(key, dim=1, descending=True, stable=True)
        assert torch.equal(cols, want_cols[:, :w]) and torch.equal(vals, want_vals[:, :w])


def test_columns_of_slices_the_matrix():
    rel = torch.rand(6, 10, dtype=torch.float64) * (torch.rand(6, 10) > 0.5)
    top = fastrank.TopKRelevance.from_dense(rel, 4)
    assert top.columns_of(0, 10) is top
    for a, b in ((0, 5), (5, 10), (3, 4)):
        part = top.columns_of(a, b)
        assert part.shape == (6, b - a)
        assert torch.equal(part.to_dense(), top.to_dense()[:, a:b])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_topk_equals_cpu():
    """On the embeddings' device, the same entries as on the CPU (CUDA ids with a CPU index too)."""
    e = emb(60, seed=11, dtype=torch.float32)
    idx = torch.arange(60).view(12, 5)
    want = relevance_topk(e, e, 7, idx)
    got = relevance_topk(e.cuda(), e.cuda(), 7, idx, block_size=5)
    assert got.device.type == "cuda"
    assert_same_entries(got.to("cpu"), want, atol=1e-5)
    img, cap = torch.tensor([0, 3, 3, 5]), torch.tensor([2, 15, 17, 29])
    br = BatchRelevance(e, idx)
    assert_same_entries(BatchRelevance(e, idx, device="cuda").topk(img.cuda(), cap, 5).to("cpu"),
                        br.topk(img, cap, 5), atol=1e-5)
