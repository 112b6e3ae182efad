"""fastrank.memory.EmbeddingMemory: FIFO order, capacity, detached copies, device/dtype,
and its use with the smooth-rank losses (checked against the loop oracle)."""
import functools

import pytest
import torch

import fastrank
from fastrank.memory import EmbeddingMemory

from _rank_oracles import oracle, smooth_ap_query


def batch(b, d=4, start=0, dtype=torch.float32):
    """Embeddings whose first column is their running number, and ids = that number."""
    emb = torch.zeros(b, d, dtype=dtype)
    emb[:, 0] = torch.arange(start, start + b, dtype=dtype)
    return emb, torch.arange(start, start + b)


def test_fifo_order_and_capacity():
    mem = EmbeddingMemory(capacity=5)
    assert len(mem) == 0 and mem.embeddings is None and mem.ids is None and not mem.is_full
    mem.enqueue(*batch(3, start=0))
    assert mem.ids.tolist() == [0, 1, 2] and mem.embeddings[:, 0].tolist() == [0, 1, 2]
    mem.enqueue(*batch(4, start=3))                          # wraps: 0 and 1 are dropped
    assert len(mem) == 5 and mem.is_full
    assert mem.ids.tolist() == [2, 3, 4, 5, 6] and mem.embeddings[:, 0].tolist() == [2, 3, 4, 5, 6]
    for start in range(7, 30, 3):                            # many wraps
        mem.enqueue(*batch(3, start=start))
        assert mem.ids.tolist() == list(range(start + 3 - 5, start + 3))
        assert torch.equal(mem.embeddings[:, 0].long(), mem.ids)
    mem.enqueue(*batch(12, start=100))                       # more than the capacity at once
    assert mem.ids.tolist() == [107, 108, 109, 110, 111]
    mem.clear()
    assert len(mem) == 0 and mem.ids.tolist() == [] and mem.embeddings.shape == (0, 4)
    mem.enqueue(*batch(2, start=50))
    assert mem.ids.tolist() == [50, 51]


def test_stored_copies_are_detached():
    emb = torch.randn(3, 4, requires_grad=True)
    mem = EmbeddingMemory(8)
    mem.enqueue(emb * 2, torch.arange(3))
    assert not mem.embeddings.requires_grad
    src = torch.randn(2, 4)
    mem.enqueue(src, torch.tensor([7, 8]))
    src.zero_()                                              # the caller reuses its buffer
    assert mem.embeddings[-2:].abs().sum() > 0


def test_device_and_dtype_follow_the_inputs():
    mem = EmbeddingMemory(4)
    mem.enqueue(*batch(2, dtype=torch.float32))
    assert mem.embeddings.dtype == torch.float32
    mem.enqueue(*batch(1, start=2, dtype=torch.float64))
    assert mem.embeddings.dtype == torch.float64 and mem.ids.tolist() == [0, 1, 2]
    assert mem.embeddings[:, 0].tolist() == [0.0, 1.0, 2.0]
    if torch.cuda.is_available():
        mem.enqueue(*(t.cuda() for t in batch(1, start=3, dtype=torch.float64)))
        assert mem.embeddings.is_cuda and mem.ids.is_cuda and mem.ids.tolist() == [0, 1, 2, 3]


def test_state_dict_round_trip():
    mem = EmbeddingMemory(5)
    mem.enqueue(*batch(7))
    again = EmbeddingMemory(5)
    again.load_state_dict(mem.state_dict())
    assert torch.equal(again.embeddings, mem.embeddings) and torch.equal(again.ids, mem.ids)
    mem.enqueue(*batch(2, start=7))
    again.enqueue(*batch(2, start=7))
    assert torch.equal(again.ids, mem.ids)
    with pytest.raises(ValueError, match="capacity"):
        EmbeddingMemory(6).load_state_dict(mem.state_dict())
    empty = EmbeddingMemory(5)
    empty.load_state_dict(EmbeddingMemory(5).state_dict())
    assert len(empty) == 0


def test_similarity_with_smooth_ap_matches_loop_oracle():
    """Queries ranked against the batch and the memory: the loss is the loss on the
    concatenated candidates, and only the batch gets a gradient."""
    g = torch.Generator().manual_seed(0)
    mem = EmbeddingMemory(capacity=10)
    old = torch.randn(13, 6, generator=g, dtype=torch.float64)
    old_ids = torch.randint(0, 4, (13,), generator=g)
    mem.enqueue(old, old_ids)
    emb = torch.randn(5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 4, (5,), generator=g)
    sim, pos = mem.similarity(emb, ids, emb, ids)
    assert sim.shape == (5, 15) and pos.shape == (5, 15)
    cand = torch.cat([emb.detach(), old[-10:]])
    cand_ids = torch.cat([ids, old_ids[-10:]])
    torch.testing.assert_close(sim.detach(), emb.detach() @ cand.t())
    assert torch.equal(pos, ids[:, None] == cand_ids[None, :])
    loss = fastrank.smooth_ap_loss(sim, pos, 0.1, "i2t")
    exp = oracle(functools.partial(smooth_ap_query, tau=0.1), sim.detach(), pos, "i2t", "mean")
    torch.testing.assert_close(loss.detach(), exp, rtol=1e-10, atol=1e-12)
    loss.backward()
    assert emb.grad.abs().sum() > 0
    # the memory alone as candidates (queries from elsewhere), and another score
    sim2, pos2 = mem.similarity(emb.detach(), ids, sim_fn=lambda a, b: -torch.cdist(a, b))
    torch.testing.assert_close(sim2, -torch.cdist(emb.detach(), old[-10:]))
    assert torch.equal(pos2, ids[:, None] == old_ids[-10:][None, :])
    fastrank.recall_at_k_loss(sim2, pos2, (1, 4), direction="i2t")   # runs on the memory's candidates


def test_similarity_on_an_empty_memory_is_the_batch():
    emb, ids = torch.randn(4, 3), torch.tensor([0, 0, 1, 1])
    sim, pos = EmbeddingMemory(8).similarity(emb, ids, emb, ids)
    torch.testing.assert_close(sim, emb @ emb.t())
    assert torch.equal(pos, ids[:, None] == ids[None, :])


@pytest.mark.parametrize("call,exc,match", [
    (lambda m: EmbeddingMemory(0), ValueError, "capacity"),
    (lambda m: EmbeddingMemory(4, dim=0), ValueError, "dim"),
    (lambda m: m.enqueue(torch.randn(2, 5), torch.arange(2)), ValueError, "columns"),
    (lambda m: m.enqueue(torch.randn(2), torch.arange(2)), ValueError, "emb"),
    (lambda m: m.enqueue(torch.randn(2, 4), torch.arange(3)), ValueError, "ids"),
    (lambda m: m.enqueue(torch.randn(2, 4), torch.zeros(2)), TypeError, "ids"),
    (lambda m: m.enqueue(torch.randn(2, 4), [0, 1]), TypeError, "ids"),
    (lambda m: m.similarity(torch.randn(2, 4), torch.arange(2), torch.randn(2, 4)), ValueError, "both"),
    (lambda m: m.similarity(torch.randn(2, 3), torch.arange(2)), ValueError, "columns"),
    (lambda m: m.similarity(torch.randn(2, 4), torch.arange(3)), ValueError, "query_ids"),
    (lambda m: EmbeddingMemory(3).similarity(torch.randn(2, 4), torch.arange(2)), ValueError, "empty"),
])
def test_bad_input(call, exc, match):
    mem = EmbeddingMemory(4)
    mem.enqueue(torch.randn(2, 4), torch.arange(2))
    with pytest.raises(exc, match=match):
        call(mem)


def test_lazy_attribute():
    assert fastrank.memory.EmbeddingMemory is EmbeddingMemory
