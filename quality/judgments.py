"""Real human graded judgments that install offline, and their disjoint train / test halves.

Both sets ship as test data inside the ``gensim`` wheel (the ``quality`` extra:
``pip install 'fastrank[quality]'``); only the data files are read, from the installed
package's folder found with ``importlib.util.find_spec`` (gensim itself is never imported,
so ``pip install --no-deps gensim`` is enough):

- **Lee** (``lee.cor``, ``similarities0-1.txt``): 50 news documents and their averaged
  human similarity ratings (Lee, Pincombe and Welsh, 2005), an upper-triangular 50 x 50
  matrix in [0, 1] (1,225 graded pairs): every document ranks all the others, a listwise
  set.
- **SimLex-999** (``simlex999.txt``): 999 word pairs with the mean human similarity score
  in [0, 10] (Hill, Reichart and Korhonen, 2015), scaled here to [0, 1]: a pairs-only set,
  a word's list holds only the words it was rated against (unrated pairs are no list
  entry, not relevance 0). The file rates one pair twice (strange / sly: 1.97 and 2.07);
  both ratings are kept, as the file has them.

A split puts each item (document, word) in one of two halves by a seeded permutation;
training sees only the pairs inside the train half, evaluation only those inside the test
half (pairs across the halves are used by neither), so no test item is ever seen in
training.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

INSTALL = "pip install 'fastrank[quality]' (or: pip install --no-deps gensim; only its data files are read)"


def missing() -> Optional[str]:
    """What the quality case lacks to run (gensim's test data, sentence-transformers), or None;
    nothing is imported."""
    try:
        data_dir()
    except FileNotFoundError as e:
        return str(e)
    if importlib.util.find_spec("sentence_transformers") is None:
        return "sentence-transformers: pip install 'fastrank[quality]'"
    return None


def data_dir() -> Path:
    """gensim's ``test/test_data`` folder, without importing gensim."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the graded judgments come with gensim's test data: {INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data"
    if not (path / "lee.cor").is_file():
        raise FileNotFoundError(f"{path} has no lee.cor (a gensim build without its test data?): {INSTALL}")
    return path


@dataclass
class Judgments:
    """Items (texts) and graded pairs (i, j, relevance in [0, 1]), i < j, each pair once."""
    name: str
    items: List[str]
    pairs: np.ndarray      # (P, 2) int item indices
    scores: np.ndarray     # (P,) float64 in [0, 1]

    def split(self, seed: int) -> Tuple[np.ndarray, np.ndarray]:
        """(train, test) item indices: disjoint halves by a permutation seeded with ``seed``."""
        perm = np.random.default_rng(seed).permutation(len(self.items))
        half = len(perm) // 2
        return np.sort(perm[:half]), np.sort(perm[half:])

    def within(self, items: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
        """The pairs (and scores) whose two items are both in ``items``."""
        inside = np.zeros(len(self.items), dtype=bool)
        inside[np.asarray(items, dtype=np.int64)] = True
        keep = inside[self.pairs[:, 0]] & inside[self.pairs[:, 1]]
        return self.pairs[keep], self.scores[keep]


def lists(pairs: np.ndarray, scores: np.ndarray) -> Dict[int, List[Tuple[int, float]]]:
    """Each item's list: the items it was rated against, with the rating (both directions)."""
    out: Dict[int, List[Tuple[int, float]]] = {}
    for (i, j), s in zip(pairs.tolist(), scores.tolist()):
        out.setdefault(i, []).append((j, s))
        out.setdefault(j, []).append((i, s))
    return out


def lee(path: Path = None) -> Judgments:
    path = path or data_dir()
    docs = [line.strip() for line in (path / "lee.cor").read_text(encoding="utf-8", errors="replace").splitlines()
            if line.strip()]
    sim = np.loadtxt(path / "similarities0-1.txt")
    if sim.shape != (len(docs), len(docs)):
        raise ValueError(f"similarities0-1.txt is {sim.shape}, lee.cor has {len(docs)} documents")
    i, j = np.triu_indices(len(docs), k=1)
    return Judgments("Lee", docs, np.stack([i, j], 1), np.clip(sim[i, j], 0.0, 1.0))


def simlex(path: Path = None) -> Judgments:
    path = path or data_dir()
    words: Dict[str, int] = {}
    pairs, scores = [], []
    for line in (path / "simlex999.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        a, b, s = line.split("\t")[:3]
        pairs.append((words.setdefault(a, len(words)), words.setdefault(b, len(words))))
        scores.append(float(s) / 10.0)
    p = np.sort(np.asarray(pairs, dtype=np.int64), axis=1)
    return Judgments("SimLex-999", list(words), p, np.clip(np.asarray(scores), 0.0, 1.0))
