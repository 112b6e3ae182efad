"""fastrank.data: precomp layout and its errors, the demo dataset, the vocabulary, collate."""
import pickle
from itertools import combinations

import numpy as np
import pytest
import torch

from fastrank.data import (DEMO_ATTRIBUTES, Batch, PrecompCollate, PrecompDataset, Vocab, collate,
                           make_demo, tokenize)

SMALL = dict(n_train=60, n_test=40)
STOP = {"a", "an", "the", "of", "in", "on", "is", "are", "there", "one", ".", ",", "with", "at", "by",
        "photo", "picture", "image", "during", "under", "next", "to", "near", "along", "dressed",
        "wearing", "after", "pair", "group", "several", "many", "two", "three", "day"}


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory):
    return make_demo(tmp_path_factory.mktemp("demo"), seed=0, **SMALL)


@pytest.fixture(scope="module")
def demo_full():
    return make_demo()                               # default sizes, in memory (its time: pytest --durations)


def write(root, split, ims, caps):
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / f"{split}_ims.npy", ims)
    (root / f"{split}_caps.txt").write_text("\n".join(caps) + "\n")


# ---------------------------------------------------------------- demo

def test_demo_default_sizes(demo_full):
    d = demo_full
    assert set(d) == {"train", "test"}
    tr, te = d["train"], d["test"]
    assert tr.images.shape == (3000, 12, 128) and te.images.shape == (1000, 12, 128)
    assert tr.images.dtype == np.float32 and np.isfinite(tr.images).all()
    assert len(tr.captions) == 5 * 3000 and len(te.captions) == 5 * 1000
    assert tr.attributes.shape == (3000, len(DEMO_ATTRIBUTES))
    for j, values in enumerate(DEMO_ATTRIBUTES.values()):
        assert tr.attributes[:, j].min() >= 0 and tr.attributes[:, j].max() == len(values) - 1
    assert len(set(tr.captions)) > 0.9 * len(tr.captions)      # varied wording


def test_demo_files_are_byte_identical_for_a_seed(tmp_path):
    a = make_demo(tmp_path / "a", seed=3, **SMALL)
    b = make_demo(tmp_path / "b", seed=3, **SMALL)
    c = make_demo(tmp_path / "c", seed=4, **SMALL)
    names = ["train_ims.npy", "train_caps.txt", "test_ims.npy", "test_caps.txt"]
    assert sorted(p.name for p in a.iterdir()) == sorted(names)
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
        assert (a / name).read_bytes() != (c / name).read_bytes(), name


def test_demo_files_match_memory_and_test_split_is_independent_of_n_train(tmp_path):
    root = make_demo(tmp_path, seed=1, **SMALL)
    mem = make_demo(seed=1, **SMALL)
    for split in ("train", "test"):
        ds = PrecompDataset(root, split)
        np.testing.assert_array_equal(np.asarray(ds.images), mem[split].images)
        assert ds.captions == mem[split].captions
    other = make_demo(seed=1, n_train=25, n_test=SMALL["n_test"])["test"]
    np.testing.assert_array_equal(other.images, mem["test"].images)
    assert other.captions == mem["test"].captions


def test_demo_bad_arguments():
    with pytest.raises(ValueError, match="seed"):
        make_demo(seed=-1)
    with pytest.raises(ValueError, match="n_train"):
        make_demo(n_train=0)
    with pytest.raises(ValueError, match="noise"):
        make_demo(noise=-1.0)


def words(captions):
    return {w for c in captions for w in tokenize(c)} - STOP


def test_related_scenes_share_words(demo_full):
    d = demo_full
    te = d["test"]
    attrs, n = te.attributes, 300
    bags = [words(te.captions[5 * i:5 * i + 5]) for i in range(n)]
    by_shared = {}
    for i, j in combinations(range(n), 2):
        shared = int((attrs[i] == attrs[j]).sum())
        jac = len(bags[i] & bags[j]) / len(bags[i] | bags[j])
        by_shared.setdefault(min(shared, 4), []).append(jac)
    means = [np.mean(by_shared[k]) for k in sorted(by_shared)]
    assert all(a < b for a, b in zip(means, means[1:])), means    # more shared attributes, more shared words
    assert means[-1] > 2 * means[0]
    # every caption names its scene's object; scenes with another object rarely use that word
    obj = DEMO_ATTRIBUTES["object"]
    dog, cat = obj.index("dog"), obj.index("cat")
    dog_caps = [c for i in range(n) if attrs[i, 0] == dog for c in te.captions[5 * i:5 * i + 5]]
    cat_caps = [c for i in range(n) if attrs[i, 0] == cat for c in te.captions[5 * i:5 * i + 5]]
    assert dog_caps and cat_caps
    assert all({"dog", "dogs", "puppy", "puppies", "pup", "pups"} & set(tokenize(c)) for c in dog_caps)
    assert not any({"dog", "dogs", "puppy", "puppies"} & set(tokenize(c)) for c in cat_caps)


def test_related_scenes_have_related_features(demo_full):
    d = demo_full
    tr = d["train"]
    x = tr.images[:400].mean(1)
    x = x - x.mean(0)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cos = x @ x.T
    shared = (tr.attributes[:400, None] == tr.attributes[None, :400]).sum(-1)
    off = ~np.eye(400, dtype=bool)
    low, high = cos[off & (shared <= 1)].mean(), cos[off & (shared >= 4)].mean()
    assert high > low + 0.1, (low, high)


# ---------------------------------------------------------------- PrecompDataset

def test_precomp_dataset_reads_the_layout(demo_root):
    ds = PrecompDataset(demo_root, "train")
    n = SMALL["n_train"]
    assert len(ds) == ds.n_captions == 5 * n and ds.n_images == n
    assert ds.n_regions == 12 and ds.feature_dim == 128 and ds.captions_per_image == 5
    assert isinstance(ds.images, np.memmap)
    assert torch.equal(ds.caption_to_image, torch.arange(5 * n) // 5)
    assert ds.image_captions.shape == (n, 5) and ds.image_captions[3].tolist() == [15, 16, 17, 18, 19]
    feat, cap, img, idx = ds[17]
    assert feat.dtype == torch.float32 and feat.shape == (12, 128)
    np.testing.assert_array_equal(feat.numpy(), np.asarray(ds.images[3]))
    assert cap == ds.captions[17] and isinstance(cap, str) and (img, idx) == (3, 17)
    assert ds[-1][2:] == (n - 1, 5 * n - 1)
    with pytest.raises(IndexError):
        ds[5 * n]
    assert "train" in repr(ds)


def test_precomp_global_features_and_other_caption_counts(tmp_path):
    write(tmp_path, "dev", np.ones((3, 7), np.float32), [f"caption {i}" for i in range(6)])
    ds = PrecompDataset(tmp_path, "dev", captions_per_image=2)
    assert ds.n_regions is None and ds.feature_dim == 7 and len(ds) == 6
    feat, cap, img, idx = ds[5]
    assert feat.shape == (7,) and (cap, img, idx) == ("caption 5", 2, 5)
    batch = collate([ds[0], ds[3]])
    assert batch.images.shape == (2, 7) and batch.image_lengths is None


def test_from_arrays_equals_files(demo_root):
    files = PrecompDataset(demo_root, "test")
    mem = PrecompDataset.from_arrays(np.asarray(files.images), files.captions)
    assert len(mem) == len(files)
    for i in (0, 7, len(files) - 1):
        a, b = files[i], mem[i]
        assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


LAYOUT_WORDS = "expected layout.*_ims.npy.*_caps.txt"


def test_missing_directory_or_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*" + LAYOUT_WORDS):
        PrecompDataset(tmp_path / "nowhere", "train")
    np.save(tmp_path / "train_ims.npy", np.zeros((2, 3, 4), np.float32))
    with pytest.raises(FileNotFoundError, match="train_caps.txt.*" + LAYOUT_WORDS):
        PrecompDataset(tmp_path, "train")
    (tmp_path / "val_caps.txt").write_text("a\n" * 10)
    with pytest.raises(FileNotFoundError, match="val_ims.npy.*" + LAYOUT_WORDS):
        PrecompDataset(tmp_path, "val")


@pytest.mark.parametrize("ims, caps, message", [
    (np.zeros((2, 3, 4, 5), np.float32), ["c"] * 10, "shape"),       # 4-D features
    (np.zeros((6,), np.float32), ["c"] * 30, "shape"),                # 1-D features
    (np.zeros((0, 4), np.float32), [], "shape"),                      # no images
    (np.zeros((2, 4), np.float32), ["c"] * 9, "9 captions for 2 images.*5 x 2 = 10"),
    (np.zeros((2, 4), np.float32), ["c"] * 11, "11 captions"),
    (np.zeros((2, 4), np.float32), ["c"] * 4 + [""] + ["c"] * 5, "line 5 is empty"),
    (np.array([["x"] * 4] * 2), ["c"] * 10, "dtype"),
])
def test_malformed_layout_gives_one_value_error(tmp_path, ims, caps, message):
    write(tmp_path, "train", ims, caps)
    with pytest.raises(ValueError, match=message + ".*" + LAYOUT_WORDS):
        PrecompDataset(tmp_path, "train")


def test_not_a_npy_file(tmp_path):
    (tmp_path / "train_ims.npy").write_bytes(b"not numpy at all")
    (tmp_path / "train_caps.txt").write_text("c\n" * 5)
    with pytest.raises(ValueError, match="could not be read.*" + LAYOUT_WORDS):
        PrecompDataset(tmp_path, "train")


def test_trailing_blank_lines_are_ignored(tmp_path):
    write(tmp_path, "train", np.zeros((1, 4), np.float32), [" a dog ", "b", "c", "d", "e", "", ""])
    ds = PrecompDataset(tmp_path, "train")
    assert len(ds) == 5 and ds.captions[0] == "a dog"


# ---------------------------------------------------------------- vocab

def test_tokenize():
    assert tokenize("A Dog's toy, on the MAT!") == ["a", "dog's", "toy", ",", "on", "the", "mat", "!"]
    assert tokenize("  two  cats ") == ["two", "cats"]


def test_vocab_build_encode_decode(tmp_path):
    caps = ["A dog runs.", "a dog sits", "The cat runs!", "zebra"]
    v = Vocab.build(caps, min_count=2)
    assert v.itos[:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert (v.pad_id, v.start_id, v.end_id, v.unk_id) == (0, 1, 2, 3)
    assert v.itos[4:] == ["a", "dog", "runs"]                    # count >= 2, by count then word
    assert "zebra" not in v and len(v) == 7
    tokens, lengths = v.encode(["A dog runs.", "zebra dog"])
    assert tokens.dtype == torch.long and lengths.tolist() == [6, 4]
    assert tokens[0].tolist() == [1, v.stoi["a"], v.stoi["dog"], v.stoi["runs"], 3, 2]   # '.' is unknown
    assert tokens[1].tolist() == [1, 3, v.stoi["dog"], 2, 0, 0]                          # padded with 0
    assert v.decode(tokens[0].tolist()) == "a dog runs"
    no_se, n = v.encode("a dog", add_start_end=False)
    assert no_se.tolist() == [[v.stoi["a"], v.stoi["dog"]]] and n.tolist() == [2]
    assert Vocab.build(caps) != v and len(Vocab.build(caps)) == 4 + 9
    v.save(tmp_path / "vocab.json")
    assert Vocab.load(tmp_path / "vocab.json") == v
    with pytest.raises(ValueError, match="min_count"):
        Vocab.build(caps, min_count=0)


# ---------------------------------------------------------------- collate

def test_collate_with_vocab_pads_captions(demo_root):
    ds = PrecompDataset(demo_root, "train")
    vocab = Vocab.build(ds.captions)
    items = [ds[i] for i in (0, 1, 9, 33)]
    batch = PrecompCollate(vocab)(items)
    assert isinstance(batch, Batch)
    assert batch.images.shape == (4, 12, 128) and batch.image_lengths.tolist() == [12] * 4
    assert batch.image_index.tolist() == [0, 0, 1, 6] and batch.caption_index.tolist() == [0, 1, 9, 33]
    lengths = [len(tokenize(it[1])) + 2 for it in items]
    assert batch.caption_lengths.tolist() == lengths
    assert batch.captions.shape == (4, max(lengths))
    for row, n, it in zip(batch.captions, lengths, items):
        assert row[0] == vocab.start_id and row[n - 1] == vocab.end_id
        assert (row[n:] == vocab.pad_id).all() and (row[:n] != vocab.pad_id).all()
        assert vocab.decode(row.tolist()) == " ".join(tokenize(it[1]))


def test_collate_without_vocab_keeps_strings_and_pads_regions():
    items = [(torch.ones(3, 2), "a cat", 0, 0), (2 * torch.ones(5, 2), "a dog", 1, 5)]
    batch = collate(items)
    assert batch.captions == ["a cat", "a dog"] and batch.caption_lengths is None
    assert batch.images.shape == (2, 5, 2) and batch.image_lengths.tolist() == [3, 5]
    assert (batch.images[0, 3:] == 0).all() and (batch.images[0, :3] == 1).all()
    with pytest.raises(ValueError, match="empty"):
        collate([])


def test_dataloader_round_trip(demo_root):
    ds = PrecompDataset(demo_root, "test")
    vocab = Vocab.build(ds.captions)
    fn = pickle.loads(pickle.dumps(PrecompCollate(vocab)))            # picklable for workers
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=False, collate_fn=fn)
    seen = torch.cat([b.caption_index for b in loader])
    assert torch.equal(seen, torch.arange(len(ds)))
    assert sum(b.images.shape[0] for b in loader) == len(ds)
