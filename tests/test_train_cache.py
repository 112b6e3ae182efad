"""Gradient caching (fastrank.train.grad_cache, ``train.cache_chunk``) and the cross-batch
memory (fastrank.train.cross_batch, ``train.memory_size``) against the computations they stand
for: the cached gradient of every loss term is the full-graph gradient (float64, dropout on),
the memory's value is the loss over [batch; memory], and the trainer with either on trains like
the same trainer doing it the plain way."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fastrank.distributed import LocalLoss
from fastrank.nn import CombinedLoss
from fastrank.nn.combined import LOSS_NAMES
from fastrank.train import Trainer, load_config
from fastrank.train.cross_batch import MEMORY_TERMS, CrossBatchMemory
from fastrank.train.grad_cache import cached_step, chunk_slices

B, D_IN, E, CHUNK = 12, 10, 6, 5      # chunks of 5, 5, 2: uneven on purpose


class _Towers(torch.nn.Module):
    """Two small towers with dropout (an image tower and a caption tower), float64."""

    def __init__(self, dropout=0.3):
        super().__init__()
        torch.manual_seed(0)
        self.img = torch.nn.Sequential(torch.nn.Linear(D_IN, 16), torch.nn.Tanh(), torch.nn.Dropout(dropout),
                                       torch.nn.Linear(16, E)).double()
        self.txt = torch.nn.Sequential(torch.nn.Linear(D_IN, 16), torch.nn.Dropout(dropout), torch.nn.Tanh(),
                                       torch.nn.Linear(16, E)).double()

    def forward(self, x, y):
        return F.normalize(self.img(x), dim=1), F.normalize(self.txt(y), dim=1)


def _inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, D_IN, generator=g, dtype=torch.float64)
    y = x + 0.5 * torch.randn(B, D_IN, generator=g, dtype=torch.float64)
    ids = torch.arange(B) // 2     # pairs of items share an image: 0 0 1 1 2 2 ...
    rel = torch.rand(B, B, generator=g, dtype=torch.float64)
    rel[ids[:, None] == ids[None, :]] = 1.0
    return x, y, ids, rel


def _term(name):
    opts = {"triplet": {"mining": "soft", "gamma": 10.0}}.get(name, {})
    combined = CombinedLoss(f"{name}:1.0", {name: opts} if opts else None)
    return LocalLoss(combined.losses[name])


def _loss(term, img, txt, ids, rel):
    return term(img, txt, relevance=rel if term.needs_relevance else None,
                positives=ids[:, None] == ids[None, :])


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", list(LOSS_NAMES))
def test_cached_gradient_equals_full_graph_gradient_every_term(name):
    """float64, dropout on: the cached step's parameter gradients equal those of the same
    chunked forward kept in one graph (the dropout masks replayed, not drawn again), and the
    loss and embeddings of step 1 are those of the graph forward."""
    x, y, ids, rel = _inputs()
    term = _term(name)
    model = _Towers().train()

    torch.manual_seed(7)   # the reference: the chunks embedded in order, with a graph
    outs = [model(x[sl], y[sl]) for sl in chunk_slices(B, CHUNK)]
    img, txt = torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])
    ref_loss = _loss(term, img, txt, ids, rel)
    ref_loss.backward()
    ref = _grads(model)
    model.zero_grad(set_to_none=True)

    torch.manual_seed(7)
    loss, (c_img, c_txt) = cached_step(model, (x, y), CHUNK, lambda i, t: _loss(term, i, t, ids, rel),
                                       module=model)
    got = _grads(model)
    assert torch.equal(c_img, img.detach()) and torch.equal(c_txt, txt.detach())
    assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), rel=1e-12)
    assert any(float(g.abs().max()) > 0 for g in ref.values()), "the loss sends no gradient: vacuous"
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-10, atol=1e-13, msg=n)

    # not vacuous: the masks matter (an eval-mode step gives other gradients)
    model.zero_grad(set_to_none=True)
    model.eval()
    _loss(term, *model(x, y), ids, rel).backward()
    assert not torch.allclose(model.img[0].weight.grad, ref["img.0.weight"])


@pytest.mark.parametrize("name", list(LOSS_NAMES))
def test_cached_gradient_equals_uncached_full_batch_without_dropout(name):
    """Without randomness the cached step is the plain full-batch step (one forward of all B)."""
    x, y, ids, rel = _inputs()
    term = _term(name)
    model = _Towers(dropout=0.0).train()
    _loss(term, *model(x, y), ids, rel).backward()
    ref = _grads(model)
    model.zero_grad(set_to_none=True)
    cached_step(model, (x, y), CHUNK, lambda i, t: _loss(term, i, t, ids, rel))
    for n, g in _grads(model).items():
        torch.testing.assert_close(g, ref[n], rtol=1e-10, atol=1e-13, msg=n)


def test_cached_step_bad_input():
    model = _Towers()
    x, y, ids, rel = _inputs()
    with pytest.raises(ValueError, match="chunk_size"):
        cached_step(model, (x, y), 0, lambda i, t: i.sum())
    with pytest.raises(ValueError, match="same batch size"):
        cached_step(model, (x, y[:5]), 4, lambda i, t: i.sum())
    with pytest.raises(ValueError, match="scalar"):
        cached_step(model, (x, y), 4, lambda i, t: i)
    with pytest.raises(TypeError, match="embed"):
        cached_step(lambda a, b: "no tensor", (x, y), 4, lambda i, t: i.sum())


def test_batch_norm_running_statistics_updated_once_per_chunk():
    """Step 1 leaves batch norm's running statistics alone (``module=``): after a cached step
    they equal those of the graph forward of the same chunks (one momentum update per chunk)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(D_IN, 8), torch.nn.BatchNorm1d(8)).double().train()
    ref_net = copy.deepcopy(net)
    x = _inputs()[0]
    for sl in chunk_slices(B, CHUNK):
        ref_net(x[sl])
    cached_step(net, (x,), CHUNK, lambda e: e.square().sum(), module=net)
    assert int(net[1].num_batches_tracked) == len(chunk_slices(B, CHUNK))
    torch.testing.assert_close(net[1].running_mean, ref_net[1].running_mean, rtol=0, atol=0)
    torch.testing.assert_close(net[1].running_var, ref_net[1].running_var, rtol=0, atol=0)


# ----------------------------------------------------------------------------- cross-batch memory
@pytest.mark.parametrize("name", MEMORY_TERMS)
def test_memory_term_is_the_loss_over_batch_and_memory(name):
    x, y, ids, _ = _inputs()
    term = _term(name)
    img, txt = F.normalize(x[:, :E], dim=1), F.normalize(y[:, :E], dim=1)
    mem = CrossBatchMemory(8)
    # empty: exactly the trainer's plain term
    assert torch.equal(mem.loss(term, img, txt, ids), _loss(term, img, txt, ids, None))
    g = torch.Generator().manual_seed(2)
    past_img = F.normalize(torch.randn(10, E, generator=g, dtype=torch.float64), dim=1)
    past_txt = F.normalize(torch.randn(10, E, generator=g, dtype=torch.float64), dim=1)
    past_ids = torch.tensor([0, 1, 2, 40, 41, 42, 43, 44, 5, 3])
    mem.enqueue(past_img, past_txt, past_ids)        # capacity 8: the first two are dropped
    assert len(mem) == 8
    got = mem.loss(term, img.requires_grad_(), txt, ids)
    # by hand: images rank [captions; stored captions], captions rank [images; stored images]
    cand_txt, cand_img, cand_ids = torch.cat([txt, past_txt[2:]]), torch.cat([img, past_img[2:]]), \
        torch.cat([ids, past_ids[2:]])
    mod = term.loss
    i2t, t2i = copy.copy(mod), copy.copy(mod)
    i2t.direction, t2i.direction = "i2t", "t2i"
    want = i2t(img @ cand_txt.T, positives=ids[:, None] == cand_ids[None]) + \
        t2i(cand_img @ txt.T, positives=cand_ids[:, None] == ids[None])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert not torch.allclose(got, _loss(term, img, txt, ids, None))   # the memory counts
    got.backward()
    assert img.grad is not None and float(img.grad.abs().max()) > 0


# ----------------------------------------------------------------------------- the trainer
VALUES = {
    "data.demo_n_train": 40, "data.demo_n_test": 12,
    "model.embed_dim": 16, "model.text_kw": {"word_dim": 8},
    "relevance.source": "tfidf",
    "loss.spec": "triplet:1.0,smooth_ap:1.0,smooth_ndcg:1.0",
    "loss.options": {"triplet": {"mining": "soft", "gamma": 10.0}, "smooth_ndcg": {"tau": 0.1}},
    "train.epochs": 1, "train.batch_size": 16, "train.max_steps_per_epoch": 4,
    "train.progress": False, "train.seed": 5, "train.threads": 1, "train.checkpoint": False,
    "optim.lr": 1e-3, "optim.grad_clip": 0.0, "eval.graded": False,
}


def _fit(tmp_path, name, **extra):
    cfg = load_config(None, **dict(VALUES, **{"train.out_dir": str(tmp_path / name)}, **extra))
    tr = Trainer(cfg, log=lambda s: None)
    hist = tr.fit()
    return tr, hist


def test_trainer_cached_equals_uncached(tmp_path):
    """fc_max + gru (no dropout, no batch norm): chunks of 5 of 16 train the weights the plain
    step trains, with and without the memory; the logged losses agree."""
    torch.set_num_threads(1)
    for mem in (0, 24):
        plain, hp = _fit(tmp_path, f"plain{mem}", **{"train.memory_size": mem})
        cached, hc = _fit(tmp_path, f"cached{mem}", **{"train.memory_size": mem, "train.cache_chunk": 5})
        init = Trainer(load_config(None, **dict(VALUES, **{"train.out_dir": str(tmp_path / "i")})),
                       log=lambda s: None).model.state_dict()
        ref = plain.model.state_dict()
        assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-3
        for k, v in cached.model.state_dict().items():
            torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=2e-5, msg=k)
        assert hc[0]["loss"] == pytest.approx(hp[0]["loss"], rel=1e-5)
        if mem:
            assert len(cached.memory) == 24
            torch.testing.assert_close(cached.memory.captions.embeddings, plain.memory.captions.embeddings,
                                       rtol=1e-4, atol=2e-5)


def test_trainer_memory_changes_the_loss_and_is_in_last_pt(tmp_path):
    _, plain = _fit(tmp_path, "plain")
    tr, mem = _fit(tmp_path, "mem", **{"train.memory_size": 32, "train.checkpoint": True})
    assert mem[0]["loss_parts"]["smooth_ap"] != pytest.approx(plain[0]["loss_parts"]["smooth_ap"], rel=1e-6)
    ck = torch.load(tmp_path / "mem" / "last.pt", weights_only=True)
    assert ck["memory"]["capacity"] == 32
    assert torch.equal(ck["memory"]["captions"]["embeddings"], tr.memory.captions.embeddings)
    assert torch.equal(ck["memory"]["images"]["ids"], tr.memory.images.ids)


def test_trainer_flags_are_checked(tmp_path):
    with pytest.raises(ValueError, match="train.cache_chunk"):
        load_config(None, **{"train.cache_chunk": -1})
    with pytest.raises(ValueError, match="train.memory_size"):
        load_config(None, **{"train.memory_size": -2})
    with pytest.raises(ValueError, match="train.memory_size.*needs a loss term"):
        Trainer(load_config(None, **dict(VALUES, **{"loss.spec": "smooth_ndcg:1.0", "loss.options": {}, "train.memory_size": 8,
                                                    "train.out_dir": str(tmp_path)})), log=lambda s: None)


def test_cli_flags(tmp_path):
    from fastrank.cli import main
    out = tmp_path / "cli"
    rc = main(["train", "--data", "demo", "--out", str(out), "--no-progress", "--cache-chunk", "4",
               "--memory-size", "16", "--loss", "triplet:1.0", "--relevance", "none", "--epochs", "1",
               "--batch-size", "8", "--embed-dim", "8", "--set", "model.text_kw={word_dim = 8}",
               "--set", "data.demo_n_train=20", "--set", "data.demo_n_test=8",
               "--set", "train.max_steps_per_epoch=3", "--set", "eval.graded=false"])
    assert rc == 0
    ck = torch.load(out / "last.pt", weights_only=True)
    assert ck["config"]["train"]["cache_chunk"] == 4 and ck["memory"]["capacity"] == 16
    assert len(ck["memory"]["images"]["ids"]) == 16
