"""fastrank.train under data parallelism: 2 gloo processes on CPU train a few steps and end
with the weights of 1 process training on the same global batches."""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

import _gloo
from fastrank.train import Trainer, load_config

W = 2
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")

# 3 steps of a global batch of 16 (8 per rank); smooth-NDCG needs the global relevance,
# soft triplet mining keeps the loss smooth (no argmax flips between the two runs)
VALUES = {
    "data.demo_n_train": 40, "data.demo_n_test": 12,
    "model.embed_dim": 16, "model.text_kw": {"word_dim": 8},
    "relevance.source": "tfidf",
    "loss.spec": "triplet:1.0,smooth_ndcg:1.0",
    "loss.options": {"triplet": {"mining": "soft", "gamma": 10.0}, "smooth_ndcg": {"tau": 0.1}},
    "train.epochs": 1, "train.batch_size": 16, "train.max_steps_per_epoch": 3,
    "train.progress": False, "train.seed": 5, "train.threads": 1, "train.checkpoint": False,
    "optim.lr": 1e-3, "optim.grad_clip": 0.0, "eval.graded": False,
}


def _config(out):
    return load_config(None, **VALUES, **{"train.out_dir": str(out)})


def _worker(rank, port, out_dir):
    torch.set_num_threads(1)
    with _gloo.group(rank, port, W):
        tr = Trainer(_config(f"{out_dir}/run"), log=lambda s: None)
        assert tr.world_size == W and tr.local_batch == 8
        hist = tr.fit()
        torch.save({"state": tr.model.state_dict(), "loss": hist[0]["loss"],
                    "grad": {n: p.grad for n, p in tr.model.named_parameters()},
                    "parts": hist[0]["loss_parts"]}, f"{out_dir}/rank{rank}.pt")


def test_two_gloo_processes_agree_with_one(tmp_path):
    _gloo.spawn(_worker, (_gloo.free_port(), str(tmp_path)), W)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(W))

    torch.set_num_threads(1)
    single = Trainer(_config(tmp_path / "single"), log=lambda s: None)
    hist = single.fit()
    ref = single.model.state_dict()

    # the ranks hold identical weights, equal to the single-process ones
    for k in ref:
        assert torch.equal(r0["state"][k], r1["state"][k]), k
        assert torch.allclose(r0["state"][k], ref[k], rtol=1e-4, atol=2e-5), \
            (k, float((r0["state"][k] - ref[k]).abs().max()))
    # the last step's gradients too (AdamW is nearly scale-invariant, so this is the check
    # that the DDP average of (local loss * W) is the single-process gradient)
    for n, p in single.model.named_parameters():
        assert torch.allclose(r0["grad"][n], p.grad, rtol=1e-4, atol=1e-6), \
            (n, float((r0["grad"][n] - p.grad).abs().max()), float(p.grad.abs().max()))
    # the weights moved (3 AdamW steps at lr 1e-3): the comparison is not vacuous
    init = Trainer(_config(tmp_path / "init"), log=lambda s: None).model.state_dict()
    assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-3
    # the logged loss is the global-batch loss, as in the single process
    assert r0["loss"] == pytest.approx(hist[0]["loss"], rel=1e-5)
    for name, v in hist[0]["loss_parts"].items():
        assert r0["parts"][name] == pytest.approx(v, rel=1e-5)
    rec = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["steps"] == 3 and "rsum" in rec


# gradient caching (chunks of 3 of each rank's 8: 3, 3, 2) and the cross-batch memory on 2 ranks
# against 1 process doing neither on the full batch (the memory only in both): Smooth-AP ranks
# the memory, smooth-NDCG does not
CACHED = {"loss.spec": "triplet:1.0,smooth_ap:1.0,smooth_ndcg:1.0", "train.memory_size": 24}


def _cached_worker(rank, port, out_dir):
    torch.set_num_threads(1)
    with _gloo.group(rank, port, W):
        cfg = load_config(None, **dict(VALUES, **CACHED, **{"train.cache_chunk": 3,
                                                            "train.out_dir": f"{out_dir}/run"}))
        tr = Trainer(cfg, log=lambda s: None)
        hist = tr.fit()
        torch.save({"state": tr.model.state_dict(), "loss": hist[0]["loss"],
                    "grad": {n: p.grad for n, p in tr.model.named_parameters()},
                    "memory": tr.memory.state_dict()}, f"{out_dir}/rank{rank}.pt")


def test_two_gloo_ranks_cached_with_memory_agree_with_one_process_full_batch(tmp_path):
    _gloo.spawn(_cached_worker, (_gloo.free_port(), str(tmp_path)), W)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(W))

    torch.set_num_threads(1)
    single = Trainer(load_config(None, **dict(VALUES, **CACHED, **{"train.out_dir": str(tmp_path / "single")})),
                     log=lambda s: None)
    hist = single.fit()
    ref = single.model.state_dict()
    for k in ref:
        assert torch.equal(r0["state"][k], r1["state"][k]), k
        torch.testing.assert_close(r0["state"][k], ref[k], rtol=1e-4, atol=2e-5, msg=k)
    for n, p in single.model.named_parameters():
        torch.testing.assert_close(r0["grad"][n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
    # the memory is the same on both ranks, and the single process's (3 batches of 16, 24 kept)
    for part in ("images", "captions"):
        assert torch.equal(r0["memory"][part]["embeddings"], r1["memory"][part]["embeddings"]), part
        assert torch.equal(r0["memory"][part]["ids"], single.memory.state_dict()[part]["ids"]), part
        torch.testing.assert_close(r0["memory"][part]["embeddings"], single.memory.state_dict()[part]["embeddings"],
                                   rtol=1e-4, atol=2e-5)
    assert len(single.memory) == 24
    assert r0["loss"] == pytest.approx(hist[0]["loss"], rel=1e-5)
