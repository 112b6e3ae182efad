"""fastrank.relevance.teacher_relevance: RSC relevance between query and document texts from a
frozen teacher (what the sentence-transformers losses' ``teacher=`` uses; their own test checks
it through the losses with the bundled MiniLM)."""
import subprocess
import sys

import pytest
import torch

from fastrank.relevance import check_teacher, relevance_matrix, teacher_embeddings, teacher_relevance


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


def test_does_not_import_sentence_transformers():
    code = ("import sys, torch; from fastrank.relevance import teacher_relevance\n"
            "class T:\n    def encode(self, texts): return torch.eye(len(texts))\n"
            "teacher_relevance(T(), ['a'], ['b'])\n"
            "assert 'sentence_transformers' not in sys.modules, 'eager import'")
    subprocess.run([sys.executable, "-c", code], check=True)
