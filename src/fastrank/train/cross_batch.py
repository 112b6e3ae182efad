"""Cross-batch memory for the trainer's positive-set losses (``train.memory_size``).

XBM (Wang et al., "Cross-Batch Memory for Embedding Learning", CVPR 2020): each image query
ranks the captions of the global batch *and* the last ``memory_size`` caption embeddings of past
batches, and each caption query ranks the batch's images and the last ``memory_size`` image
embeddings (two :class:`fastrank.memory.EmbeddingMemory`, ids = the image index of each item,
so a past caption of the same image is a positive). The stored embeddings carry no gradient.

Only the terms whose loss is defined by a set of positives use it: triplet, Smooth-AP and the
Recall@k surrogate (:data:`MEMORY_TERMS`); a graded term (smooth-NDCG, Kendall, ladder...)
would need the relevance of every stored caption and sees the batch only.

Data parallelism: every rank enqueues the *global* batch (its embeddings are gathered), so the
memory is the same on every rank and rank 0's copy in last.pt restores all of them. The values
follow :class:`fastrank.distributed.LocalLoss`'s convention: rank r's value covers its own
queries, the ranks' values sum to the single-process value.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor

from ..distributed import LocalLoss, all_gather_with_grad
from ..memory import EmbeddingMemory

__all__ = ["MEMORY_TERMS", "CrossBatchMemory"]

#: CombinedLoss term names that rank against the memory too
MEMORY_TERMS = ("triplet", "smooth_ap", "recall_at_k")


class CrossBatchMemory:
    """One memory of image embeddings and one of caption embeddings, ``capacity`` each."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.images = EmbeddingMemory(self.capacity)
        self.captions = EmbeddingMemory(self.capacity)

    def __len__(self) -> int:
        return len(self.images)

    def loss(self, local_loss: LocalLoss, img_local: Tensor, txt_local: Tensor, ids: Tensor,
             rank: int = 0) -> Tensor:
        """This rank's value of one term over the batch plus the memory.

        img_local / txt_local: (B, D) this rank's embeddings (the i-th image and caption are a
        pair); ids: (W * B,) the image index of every item of the *global* batch. With an empty
        memory this is exactly ``local_loss(img_local, txt_local, positives=(ids == ids.T))``."""
        if local_loss.reduction == "none":
            raise ValueError("CrossBatchMemory.loss: the term's reduction must be 'mean' or 'sum'")
        img_all = all_gather_with_grad(img_local)
        txt_all = all_gather_with_grad(txt_local)
        b = img_local.shape[0]
        local_ids = ids[rank * b:(rank + 1) * b]
        parts = []
        if local_loss.direction in ("i2t", "both"):   # images rank captions: batch, then memory
            sim, pos = self.captions.similarity(img_local, local_ids, txt_all, ids, sim_fn=local_loss.sim_fn)
            parts.append((local_loss._per_query(sim, None, pos, "i2t"), img_all.shape[0]))
        if local_loss.direction in ("t2i", "both"):   # captions rank images: columns of (N + K, B)
            sim, pos = self.images.similarity(txt_local, local_ids, img_all, ids,
                                              sim_fn=lambda q, c: (local_loss.sim_fn or _dot)(c, q).t())
            parts.append((local_loss._per_query(sim.t(), None, pos.t(), "t2i"), txt_all.shape[0]))
        if local_loss.reduction == "sum":
            return sum(q.sum() for q, _ in parts)
        return sum(q.sum() / total for q, total in parts)

    @torch.no_grad()
    def enqueue(self, img_local: Tensor, txt_local: Tensor, ids: Tensor) -> None:
        """Store the global batch (gathered from every rank): the same memory on every rank."""
        self.images.enqueue(all_gather_with_grad(img_local.detach()), ids)
        self.captions.enqueue(all_gather_with_grad(txt_local.detach()), ids)

    def state_dict(self) -> Dict:
        return {"capacity": self.capacity, "images": self.images.state_dict(),
                "captions": self.captions.state_dict()}

    def load_state_dict(self, state: Optional[Dict]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"the checkpoint's memory holds {state['capacity']} embeddings per modality, "
                             f"train.memory_size is {self.capacity}")
        self.images.load_state_dict(state["images"])
        self.captions.load_state_dict(state["captions"])


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return a @ b.t()
