"""Image-caption data from disk (Karpathy split JSON, path/caption CSV) and ``fastrank extract``:
the precomp layout it writes, resuming after an interruption (same bytes as one run), the
command line, bad input."""
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from PIL import Image  # noqa: E402


def _pil(tf, name):
    """The PIL-backend image processor class (transformers 5 names it <name>Pil; 4.x has the plain one)."""
    return getattr(tf, name + "Pil", None) or getattr(tf, name)

from fastrank.cli import main  # noqa: E402
from fastrank.data import PrecompDataset, read_caption_csv, read_image_captions, read_karpathy  # noqa: E402
from fastrank.extract import extract_features  # noqa: E402
from fastrank.models import HFVisionBackbone  # noqa: E402

N_IMAGES = 7


def _caps(i, n=5):
    return [f"Image {i} caption {c}\nwith a line break." for c in range(n)]


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    """A tiny Karpathy JSON (COCO-style filepath for some images, 6 captions for one), a CSV,
    the image files, and a tiny random ResNet backbone with its image processor."""
    root = tmp_path_factory.mktemp("disk")
    rng = np.random.default_rng(0)
    entries = []
    for i in range(N_IMAGES):
        sub = "val2014" if i % 2 else ""
        (root / "images" / sub).mkdir(parents=True, exist_ok=True)
        size = (int(rng.integers(20, 50)), int(rng.integers(20, 50)))
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(
            root / "images" / sub / f"im{i}.jpg")
        split = "test" if i < 5 else ("restval" if i == 5 else "train")
        entries.append({"filename": f"im{i}.jpg", **({"filepath": sub} if sub else {}), "split": split,
                        "sentences": [{"raw": c, "tokens": c.split()} for c in _caps(i, 6 if i == 2 else 5)]})
    (root / "karpathy.json").write_text(json.dumps({"images": entries}))
    rows = ["path,caption"] + [f'{"val2014/" if i % 2 else ""}im{i}.jpg,"{c}"' for i in range(3) for c in _caps(i, 2)]
    (root / "images" / "caps.csv").write_text("\n".join(rows) + "\n")
    tf = transformers
    tf.ResNetModel(tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 12], depths=[1, 1], layer_type="basic")
                   ).save_pretrained(root / "resnet")
    _pil(tf, "ConvNextImageProcessor")(size={"shortest_edge": 32}, crop_pct=1.0).save_pretrained(root / "resnet")
    return root


def test_read_karpathy(disk):
    items = read_karpathy(disk / "karpathy.json", disk / "images", "test")
    assert [it.path.name for it in items] == [f"im{i}.jpg" for i in range(5)]
    assert items[1].path == disk / "images" / "val2014" / "im1.jpg" and all(it.path.is_file() for it in items)
    assert all(len(it.captions) == 5 for it in items)        # the 6th caption of im2 is dropped
    assert items[0].captions[0] == "Image 0 caption 0 with a line break."
    both = read_karpathy(disk / "karpathy.json", disk / "images", "train,restval")
    assert [it.path.name for it in both] == ["im5.jpg", "im6.jpg"]
    assert read_image_captions(disk / "karpathy.json", disk / "images", ["restval"])[0].path.name == "im5.jpg"


def test_read_csv(disk):
    items = read_caption_csv(disk / "images" / "caps.csv", captions_per_image=2)
    assert [(it.path, len(it.captions)) for it in items] == [
        (disk / "images" / "im0.jpg", 2), (disk / "images" / "val2014" / "im1.jpg", 2),
        (disk / "images" / "im2.jpg", 2)]
    assert items[2].captions == ["Image 2 caption 0 with a line break.", "Image 2 caption 1 with a line break."]


def test_read_bad_input(disk, tmp_path):
    with pytest.raises(ValueError, match="unknown Karpathy split"):
        read_karpathy(disk / "karpathy.json", disk / "images", "training")
    with pytest.raises(ValueError, match="no image in split"):
        read_karpathy(disk / "karpathy.json", disk / "images", "val")
    with pytest.raises(ValueError, match="fewer than captions_per_image = 6"):
        read_karpathy(disk / "karpathy.json", disk / "images", "test", captions_per_image=6)
    with pytest.raises(ValueError, match="fewer than captions_per_image = 5"):
        read_caption_csv(disk / "images" / "caps.csv")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_karpathy(tmp_path / "none.json", disk / "images", "test")
    with pytest.raises(ValueError, match="split is required"):
        read_image_captions(disk / "karpathy.json", disk / "images")
    with pytest.raises(ValueError, match="not to a CSV"):
        read_image_captions(disk / "images" / "caps.csv", split="test")
    with pytest.raises(ValueError, match=r"\.json or"):
        read_image_captions(tmp_path / "x.txt")
    (tmp_path / "bad.json").write_text('{"pictures": []}')
    with pytest.raises(ValueError, match="not a Karpathy split file"):
        read_karpathy(tmp_path / "bad.json", disk / "images", "test")
    (tmp_path / "bad.csv").write_text("a.jpg,one,two\n")
    with pytest.raises(ValueError, match="expected 2 columns"):
        read_caption_csv(tmp_path / "bad.csv", captions_per_image=1)


def _reference(disk, items, features):
    bb = HFVisionBackbone(str(disk / "resnet")).eval()
    with torch.no_grad():
        pixels = bb.preprocess([Image.open(it.path).convert("RGB") for it in items])
        tokens, pooled = bb.features(pixels)
    return (pooled if features == "pooled" else tokens).numpy()


@pytest.mark.parametrize("features", ["pooled", "grid"])
def test_extract_writes_the_precomp_layout(disk, tmp_path, features):
    items = read_karpathy(disk / "karpathy.json", disk / "images", "test")
    path = extract_features(items, tmp_path, "test", str(disk / "resnet"), features=features, batch_size=2,
                            chunk_size=2, progress=False, log=lambda s: None)
    ds = PrecompDataset(tmp_path, "test")
    assert path == tmp_path / "test_ims.npy" and ds.n_images == 5 and ds.captions[5] == items[1].captions[0]
    expect = _reference(disk, items, features)
    assert ds.images.shape == expect.shape == ((5, 12) if features == "pooled" else (5, 16, 12))  # 4 x 4 grid
    np.testing.assert_allclose(np.asarray(ds.images), expect, rtol=1e-4, atol=1e-5)
    assert not (tmp_path / ".extract-test").exists()
    assert json.loads((tmp_path / "test_extract.json").read_text())["shape"] == list(expect.shape)


def test_extract_resumes_to_the_same_bytes(disk, tmp_path):
    items = read_karpathy(disk / "karpathy.json", disk / "images", "test")
    kw = dict(features="pooled", batch_size=2, chunk_size=2, progress=False, log=lambda s: None)
    extract_features(items, tmp_path / "one", "test", str(disk / "resnet"), **kw)
    # interrupted after one chunk, then after another, then finished
    assert extract_features(items, tmp_path / "two", "test", str(disk / "resnet"), max_chunks=1, **kw) is None
    chunks = sorted(p.name for p in (tmp_path / "two" / ".extract-test").glob("chunk_*.npy"))
    assert chunks == ["chunk_000000.npy"] and not (tmp_path / "two" / "test_ims.npy").exists()
    assert extract_features(items, tmp_path / "two", "test", str(disk / "resnet"), max_chunks=1, **kw) is None
    before = (tmp_path / "two" / ".extract-test" / "chunk_000000.npy").stat().st_mtime_ns
    assert len(list((tmp_path / "two" / ".extract-test").glob("chunk_*.npy"))) == 2
    assert (tmp_path / "two" / ".extract-test" / "chunk_000000.npy").stat().st_mtime_ns == before
    # a write killed half-way leaves only a temporary file: it is not a finished chunk
    (tmp_path / "two" / ".extract-test" / "chunk_000002.npy.tmp.npy").write_bytes(b"half a chunk")
    extract_features(items, tmp_path / "two", "test", str(disk / "resnet"), **kw)
    for f in ("test_ims.npy", "test_caps.txt"):
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes()
    # done: a rerun does nothing; other settings in the same place are refused
    logs = []
    extract_features(items, tmp_path / "two", "test", str(disk / "resnet"), **{**kw, "log": logs.append})
    assert logs and "already done" in logs[0]
    with pytest.raises(ValueError, match="different extraction"):
        extract_features(items, tmp_path / "two", "test", str(disk / "resnet"), **{**kw, "features": "grid"})
    extract_features(items, tmp_path / "three", "test", str(disk / "resnet"), max_chunks=1, **kw)
    with pytest.raises(ValueError, match="other settings.*batch_size"):
        extract_features(items, tmp_path / "three", "test", str(disk / "resnet"), **{**kw, "batch_size": 1})


def test_extract_bad_input(disk, tmp_path):
    items = read_karpathy(disk / "karpathy.json", disk / "images", "test")
    bb = str(disk / "resnet")
    with pytest.raises(ValueError, match="features"):
        extract_features(items, tmp_path, "test", bb, features="regions")
    with pytest.raises(ValueError, match="name"):
        extract_features(items, tmp_path, "../x", bb)
    with pytest.raises(ValueError, match="dtype"):
        extract_features(items, tmp_path, "test", bb, dtype="int8")
    with pytest.raises(ValueError, match="batch_size"):
        extract_features(items, tmp_path, "test", bb, batch_size=0)
    with pytest.raises(FileNotFoundError, match="1 of 5 image files are missing"):
        extract_features(items[:4] + [items[4]._replace(path=tmp_path / "gone.jpg")], tmp_path, "test", bb)
    with pytest.raises(ValueError, match="same, non-zero number of captions"):
        extract_features(items[:1] + [items[1]._replace(captions=["one"])], tmp_path, "test", bb)


def test_extract_cli(disk, tmp_path, capsys):
    args = ["extract", "--data", str(disk / "images" / "caps.csv"), "--backbone", str(disk / "resnet"),
            "--out", str(tmp_path), "--captions-per-image", "2", "--batch-size", "2", "--chunk-size", "2",
            "--no-progress", "--dtype", "float16", "--features", "grid"]
    assert main(args + ["--max-chunks", "1"]) == 3
    assert main(args) == 0
    ds = PrecompDataset(tmp_path, "train", captions_per_image=2)
    assert ds.images.dtype == np.float16 and ds.images.shape == (3, 16, 12) and ds.n_captions == 6
    assert main(["extract", "--data", str(disk / "karpathy.json"), "--images", str(disk / "images"),
                 "--split", "train,restval", "--backbone", str(disk / "resnet"), "--out", str(tmp_path),
                 "--no-progress"]) == 0
    assert PrecompDataset(tmp_path, "train+restval").n_images == 2
    assert main(["extract", "--data", str(disk / "karpathy.json"), "--images", str(disk / "images"),
                 "--backbone", str(disk / "resnet"), "--out", str(tmp_path)]) == 2
    assert "split is required" in capsys.readouterr().err
