"""Data: precomputed-feature datasets (SCAN / VSE-infinity layout), a word vocabulary, and a
built-in demo dataset in the same layout.

- ``PrecompDataset(root, split)``: ``{split}_ims.npy`` + ``{split}_caps.txt`` (5 captions per
  image); items ``(image_feature, caption, image_index, caption_index)``.
- ``collate(items, vocab=None)`` / ``PrecompCollate(vocab)``: a :class:`Batch` with padded
  features and tokenised captions (or the raw strings, for sbert).
- ``Vocab``: lower-case word vocabulary (``<pad>``, ``<start>``, ``<end>``, ``<unk>``).
- ``make_demo(root=None, seed=0, n_train=3000, n_test=1000)``: the demo dataset.
- ``read_image_captions(data, images, split)``: image files and captions from a Karpathy split
  JSON or a (path, caption) CSV (what ``fastrank extract`` reads).
"""
from .vocab import Vocab, tokenize
from .precomp import LAYOUT, Batch, PrecompCollate, PrecompDataset, collate
from .demo import DEMO_ATTRIBUTES, DemoSplit, make_demo
from .image_captions import ImageCaptions, read_caption_csv, read_image_captions, read_karpathy

__all__ = ["Vocab", "tokenize", "LAYOUT", "Batch", "PrecompCollate", "PrecompDataset", "collate",
           "DEMO_ATTRIBUTES", "DemoSplit", "make_demo",
           "ImageCaptions", "read_caption_csv", "read_image_captions", "read_karpathy"]
