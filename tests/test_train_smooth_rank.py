"""The trainer with the smooth-rank losses of binary relevance (smooth_ap, recall_at_k):
``--loss`` accepts them, they need no relevance source, and a step's loss is the
CombinedLoss of the batch with the positives the trainer builds (pairs sharing an image)."""
import math

import pytest
import torch

import fastrank
from fastrank.cli import main as cli_main
from fastrank.nn import CombinedLoss
from fastrank.train import Trainer, load_config

TINY = {
    "data.demo_n_train": 48, "data.demo_n_test": 20,
    "model.embed_dim": 16, "model.text_kw": {"word_dim": 8},
    "relevance.source": "none", "eval.graded": False,
    "train.batch_size": 16, "train.progress": False, "train.seed": 3, "train.epochs": 1,
    "train.max_steps_per_epoch": 2, "train.checkpoint": False,
    "optim.lr": 1e-3, "optim.lr_milestones": [1],
}


@pytest.mark.parametrize("spec,options", [
    ("smooth_ap:1.0", {"smooth_ap": {"tau": 0.05}}),
    ("recall_at_k:1.0,triplet:0.5", {"recall_at_k": {"ks": [1, 2, 4], "tau_k": [1.0, 2.0, 4.0]}}),
])
def test_trains_two_steps(tmp_path, spec, options):
    cfg = load_config(None, **TINY, **{"train.out_dir": str(tmp_path), "loss.spec": spec, "loss.options": options})
    tr = Trainer(cfg, log=lambda s: None)
    assert tr.train_rel is None                       # binary relevance: no relevance source needed
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    rec = tr.fit()[0]
    names = [n.split(":")[0] for n in spec.split(",")]
    assert rec["steps"] == 2 and set(rec["loss_parts"]) == set(names)
    assert math.isfinite(rec["loss"]) and all(0 < v < 2 for v in rec["loss_parts"].values())
    assert any(not torch.equal(v, before[k]) for k, v in tr.model.state_dict().items())
    assert "rsum" in rec


def test_step_loss_is_combined_loss_with_batch_positives(tmp_path):
    spec = "smooth_ap:1.0,recall_at_k:0.5"
    cfg = load_config(None, **TINY, **{"train.out_dir": str(tmp_path), "loss.spec": spec})
    tr = Trainer(cfg, log=lambda s: None)
    g = torch.tensor([0, 1, 5, 6, 7, 12, 13, 20])        # captions 0,1 share image 0; 5,6,7 image 1
    img_index = tr.train_ds.caption_to_image[g]
    batch = fastrank.data.collate([tr.train_ds[int(i)] for i in g], tr.vocab)
    out = tr.model(batch.images, batch.captions, batch.image_lengths, batch.caption_lengths)
    pos = img_index[:, None] == img_index[None, :]
    total = sum(w * l(out.img_emb, out.txt_emb, positives=pos) for l, w in tr.loss_fn.values())
    want, _ = CombinedLoss(spec)(out.sim, positives=pos)
    assert torch.allclose(total, want, atol=1e-6)
    wrong, _ = CombinedLoss(spec)(out.sim)                # diagonal positives: a different loss
    assert not torch.allclose(total, wrong, atol=1e-6)


def test_cli_loss_flag(tmp_path, capsys):
    sets = ["train.batch_size=16", "model.embed_dim=16", "data.demo_n_train=48", "data.demo_n_test=20",
            "model.text_kw.word_dim=8", "train.max_steps_per_epoch=2", "train.progress=false", "eval.graded=false"]
    rc = cli_main(["train", "--data", "demo", "--loss", "smooth_ap:1.0", "--relevance", "none", "--epochs", "1",
                   "--out", str(tmp_path)] + [a for s in sets for a in ("--set", s)])
    assert rc == 0
    assert "smooth_ap" in capsys.readouterr().out
    assert (tmp_path / "best.pt").is_file()


def test_cli_help_names_every_loss(capsys):
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "smooth_ap" in text and "recall_at_k" in text
