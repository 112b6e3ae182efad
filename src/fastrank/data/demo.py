"""A built-in, deterministic demo dataset with real structure, in the precomp layout.

Each scene has 7 attributes (object, colour, action, place, count, time, item). Its 5 captions
are written from varied templates and synonyms, each mentioning the object and count and a
random subset of the other attributes (like real captions, which describe a scene partially
and differently). Its region features (default 12 x 128) come from fixed random prototype
vectors of the scene's attribute values: each region shows one attribute value, sometimes mixed
with a second one, plus clutter regions and noise; object prototypes share a person / animal
component. Scenes that share attributes therefore have related captions (shared words, close
sentence-transformers embeddings) and related features, so relevance is graded as in COCO.

``make_demo(root)`` writes ``{train,test}_ims.npy`` and ``{train,test}_caps.txt``, read back by
:class:`~fastrank.data.PrecompDataset` like any real dataset; the same seed gives
byte-identical files. ``make_demo()`` returns the same arrays in memory.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Union

import numpy as np

from .. import _validation as V

# attribute -> values; each value -> its synonyms (surface forms)
_OBJECTS = [  # (is_person, [(singular, plural), ...])
    (True, [("man", "men"), ("guy", "guys"), ("gentleman", "gentlemen")]),
    (True, [("woman", "women"), ("lady", "ladies")]),
    (True, [("boy", "boys"), ("young boy", "young boys"), ("kid", "kids")]),
    (True, [("girl", "girls"), ("little girl", "little girls")]),
    (True, [("skateboarder", "skateboarders"), ("skater", "skaters")]),
    (False, [("dog", "dogs"), ("puppy", "puppies"), ("pup", "pups")]),
    (False, [("cat", "cats"), ("kitten", "kittens"), ("kitty", "kitties")]),
    (False, [("horse", "horses"), ("pony", "ponies")]),
    (False, [("bird", "birds"), ("little bird", "little birds")]),
    (False, [("cow", "cows")]),
    (False, [("sheep", "sheep"), ("lamb", "lambs")]),
    (False, [("elephant", "elephants")]),
]
_COLOURS = [["red"], ["blue"], ["green"], ["yellow"], ["black"], ["white"], ["brown"], ["orange"],
            ["pink"], ["gray", "grey"]]
_WEARING = ["in", "wearing", "dressed in"]
_ACTIONS = [  # (progressive, 3rd singular, plural)
    [("running", "runs", "run"), ("racing", "races", "race")],
    [("sitting", "sits", "sit"), ("resting", "rests", "rest")],
    [("jumping", "jumps", "jump"), ("leaping", "leaps", "leap")],
    [("sleeping", "sleeps", "sleep"), ("napping", "naps", "nap")],
    [("eating", "eats", "eat"), ("having lunch", "has lunch", "have lunch")],
    [("playing", "plays", "play")],
    [("standing", "stands", "stand")],
    [("walking", "walks", "walk"), ("strolling", "strolls", "stroll")],
    [("swimming", "swims", "swim")],
]
_PLACES = [
    ["in the park", "at a park", "in a public park"],
    ["on the beach", "at the beach", "by the sea"],
    ["on the street", "on a city street", "along the road"],
    ["in a field", "in a grassy field", "on the grass"],
    ["in the kitchen", "in a kitchen"],
    ["in the living room", "in a living room"],
    ["in the snow", "on a snowy hill"],
    ["in the forest", "in the woods"],
    ["by the lake", "near a lake", "at the lakeside"],
    ["in the backyard", "in a yard"],
]
_COUNTS = [(False, ["a", "one"]), (True, ["two", "a pair of"]), (True, ["three"]),
           (True, ["several", "a group of", "many"])]
_TIMES = [["during the day", "on a sunny day", "in daylight"], ["at night", "in the evening", "after dark"],
          ["in the rain", "on a rainy day"], ["on a cloudy day", "under cloudy skies"]]
_ITEMS = [[""], ["with a ball", "holding a ball", "next to a ball"], ["with a frisbee", "catching a frisbee"],
          ["with an umbrella", "under an umbrella"], ["with a bag", "carrying a bag"],
          ["with a toy", "near a toy"], ["with a bicycle", "next to a bike"]]
_PHOTO = ["a photo of", "a picture of", "an image of"]

#: attribute names and their value names (value index -> name), in the column order of
#: ``DemoSplit.attributes``
DEMO_ATTRIBUTES: Dict[str, tuple] = {
    "object": tuple(o[1][0][0] for o in _OBJECTS),
    "colour": tuple(c[0] for c in _COLOURS),
    "action": tuple(a[0][0] for a in _ACTIONS),
    "place": tuple(p[0].split(" ", 2)[-1] for p in _PLACES),
    "count": ("one", "two", "three", "many"),
    "time": ("day", "night", "rain", "cloudy"),
    "item": ("none", "ball", "frisbee", "umbrella", "bag", "toy", "bicycle"),
}
_NVAL = np.array([len(v) for v in DEMO_ATTRIBUTES.values()])
OBJ, COL, ACT, PLC, CNT, TIM, ITM = range(7)
# region slots: (primary attribute, secondary attribute or -1); -2 = clutter
_SLOTS = [(OBJ, -1), (OBJ, -1), (OBJ, COL), (COL, -1), (ACT, -1), (ACT, OBJ), (PLC, -1), (PLC, -1),
          (CNT, OBJ), (TIM, PLC), (ITM, -1), (-2, -1)]
# probability that a caption mentions colour, action, place, time, item
_MENTION = np.array([0.6, 0.8, 0.7, 0.35, 0.6])
_AN = re.compile(r"\ba ([aeiou])")


class DemoSplit(NamedTuple):
    """One in-memory demo split: images (n, regions, dim) float32, captions (5 n strings, the
    captions of image i at 5 i .. 5 i + 4), attributes (n, 7) int64 scene attributes
    (columns and value names in ``DEMO_ATTRIBUTES``)."""
    images: np.ndarray
    captions: List[str]
    attributes: np.ndarray


def _sample_scenes(rng: np.random.Generator, n: int) -> np.ndarray:
    attrs = np.stack([rng.integers(0, k, n) for k in _NVAL], axis=1)
    attrs[:, CNT] = rng.choice(4, n, p=[0.5, 0.2, 0.1, 0.2])
    attrs[:, ITM] = np.where(rng.random(n) < 0.4, 0, rng.integers(1, _NVAL[ITM], n))
    return attrs


def _pick(options, u: float):
    return options[min(int(u * len(options)), len(options) - 1)]


def _caption(a: np.ndarray, mention: np.ndarray, template: int, u: np.ndarray) -> str:
    """One caption of the scene with attributes a; mention (5,) bools for colour, action,
    place, time, item; u (9,) uniforms choosing synonyms."""
    person, nouns = _OBJECTS[a[OBJ]]
    plural, dets = _COUNTS[a[CNT]]
    noun = _pick(nouns, u[0])[int(plural)]
    subj = _pick(dets, u[1])
    colour = _pick(_COLOURS[a[COL]], u[2])
    if mention[0] and not person:
        subj += f" {colour} {noun}"
    elif mention[0]:
        subj += f" {noun} {_pick(_WEARING, u[3])} {colour}"
    else:
        subj += f" {noun}"
    be = "are" if plural else "is"
    ing, sg, pl = _pick(_ACTIONS[a[ACT]], u[4])
    has_act = bool(mention[1])
    place = _pick(_PLACES[a[PLC]], u[5]) if mention[2] else ""
    time = _pick(_TIMES[a[TIM]], u[6]) if mention[3] else ""
    item = _pick(_ITEMS[a[ITM]], u[7]) if mention[4] else ""
    prog = f"{be} {ing}" if has_act else ""
    if template == 1 and place:
        parts = [place + ",", subj, prog, item, time]
    elif template == 2:
        parts = ["there", be, subj, ing if has_act else "", item, place, time]
    elif template == 3:
        parts = [_pick(_PHOTO, u[8]), subj, ing if has_act else "", item, place, time]
    elif template == 4 and time:
        parts = [time + ",", subj, prog, item, place]
    elif template == 5:
        parts = [subj, (pl if plural else sg) if has_act else "", item, place, time]
    else:
        parts = [subj, prog, item, place, time]
    text = _AN.sub(r"an \1", " ".join(p for p in parts if p))
    return text[0].upper() + text[1:] + "."


def _captions(rng: np.random.Generator, attrs: np.ndarray, cpi: int) -> List[str]:
    n = attrs.shape[0]
    mention = rng.random((n, cpi, 5)) < _MENTION
    templates = rng.integers(0, 6, (n, cpi))
    u = rng.random((n, cpi, 9))
    return [_caption(attrs[i], mention[i, c], templates[i, c], u[i, c]) for i in range(n) for c in range(cpi)]


def _prototypes(rng: np.random.Generator, dim: int) -> np.ndarray:
    """(total values, dim) prototype table, attribute blocks in DEMO_ATTRIBUTES order; object
    prototypes share a person / animal component."""
    table = rng.standard_normal((int(_NVAL.sum()), dim))
    category = rng.standard_normal((2, dim))
    is_person = np.array([o[0] for o in _OBJECTS], dtype=int)
    table[:_NVAL[OBJ]] = 0.8 * table[:_NVAL[OBJ]] + 0.6 * category[is_person]
    return table


def _regions(rng: np.random.Generator, attrs: np.ndarray, protos: np.ndarray, n_regions: int,
             noise: float) -> np.ndarray:
    n, dim = attrs.shape[0], protos.shape[1]
    offsets = np.concatenate([[0], np.cumsum(_NVAL)[:-1]])
    gidx = attrs + offsets                                        # (n, 7) prototype rows
    slots = np.array([_SLOTS[r % len(_SLOTS)] for r in range(n_regions)])
    clutter = rng.integers(0, protos.shape[0], (n, n_regions))
    prim = np.where(slots[:, 0] >= 0, gidx[:, np.clip(slots[:, 0], 0, None)], clutter)
    prim = np.where((slots[:, 0] == ITM) & (attrs[:, ITM:ITM + 1] == 0), clutter, prim)  # no item
    sec = gidx[:, np.clip(slots[:, 1], 0, None)]
    w = np.where(slots[:, 1] >= 0, rng.uniform(0.5, 0.8, (n, n_regions)), 1.0)[..., None]
    feats = w * protos[prim] + (1 - w) * protos[sec]
    feats += noise * rng.standard_normal((n, n_regions, dim))
    feats += 0.3 * rng.standard_normal((n, 1, dim))              # per-image shift (lighting, ...)
    order = np.argsort(rng.random((n, n_regions)), axis=1)        # regions come in random order
    return np.take_along_axis(feats, order[..., None], axis=1).astype(np.float32)


def _split(seed: int, stream: int, n: int, protos: np.ndarray, n_regions: int, noise: float,
           cpi: int, pixels: Optional[int] = None) -> DemoSplit:
    rng = np.random.default_rng([seed, stream])
    attrs = _sample_scenes(rng, n)
    caps = _captions(rng, attrs, cpi)
    if pixels is not None:   # the same scenes and captions, drawn (its own random stream)
        from .pixels import render_scenes
        images = render_scenes(attrs, pixels, seed=seed * 1000 + stream).reshape(n, -1)
        return DemoSplit(images, caps, attrs.astype(np.int64))
    return DemoSplit(_regions(rng, attrs, protos, n_regions, noise), caps, attrs.astype(np.int64))


def make_demo(root=None, seed: int = 0, n_train: int = 3000, n_test: int = 1000, n_regions: int = 12,
              dim: int = 128, noise: float = 1.0, captions_per_image: int = 5, pixels: Optional[int] = None
              ) -> Union[Path, Dict[str, DemoSplit]]:
    """Generate the demo dataset (a second or two).

    root: a directory: write ``train_ims.npy`` (n_train, n_regions, dim) float32,
    ``train_caps.txt`` (captions_per_image lines per image), ``test_ims.npy``, ``test_caps.txt``
    there and return ``Path(root)``; read them with ``PrecompDataset(root, "train")``.
    None: return ``{"train": DemoSplit, "test": DemoSplit}`` in memory
    (``PrecompDataset.from_arrays(split.images, split.captions)``).
    The same arguments give byte-identical files; the prototypes depend on seed and dim only,
    and each split has its own random stream, so the test split does not depend on n_train.
    noise: standard deviation of the per-element region noise (prototype entries have std 1).
    pixels: None (region features), or a size S: the same scenes and captions rendered as
    S x S RGB images (``fastrank.data.pixels.render_scenes``), stored flattened,
    images (n, 3 S S) float32 in [0, 1] -- the input of the ``cnn`` / ``hf_vision`` encoders.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    n_train, n_test = V.check_int(n_train, "n_train"), V.check_int(n_test, "n_test")
    n_regions, dim = V.check_int(n_regions, "n_regions"), V.check_int(dim, "dim")
    cpi = V.check_int(captions_per_image, "captions_per_image")
    noise = V.check_nonnegative(noise, "noise")
    if pixels is not None:
        pixels = V.check_int(pixels, "pixels", minimum=8)
    protos = _prototypes(np.random.default_rng([int(seed), 0]), dim)
    splits = {name: _split(int(seed), stream, n, protos, n_regions, noise, cpi, pixels)
              for name, stream, n in (("train", 1, n_train), ("test", 2, n_test))}
    if root is None:
        return splits
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for name, s in splits.items():
        np.save(root / f"{name}_ims.npy", s.images)
        (root / f"{name}_caps.txt").write_text("\n".join(s.captions) + "\n", encoding="utf-8")
    return root
