"""The pixel demo: the demo scenes rendered to small images, the ``demo_pixels`` data path, the
from-scratch CNN recipes of ``fastrank demo`` (short runs)."""
import json

import numpy as np
import pytest

from fastrank.cli import main as cli_main
from fastrank.data import DEMO_ATTRIBUTES, make_demo
from fastrank.data.pixels import render_scenes


def test_render_scenes_is_deterministic_and_draws_every_attribute():
    attrs = make_demo(n_train=6, n_test=1)["train"].attributes
    a = render_scenes(attrs, size=24, seed=3)
    assert a.shape == (6, 3, 24, 24) and a.dtype == np.float32 and a.min() >= 0 and a.max() <= 1
    np.testing.assert_array_equal(a, render_scenes(attrs, size=24, seed=3))
    assert not np.array_equal(a, render_scenes(attrs, size=24, seed=4))       # positions and noise move
    base = attrs[:1].copy()
    quiet = dict(size=24, seed=0, noise=0.0)
    ref = render_scenes(base, **quiet)
    for col, values in enumerate(DEMO_ATTRIBUTES.values()):    # changing any one attribute changes the image
        other = base.copy()
        other[0, col] = (other[0, col] + 1) % len(values)
        if col == 6 and other[0, col] == 0:
            other[0, col] = 1
        assert np.abs(render_scenes(other, **quiet) - ref).mean() > 1e-3, list(DEMO_ATTRIBUTES)[col]


def test_render_scenes_bad_input():
    with pytest.raises(ValueError, match="attributes"):
        render_scenes(np.zeros((2, 6), np.int64))
    with pytest.raises(ValueError, match="attributes"):
        render_scenes(np.zeros((2, 7)))
    with pytest.raises(ValueError, match="size"):
        render_scenes(np.zeros((2, 7), np.int64), size=4)
    with pytest.raises(ValueError, match="pixels"):
        make_demo(n_train=2, n_test=2, pixels=0)


def test_make_demo_pixels_keeps_scenes_and_captions(tmp_path):
    feats = make_demo(n_train=20, n_test=10)
    pix = make_demo(n_train=20, n_test=10, pixels=16)
    for split in ("train", "test"):
        assert pix[split].captions == feats[split].captions
        np.testing.assert_array_equal(pix[split].attributes, feats[split].attributes)
        assert pix[split].images.shape == (feats[split].images.shape[0], 3 * 16 * 16)
    from fastrank.data import PrecompDataset
    make_demo(tmp_path, n_train=20, n_test=10, pixels=16)
    assert PrecompDataset(tmp_path, "test").feature_dim == 3 * 16 * 16


def test_train_cli_on_demo_pixels(tmp_path):
    out = tmp_path / "run"
    rc = cli_main(["train", "--data", "demo_pixels", "--image-encoder", "cnn", "--out", str(out), "--epochs", "1",
                   "--loss", "triplet:1.0", "--relevance", "none", "--batch-size", "16", "--embed-dim", "16",
                   "--no-progress", "--set", "model.image_kw={widths=[4, 8]}", "--set", "model.text_kw={word_dim=8}",
                   "--set", "data.demo_n_train=48", "--set", "data.demo_n_test=20"])
    assert rc == 0
    rec = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rec and "rsum" in rec[-1]


def test_demo_quick_pixel_recipes(tmp_path):
    from fastrank.train.demo import run_demo
    logs = []
    res = run_demo(out=tmp_path / "d", quick=True, recipes=["pixel_triplet", "pixel_triplet+smooth_ndcg"],
                   progress=False, log=logs.append)
    for name in ("pixel_triplet", "pixel_triplet+smooth_ndcg"):
        assert {"rsum", "i2t_ndcg", "t2i_ndcg", "i2t_r1"} <= set(res[name])
        assert 0 < res[name]["rsum"] <= 600
    assert res["pixel_triplet"] != res["pixel_triplet+smooth_ndcg"]
    info = json.loads((tmp_path / "d" / "run_info.json").read_text())
    assert info["pixel_config"]["model"]["image_encoder"] == "cnn"
    assert info["pixel_config"]["data"]["path"] == "demo_pixels"
    assert "pixel_warmup" in info["timings_s"]
    md = (tmp_path / "d" / "results.md").read_text()
    assert "| pixel_triplet |" in md and "Pixel recipes" in md
