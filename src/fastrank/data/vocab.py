"""Word vocabulary for the GRU text encoder."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, List, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from .. import _validation as V

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def tokenize(text: str) -> List[str]:
    """Lower-case word tokenisation: runs of letters/digits (with an optional 's, n't ...
    suffix) and single punctuation marks. ``"A dog's toy."`` -> ``["a", "dog's", "toy", "."]``."""
    return _TOKEN.findall(text.lower())


class Vocab:
    """Word <-> id table with the special tokens ``<pad>`` = 0, ``<start>`` = 1, ``<end>`` = 2,
    ``<unk>`` = 3, then the words in order of decreasing count (ties alphabetical).

    Build with :meth:`build`; :meth:`encode` turns captions into a padded LongTensor.
    """

    PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
    SPECIALS = (PAD, START, END, UNK)
    pad_id, start_id, end_id, unk_id = 0, 1, 2, 3

    def __init__(self, words: Sequence[str] = ()):
        self.itos: List[str] = list(self.SPECIALS)
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        for w in words:
            if w not in self.stoi:
                self.stoi[w] = len(self.itos)
                self.itos.append(w)

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 1) -> "Vocab":
        """Vocabulary of the words that occur at least ``min_count`` times in ``captions``
        (the training captions); rarer words map to ``<unk>``."""
        min_count = V.check_int(min_count, "min_count")
        counts = Counter(w for c in captions for w in tokenize(c))
        words = sorted((w for w, n in counts.items() if n >= min_count and w not in cls.SPECIALS),
                       key=lambda w: (-counts[w], w))
        return cls(words)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def ids(self, text: str, add_start_end: bool = True) -> List[int]:
        """One caption -> list of word ids (unknown words -> ``<unk>``)."""
        ids = [self.stoi.get(w, self.unk_id) for w in tokenize(text)]
        return [self.start_id, *ids, self.end_id] if add_start_end else ids

    def encode(self, captions: Union[str, Sequence[str]], add_start_end: bool = True) -> Tuple[Tensor, Tensor]:
        """Captions -> (tokens LongTensor (B, L_max) padded with 0, lengths LongTensor (B,)).
        With ``add_start_end`` every caption is wrapped in ``<start>`` ... ``<end>``, so even an
        empty caption has length 2."""
        if isinstance(captions, str):
            captions = [captions]
        seqs = [self.ids(c, add_start_end) for c in captions]
        if not seqs:
            raise ValueError("captions must not be empty")
        seqs = [s or [self.pad_id] for s in seqs]  # an empty sequence keeps one <pad>
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
        tokens = pad_sequence([torch.tensor(s, dtype=torch.long) for s in seqs],
                              batch_first=True, padding_value=self.pad_id)
        return tokens, lengths

    def decode(self, ids: Iterable[int]) -> str:
        """Word ids -> space-joined words, without special tokens."""
        return " ".join(self.itos[i] for i in ids if int(i) >= len(self.SPECIALS))

    def save(self, path) -> None:
        """Write the word list as JSON."""
        Path(path).write_text(json.dumps(self.itos[len(self.SPECIALS):]), encoding="utf-8")

    @classmethod
    def load(cls, path) -> "Vocab":
        """Read a vocabulary written by :meth:`save`."""
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))
