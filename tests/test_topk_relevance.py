"""fastrank.TopKRelevance (docs/spec.md §2.1b): the (N, M) matrix it stands for, its row and
column lists as the kernels read them (against a slow loop over the matrix)."""
import pytest
import torch

import fastrank
from fastrank.ops._launch import relevance_lists
from fastrank.topk import Lists


def sparse_matrix(n, m, k, seed):
    g = torch.Generator().manual_seed(seed)
    rel = torch.zeros(n, m, dtype=torch.float64)
    for i in range(n):
        cols = torch.randperm(m, generator=g)[:torch.randint(0, k + 1, (1,), generator=g).item()]
        rel[i, cols] = torch.rand(len(cols), generator=g, dtype=torch.float64) + 0.01
    return rel


def lists_as_dict(lists, rows):
    """{(row, column): value} of Lists by a plain loop over its offsets."""
    out = {}
    off, idx, val = lists.offsets.tolist(), lists.index.tolist(), lists.values.tolist()
    for q in range(rows):
        for e in range(off[q], off[q + 1]):
            if idx[e] >= 0:
                assert (q, idx[e]) not in out
                out[(q, idx[e])] = val[e]
    return out


def matrix_as_dict(rel):
    return {(i, j): v for i, row in enumerate(rel.tolist()) for j, v in enumerate(row) if v != 0}


@pytest.mark.parametrize("n,m,k", [(1, 1, 1), (5, 9, 3), (9, 5, 2), (30, 40, 6), (4, 3, 5)])
def test_from_dense_to_dense_and_lists(n, m, k):
    rel = sparse_matrix(n, m, k, seed=n * m)
    top = fastrank.TopKRelevance.from_dense(rel, k)
    assert top.shape == (n, m) and top.k == min(k, m)
    torch.testing.assert_close(top.to_dense(), rel, rtol=0, atol=0)
    lists = relevance_lists(top, "both")
    assert lists_as_dict(Lists(*lists[:3]), n) == matrix_as_dict(rel)
    assert lists_as_dict(Lists(*lists[3:]), m) == matrix_as_dict(rel.t())
    assert lists[1].data_ptr() == top.indices.data_ptr()  # the rows' lists are views of the (N, k) tensors
    cpu_form = relevance_lists(top, "both", columns=False)  # the CPU kernels make the columns' themselves
    assert all(a is b for a, b in zip(cpu_form[3:], cpu_form[:3]))
    cols = top.column_lists()
    assert cols.offsets[0] == 0 and bool((cols.offsets[1:] >= cols.offsets[:-1]).all())
    part = top.rows_of(1, min(n, 3))
    torch.testing.assert_close(part.to_dense(), rel[1:3], rtol=0, atol=0)
    rows = Lists(*lists[:3]).rows(1, min(n, 3))   # a block of rows: absolute positions, no copy
    assert lists_as_dict(rows, min(n, 3) - 1) == {(i - 1, j): v for (i, j), v in matrix_as_dict(rel).items()
                                                 if 1 <= i < 3}


def test_from_dense_keeps_the_k_largest_and_lists_zeros_as_unused():
    rel = torch.tensor([[0.1, 0.9, 0.0, 0.5], [0.0, 0.0, 0.0, 0.3]])
    top = fastrank.TopKRelevance.from_dense(rel, 2)
    assert top.indices.tolist() == [[1, 3], [3, -1]]
    torch.testing.assert_close(top.to_dense(), torch.tensor([[0.0, 0.9, 0.0, 0.5], [0.0, 0.0, 0.0, 0.3]]))
    t32 = top.to(torch.float32)
    assert t32.values.dtype == torch.float32 and t32.indices is top.indices


@pytest.mark.parametrize("loss", ["smooth_ndcg_loss", "kendall_loss"])
def test_a_column_twice_takes_the_later_entry_where_unchecked(loss, no_finite_check):
    """docs/spec.md §2.1b: where the value check is on, a column listed twice in a row is an
    error (tests/test_smooth_ndcg.py, test_bad_topk_relevance); where it is off (the CUDA
    default) the later entry counts, the earlier is ignored: the same matrix on every path
    (to_dense, the reference, the native kernels' lists in both directions)."""
    idx = torch.tensor([[0, 2, 0], [1, -1, 1], [3, 4, 2], [4, 4, 4]])
    val = torch.tensor([[0.9, 0.5, 0.2], [0.3, 0.7, 0.8], [0.1, 0.6, 0.4], [0.5, 0.3, 0.7]], dtype=torch.float64)
    top = fastrank.TopKRelevance(idx, val, 5)
    want = torch.zeros(4, 5, dtype=torch.float64)
    want[0, 0], want[0, 2], want[1, 1], want[2, 3], want[2, 4], want[2, 2], want[3, 4] = 0.2, 0.5, 0.8, 0.1, 0.6, 0.4, 0.7
    assert torch.equal(top.to_dense(), want)
    sim = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    fn = getattr(fastrank, loss)
    for direction in ("i2t", "t2i", "both"):
        ref = fn(sim, want, direction=direction, reduction="none", impl="reference")
        for impl in ("reference", "auto"):
            torch.testing.assert_close(fn(sim, top, direction=direction, reduction="none", impl=impl), ref,
                                       rtol=1e-12, atol=1e-12)
