"""fastrank.relevance.teacher_relevance: RSC relevance between query and document texts from a
frozen teacher (what the sentence-transformers losses' ``teacher=`` uses; their own test checks
it through the losses with the bundled MiniLM), and teacher_relevance_topk, each query's k best
documents of it, in blocks of queries."""
import subprocess
import sys

import pytest
import torch
from _largest_tensor import LargestTensor

import fastrank
from fastrank.relevance import (check_teacher, relevance_matrix, teacher_embeddings, teacher_relevance,
                                teacher_relevance_topk)


class Table:
    """A stand-in teacher: a fixed (unnormalised) vector per text, and the calls it got."""

    def __init__(self, vectors):
        self.vectors, self.calls = vectors, []

    def encode(self, texts):
        self.calls.append(list(texts))
        return torch.stack([self.vectors[t] for t in texts])


VECTORS = {"a": torch.tensor([3.0, 0.0, 0.0]), "b": torch.tensor([1.0, 1.0, 0.0]),
           "c": torch.tensor([-2.0, 0.0, 0.0]), "d": torch.tensor([0.0, 0.0, 5.0])}


def test_is_rsc_of_the_teachers_embeddings():
    teacher = Table(VECTORS)
    r = teacher_relevance(teacher, ["a", "b"], ["c", "d", "b"])
    g = torch.nn.functional.normalize(torch.stack([VECTORS[t] for t in "abcdb"]), dim=1)
    expect = (1 + g[:2] @ g[2:].T) / 2
    assert r.dtype == torch.float32 and r.shape == (2, 3)
    torch.testing.assert_close(r, expect)
    assert r[0, 0] == 0.0 and r[0, 1] == 0.5 and r[1, 2] == pytest.approx(1.0)   # opposite, orthogonal, same
    assert teacher.calls == [["a", "b", "c", "d", "b"]]   # one encode call, queries first


def test_equals_relevance_matrix_off_the_ground_truth():
    """With the documents the queries' own texts, the teacher's relevance is relevance_matrix's
    batch-of-pairs relevance but for the diagonal, which relevance_matrix sets to 1."""
    texts = ["a", "b", "c", "d"]
    r = teacher_relevance(Table(VECTORS), texts, texts)
    emb = torch.stack([VECTORS[t] for t in texts])
    off = ~torch.eye(4, dtype=torch.bool)
    torch.testing.assert_close(r[off], relevance_matrix(emb, emb)[off])


def test_bad_teacher_and_texts():
    with pytest.raises(TypeError, match="teacher must be"):
        check_teacher("all-MiniLM-L6-v2")
    with pytest.raises(TypeError, match="teacher must be"):
        teacher_relevance(object(), ["a"], ["b"])
    with pytest.raises(TypeError, match=r"queries must be a list of str"):
        teacher_relevance(Table(VECTORS), "a", ["b"])
    with pytest.raises(ValueError, match="documents must not be empty"):
        teacher_relevance(Table(VECTORS), ["a"], [])

    class Flat:
        def encode(self, texts):
            return torch.ones(len(texts))
    with pytest.raises(ValueError, match=r"teacher.encode returned shape \(2,\) for 2 texts"):
        teacher_embeddings(Flat(), ["a", "b"])


def test_teacher_topk_is_the_teacher_matrix_top_k():
    g = torch.Generator().manual_seed(9)
    texts = [f"t{i}" for i in range(70)]
    teacher = Table({t: torch.randn(4, generator=g) for t in texts})
    queries, documents = texts[:23], texts[23:]
    dense = teacher_relevance(teacher, queries, documents)
    for k, block_size in ((1, None), (4, 5), (47, 1), (50, 23)):
        teacher.calls.clear()
        got = teacher_relevance_topk(teacher, queries, documents, k, block_size=block_size)
        assert teacher.calls == [queries + documents]            # encoded once, queries first
        assert got.shape == (23, 47) and got.values.dtype == torch.float32
        want = fastrank.TopKRelevance.from_dense(dense, k)
        assert torch.equal(got.indices, want.indices)
        torch.testing.assert_close(got.values, want.values, rtol=0, atol=1e-6)
    with LargestTensor() as seen:
        teacher_relevance_topk(teacher, queries, documents, 3, block_size=2)
    assert seen.numel <= max(70 * 4, 2 * 47) < 23 * 47        # the embeddings, or a block of 2 queries


def test_teacher_topk_bad_input():
    teacher = Table({"a": torch.ones(3), "b": torch.ones(3)})
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        teacher_relevance_topk(teacher, ["a"], ["b"], 0)
    with pytest.raises(TypeError, match="teacher must be"):
        teacher_relevance_topk(object(), ["a"], ["b"], 1)
    with pytest.raises(ValueError, match="documents must not be empty"):
        teacher_relevance_topk(teacher, ["a"], [], 1)
    assert teacher.calls == []


def test_does_not_import_sentence_transformers():
    code = ("import sys, torch; from fastrank.relevance import teacher_relevance\n"
            "class T:\n    def encode(self, texts): return torch.eye(len(texts))\n"
            "teacher_relevance(T(), ['a'], ['b'])\n"
            "assert 'sentence_transformers' not in sys.modules, 'eager import'")
    subprocess.run([sys.executable, "-c", code], check=True)
