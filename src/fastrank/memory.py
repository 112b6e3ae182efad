"""A cross-batch memory: a first-in first-out queue of past embeddings with their ids.

Ranking losses see more negatives (and, with ids shared across batches, more positives)
when each query is ranked against the current batch *and* the embeddings of the last few
batches, kept without gradient (XBM: Wang et al., "Cross-Batch Memory for Embedding
Learning", CVPR 2020). Smooth-AP and the Recall@k surrogate cost O(|P| * M) per query in
the candidates M (docs/spec.md §2.8, 2.9), so a memory of thousands of embeddings is affordable.

    memory = EmbeddingMemory(capacity=4096)
    for emb, ids in batches:                               # ids: class / instance ids (B,)
        sim, pos = memory.similarity(emb, ids, emb, ids)    # (B, B + len(memory)), bool like it
        loss = fastrank.smooth_ap_loss(sim, pos, direction="i2t")
        loss.backward(); opt.step(); opt.zero_grad()
        memory.enqueue(emb, ids)                            # detached copies, oldest dropped

Image-text retrieval keeps one memory per modality, ids = the image index of each item:

    sim, pos = txt_memory.similarity(img_emb, img_ids, txt_emb, cap_img_ids)   # images rank captions
    loss = fastrank.smooth_ap_loss(sim, pos, direction="i2t")
    sim, pos = img_memory.similarity(txt_emb, cap_img_ids, img_emb, img_ids)   # captions rank images
    loss = loss + fastrank.smooth_ap_loss(sim, pos, direction="i2t")
    img_memory.enqueue(img_emb, img_ids); txt_memory.enqueue(txt_emb, cap_img_ids)

The stored embeddings are detached copies: the gradient reaches the queries and the
current batch only. Their device and dtype follow the inputs (the stored ones are moved
when an input comes on another device or in another dtype).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from . import _validation as V

__all__ = ["EmbeddingMemory"]


def _check_ids(ids, n: int, device: torch.device, name: str = "ids") -> Tensor:
    return V.check_id_vector(ids, n, device, name)


class EmbeddingMemory:
    """A FIFO queue of at most ``capacity`` past embeddings (D,) and their integer ids.

    Args:
        capacity: the most embeddings kept (>= 1); the oldest are dropped first.
        dim: the embedding size, or None to take it from the first :meth:`enqueue`.

    Attributes :attr:`embeddings` (n, D) and :attr:`ids` (n,) hold the stored items,
    oldest first (n = ``len(memory)`` <= capacity).
    """

    def __init__(self, capacity: int, dim: Optional[int] = None):
        self.capacity = V.check_int(capacity, "capacity")
        self.dim = None if dim is None else V.check_int(dim, "dim")
        self._emb: Optional[Tensor] = None     # (capacity, D) ring buffer
        self._ids: Optional[Tensor] = None     # (capacity,)
        self._next = 0                         # the slot the next item goes to
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def is_full(self) -> bool:
        return self._size == self.capacity

    @property
    def embeddings(self) -> Optional[Tensor]:
        """(n, D) the stored embeddings, oldest first (None before the first enqueue)."""
        if self._emb is None:
            return None
        return self._ordered(self._emb)

    @property
    def ids(self) -> Optional[Tensor]:
        """(n,) the ids of :attr:`embeddings` (None before the first enqueue)."""
        if self._ids is None:
            return None
        return self._ordered(self._ids)

    def _ordered(self, buf: Tensor) -> Tensor:
        if self._size < self.capacity:
            return buf[: self._size]
        return torch.cat([buf[self._next:], buf[: self._next]])   # a full ring: the oldest at _next

    def clear(self) -> None:
        """Forget every stored item (the dimension, device and dtype are kept)."""
        self._next = self._size = 0

    @torch.no_grad()
    def enqueue(self, emb: Tensor, ids: Tensor) -> None:
        """Store detached copies of ``emb`` (B, D) and ``ids`` (B,) integer ids, dropping the
        oldest items beyond the capacity (B may exceed it: the last ``capacity`` are kept)."""
        V.check_tensor(emb, "emb", 2, finite=False)
        ids = _check_ids(ids, emb.shape[0], emb.device)
        if self.dim is None:
            self.dim = emb.shape[1]
        if emb.shape[1] != self.dim:
            raise ValueError(f"emb must have {self.dim} columns (the memory's dim), got {tuple(emb.shape)}")
        if self._emb is None:
            self._emb = emb.new_empty((self.capacity, self.dim))
            self._ids = ids.new_empty((self.capacity,))
        elif self._emb.device != emb.device or self._emb.dtype != emb.dtype or self._ids.dtype != ids.dtype:
            self._emb = self._emb.to(emb.device, emb.dtype)
            self._ids = self._ids.to(ids.device, ids.dtype)
        emb, ids = emb.detach()[-self.capacity:], ids[-self.capacity:]
        b = emb.shape[0]
        slots = (self._next + torch.arange(b, device=emb.device)) % self.capacity
        self._emb[slots] = emb
        self._ids[slots] = ids
        self._next = (self._next + b) % self.capacity
        self._size = min(self.capacity, self._size + b)

    def candidates(self, emb: Optional[Tensor] = None, ids: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """(embeddings, ids) of the current batch ``emb``, ``ids`` (kept differentiable)
        followed by the stored ones; either part may be absent, not both."""
        if (emb is None) != (ids is None):
            raise ValueError("pass both emb and ids of the current batch, or neither")
        parts = []
        if emb is not None:
            V.check_tensor(emb, "emb", 2, finite=False)
            parts.append((emb, _check_ids(ids, emb.shape[0], emb.device)))
        if self._size:
            stored, stored_ids = self.embeddings, self.ids
            if parts:
                stored = stored.to(parts[0][0].device, parts[0][0].dtype)
                stored_ids = stored_ids.to(parts[0][1].device)
            parts.append((stored, stored_ids))
        if not parts:
            raise ValueError("the memory is empty and no current batch was given: there is no candidate")
        if len(parts) == 1:
            return parts[0]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def similarity(self, queries: Tensor, query_ids: Tensor, emb: Optional[Tensor] = None,
                   ids: Optional[Tensor] = None,
                   sim_fn: Optional[Callable[[Tensor, Tensor], Tensor]] = None) -> Tuple[Tensor, Tensor]:
        """(sim, positives) for ranking the :meth:`candidates` (the batch ``emb``, then the
        memory) for each query: sim = ``sim_fn(queries, candidates)`` (default the dot
        product ``queries @ candidates.T``), positives[i, j] = (query_ids[i] == id of
        candidate j). Pass them to a loss with ``direction="i2t"``."""
        V.check_tensor(queries, "queries", 2, finite=False)
        query_ids = _check_ids(query_ids, queries.shape[0], queries.device, "query_ids")
        cand, cand_ids = self.candidates(emb, ids)
        if cand.shape[1] != queries.shape[1]:
            raise ValueError(f"queries have {queries.shape[1]} columns but the candidates {cand.shape[1]}")
        sim = (sim_fn or (lambda a, b: a @ b.t()))(queries, cand)
        return sim, query_ids.unsqueeze(1) == cand_ids.to(query_ids.device).unsqueeze(0)

    def state_dict(self) -> Dict:
        """The stored items (oldest first) and the settings: plain tensors and ints."""
        return {"capacity": self.capacity, "dim": self.dim,
                "embeddings": None if self._emb is None else self.embeddings.clone(),
                "ids": None if self._ids is None else self.ids.clone()}

    def load_state_dict(self, state: Dict) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"the state holds a memory of capacity {state['capacity']}, this one has "
                             f"{self.capacity}")
        self.dim, self._emb, self._ids = state["dim"], None, None
        self._next = self._size = 0
        if state["embeddings"] is not None:
            if len(state["embeddings"]) == 0:   # allocate the buffers, store nothing
                self._emb = state["embeddings"].new_empty((self.capacity, self.dim))
                self._ids = state["ids"].new_empty((self.capacity,))
            else:
                self.enqueue(state["embeddings"], state["ids"])

    def __repr__(self) -> str:
        return f"EmbeddingMemory(capacity={self.capacity}, dim={self.dim}, stored={self._size})"
