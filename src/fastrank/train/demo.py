"""``fastrank demo``: the seed recipes of the five papers, trained side by side on the built-in
demo data (``fastrank.data.make_demo``) with the same model, data order, optimizer and seed,
and evaluated on its test split (1000 images x 5000 captions) with and without fast re-ranking.

Recipes (``RECIPES``; the loss is the only difference):

- ``triplet``: VSE++ hinge triplet with the hardest negative (Listwise ITR's baseline);
- ``triplet+smooth_ndcg``: the same + smooth-NDCG, weights 1:1 (Listwise ITR, Eq. 22, tau 0.01);
- ``bcls``: Triplet-SN (LogSumExp soft negatives, gamma 50) + Kendall SW-HS (BCLS);
- ``ladder``: ladder loss, L = 2 (Ladder Loss: theta 0.63, margins 0.2 / 0.01, weights 1 / 0.25);
- ``topk``: top-k triplet (Deep Top-k, k = 5);
- ``smooth_ap``: Smooth-AP alone (Brown et al., ECCV 2020, tau 0.01; binary relevance: the
  captions of the query's image are its positives);
- ``pixel_triplet`` / ``pixel_triplet+smooth_ndcg``: the first two on pixels -- the same scenes
  and captions rendered as 32 x 32 images (``data.path = "demo_pixels"``), a small CNN (``cnn``)
  trained from scratch instead of the fc on region features, as DVSE trains its backbone;

and each of them evaluated after fast re-ranking (DVSE) as ``<name>+rerank``. Every recipe
starts from one shared warm-up epoch (triplet summed over all negatives, VSE-infinity's warm-up:
hardest-negative mining from scratch collapses on this data), trained once. Relevance
for the listwise losses and the graded metrics comes from the bundled all-MiniLM-L6-v2 caption
embeddings (encoded once, cached on disk). A recipe whose loss is not available yet
(NotImplementedError) is skipped with a message.

Outputs in ``out`` (default ``demo_results/``): ``results.json`` (recipe -> the flat dict of
``fastrank.metrics.evaluate`` on the test split), ``results.md`` (the table and the setup),
``run_info.json`` (configuration, timings, skipped recipes, per-epoch histories),
``loss.png`` and ``rsum.png`` (per epoch, per recipe), ``runs/<recipe>/metrics.jsonl``.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .config import Config
from .build import DEMO_PIXELS, load_datasets
from .loop import Trainer
from .plots import plot_curves
from .relevance_source import CaptionRelevance

__all__ = ["Recipe", "RECIPES", "demo_config", "run_demo", "format_table", "markdown_table"]


@dataclass(frozen=True)
class Recipe:
    """One demo recipe: a ``CombinedLoss`` spec and its options; ``pixels``: trained on the
    rendered scenes with the from-scratch CNN (``demo_config(pixels=True)``)."""
    name: str
    title: str
    spec: str
    options: Dict[str, Dict] = field(default_factory=dict)
    pixels: bool = False


RECIPES: List[Recipe] = [
    Recipe("triplet", "VSE++ triplet, hardest negative (Listwise ITR baseline)", "triplet:1.0",
           {"triplet": {"margin": 0.2, "mining": "hardest"}}),
    Recipe("triplet+smooth_ndcg", "triplet + smooth-NDCG (Listwise ITR)", "triplet:1.0,smooth_ndcg:1.0",
           {"triplet": {"margin": 0.2, "mining": "hardest"}, "smooth_ndcg": {"tau": 0.01}}),
    Recipe("bcls", "Triplet-SN + Kendall SW-HS (BCLS)", "triplet:1.0,kendall_sw:1.0",
           {"triplet": {"margin": 0.2, "mining": "soft", "gamma": 50.0},
            "kendall_sw": {"alpha": 0.1, "beta": 0.05}}),
    Recipe("ladder", "ladder loss, L = 2 (Ladder Loss)", "ladder:1.0",
           {"ladder": {"thresholds": [0.63], "margins": [0.2, 0.01], "weights": [1.0, 0.25], "hard": True}}),
    Recipe("topk", "top-k triplet, k = 5 (Deep Top-k)", "topk:1.0", {"topk": {"k": 5, "margin": 0.2}}),
    Recipe("smooth_ap", "Smooth-AP, tau 0.01 (Brown et al., ECCV 2020)", "smooth_ap:1.0", {"smooth_ap": {"tau": 0.01}}),
    Recipe("pixel_triplet", "pixels, CNN from scratch: VSE++ triplet, hardest negative", "triplet:1.0",
           {"triplet": {"margin": 0.2, "mining": "hardest"}}, pixels=True),
    Recipe("pixel_triplet+smooth_ndcg", "pixels, CNN from scratch: triplet + smooth-NDCG",
           "triplet:1.0,smooth_ndcg:1.0",
           {"triplet": {"margin": 0.2, "mining": "hardest"}, "smooth_ndcg": {"tau": 0.01}}, pixels=True),
]


MIN_EPOCHS = 2     # the shared warm-up epoch and at least one of the recipe's
PIXEL_EPOCHS = 3   # the pixel recipes: 1 shared warm-up + 2 epochs each (the demo stays short)


def demo_config(quick: bool = False, seed: int = 0, device: str = "auto", epochs: Optional[int] = None,
                out: str = "demo_results", pixels: bool = False) -> Config:
    """The shared configuration of the demo runs (the recipe sets the loss).

    Full: 3000 training images (15000 captions), the 1000-image test split, fc_max + bi-GRU
    (word_dim 128), embed_dim 128, batch 128, AdamW lr 5e-4 decayed x0.1 for the last epoch,
    5 epochs of which the first is the shared warm-up (triplet summed over all negatives),
    sbert relevance. quick: 200 / 100 images, a tiny model, 1 warm-up + 1 epoch, TF-IDF
    relevance (a smoke test, well under a minute).

    pixels: the pixel recipes' setup -- the same scenes rendered as 32 x 32 images
    (``"demo_pixels"``), the ``cnn`` image encoder (widths 8 / 16 / 32, mean pooling) from
    scratch, lr 1e-3, PIXEL_EPOCHS epochs (the first the shared warm-up); quick: widths 8 / 16.
    """
    cfg = Config()
    d, m, o, t, e = cfg.data, cfg.model, cfg.optim, cfg.train, cfg.eval
    d.path, d.train_split, d.eval_split, d.demo_seed = "demo", "train", "test", 0
    m.image_encoder, m.text_encoder = "fc_max", "gru"
    t.seed, t.device, t.progress, t.checkpoint = seed, device, True, False
    e.every, e.graded, e.rerank = 1, False, False   # per-epoch: R@K only; graded metrics at the end
    # VSE-infinity's warm-up: hardest-negative mining from the first step collapses on this data
    # (RSUM ~7 after one epoch at lr 2e-4 or 5e-4), so every recipe starts from one epoch of the
    # triplet loss summed over all negatives
    cfg.loss.warmup_epochs = 1
    cfg.loss.warmup_spec, cfg.loss.warmup_options = "triplet:1.0", {"triplet": {"margin": 0.2, "mining": "all"}}
    if quick:
        d.demo_n_train, d.demo_n_test = 200, 100
        m.embed_dim, m.text_kw = 32, {"word_dim": 32}
        t.epochs, t.batch_size = epochs or 2, 32
        o.lr, o.lr_milestones = 1e-3, []
        e.cs_k = [10]
        cfg.relevance.source = "tfidf"
    else:
        d.demo_n_train, d.demo_n_test = 3000, 1000
        m.embed_dim, m.text_kw = 128, {"word_dim": 128}
        t.epochs, t.batch_size = epochs or 5, 128
        o.lr, o.lr_milestones = 5e-4, [max(t.epochs - 1, 2)]
        e.cs_k = [100]
        cfg.relevance.source = "sbert"
    if pixels:
        d.path, m.image_encoder = "demo_pixels", "cnn"
        m.image_kw = {"widths": [8, 16] if quick else [8, 16, 32]}
        o.lr, o.lr_milestones = 1e-3, []
        t.epochs = epochs or (2 if quick else PIXEL_EPOCHS)
    if t.epochs < MIN_EPOCHS:
        raise ValueError(f"the demo needs epochs >= {MIN_EPOCHS} (1 warm-up epoch + the recipe's), got {t.epochs}")
    t.out_dir = str(Path(out) / "runs")
    return cfg.validate()


# ---------------------------------------------------------------------------- tables
_COLUMNS = [("i2t_r1", "i2t R@1"), ("i2t_r5", "R@5"), ("i2t_r10", "R@10"),
            ("t2i_r1", "t2i R@1"), ("t2i_r5", "R@5"), ("t2i_r10", "R@10"), ("rsum", "RSUM"),
            ("i2t_ndcg", "NDCG i2t"), ("t2i_ndcg", "NDCG t2i"), ("i2t_tau", "tau i2t"), ("t2i_tau", "tau t2i"),
            ("i2t_cs{k}", "CS@{k} i2t"), ("t2i_cs{k}", "CS@{k} t2i"),
            ("i2t_map_r", "mAP@R i2t"), ("t2i_map_r", "mAP@R t2i")]


def _columns(cs_k: int):
    return [(k.format(k=cs_k), label.format(k=cs_k)) for k, label in _COLUMNS]


def _cell(key: str, v) -> str:
    if v is None:
        return "-"
    percent = key == "rsum" or key.split("_")[-1] in ("r1", "r5", "r10")
    return f"{v:.1f}" if percent else f"{v:.3f}"


def _rows(results: Dict[str, Dict[str, float]], cs_k: int):
    cols = _columns(cs_k)
    return ([label for _, label in cols],
            [[name] + [_cell(k, r.get(k)) for k, _ in cols] for name, r in results.items()])


def format_table(results: Dict[str, Dict[str, float]], cs_k: int = 100) -> str:
    """Fixed-width text table, one row per recipe (R@K in percent, graded metrics in [0, 1] or
    [-1, 1] for tau / CS)."""
    header, rows = _rows(results, cs_k)
    header = ["recipe"] + header
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def markdown_table(results: Dict[str, Dict[str, float]], cs_k: int = 100) -> str:
    """The same table in Markdown."""
    header, rows = _rows(results, cs_k)
    out = ["| recipe | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# ---------------------------------------------------------------------------- the demo
def run_demo(out="demo_results", quick: bool = False, device: str = "auto", seed: int = 0,
             epochs: Optional[int] = None, recipes: Optional[Sequence[str]] = None,
             progress: bool = True, threads: Optional[int] = None,
             log: Callable[[str], None] = print) -> Dict[str, Dict[str, float]]:
    """Train every recipe on the demo data, evaluate it with and without fast re-ranking,
    print the table and write the outputs to ``out`` (see the module docstring).

    recipes: names among ``RECIPES`` (default: all). epochs: override the number of epochs
    (including the shared warm-up epoch). threads: torch CPU threads; None = 1 on CPU (the
    small GRU steps gain little from a second thread, and on a shared machine two spinning
    OpenMP threads made training ~10x slower in our measurements), left alone on CUDA.
    Returns results (recipe or ``recipe+rerank`` -> flat metric dict).
    """
    old_threads = torch.get_num_threads()
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if threads or on_cpu:
        torch.set_num_threads(threads or 1)
    try:
        return _run_demo(out, quick, device, seed, epochs, recipes, progress, log)
    finally:
        torch.set_num_threads(old_threads)


def _run_demo(out, quick, device, seed, epochs, recipes, progress, log) -> Dict[str, Dict[str, float]]:
    t_start = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    known = {r.name: r for r in RECIPES}
    names = list(known) if recipes is None else list(recipes)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown demo recipes {unknown}; known: {list(known)}")
    base = demo_config(quick, seed, device, epochs, str(out))
    base.train.progress = progress
    if base.train.device == "cpu" or (base.train.device == "auto" and not torch.cuda.is_available()):
        log(f"fastrank demo: CPU ({torch.get_num_threads()} thread(s)); recipes: {', '.join(names)}")
    else:
        log(f"fastrank demo: device {base.train.device}; recipes: {', '.join(names)}")

    results: Dict[str, Dict[str, float]] = {}
    histories: Dict[str, List[Dict]] = {}
    skipped: Dict[str, str] = {}
    timings: Dict[str, float] = {}
    pixel_base, shared = None, None    # shared: (captions, relevance) of the last data set
    for pixels in (False, True):
        group = [n for n in names if known[n].pixels == pixels]
        if not group:
            continue
        gbase = base
        if pixels:
            gbase = pixel_base = demo_config(quick, seed, device, epochs, str(out), pixels=True)
            gbase.train.progress = progress
        tag = "pixel_" if pixels else ""
        t0 = time.time()
        data = load_datasets(gbase.data)
        train_ds, test_ds = data
        log(f"{'' if not pixels else chr(10) + 'pixels: '}data: {train_ds.n_images} training images "
            f"({train_ds.n_captions} captions), {test_ds.n_images} test images ({test_ds.n_captions} captions)"
            + (f", rendered {DEMO_PIXELS} x {DEMO_PIXELS}" if pixels else ""))
        captions = (train_ds.captions, test_ds.captions)
        if shared is not None and shared[0] == captions:
            rel = shared[1]     # the pixel scenes are the same scenes: the same captions, the same relevance
            log("relevance: the same captions as above, the same relevance")
        else:
            rc = gbase.relevance
            log(f"relevance: {rc.source} caption embeddings (encoded once, cached on disk) ...")
            rel = (CaptionRelevance.from_config(train_ds, rc), CaptionRelevance.from_config(test_ds, rc))
            shared = (captions, rel)
        timings[f"{tag}data_and_relevance"] = time.time() - t0
        log(f"relevance ready in {timings[tag + 'data_and_relevance']:.1f}s")
        warm_state, timings[f"{tag}warmup"] = _warmup(gbase, data, rel, out / "runs" / f"{tag}warmup", log)
        for name in group:
            _run_recipe(known[name], gbase, data, rel, warm_state, out, log, results, histories, skipped, timings)

    timings["total"] = time.time() - t_start
    ordered = {k: results[k] for n in names for k in (n, f"{n}+rerank") if k in results}
    cs_k = base.eval.cs_k[0]
    (out / "results.json").write_text(json.dumps(ordered, indent=2) + "\n")
    info = {"config": base.to_dict(), "pixel_config": pixel_base.to_dict() if pixel_base is not None else None,
            "recipes": {r: vars(known[r]) for r in names}, "skipped": skipped,
            "timings_s": timings, "torch_threads": torch.get_num_threads(),
            "device": "cuda" if torch.cuda.is_available() and device in ("auto", "cuda") else device,
            "histories": histories}
    (out / "run_info.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    warm_note = f"epoch 1{'-' + str(base.loss.warmup_epochs) if base.loss.warmup_epochs > 1 else ''}: shared warm-up"
    plots = [plot_curves(histories, "loss", out / "loss.png", f"training loss per epoch ({warm_note})",
                         "loss (log scale)", logy=True),
             plot_curves(histories, "rsum", out / "rsum.png", f"RSUM on the test split per epoch ({warm_note})",
                         "RSUM")]
    table = format_table(ordered, cs_k)
    (out / "results.md").write_text(_markdown_report(ordered, base, names, known, skipped, timings, cs_k,
                                                                  pixel_base))
    log("\n" + table)
    for k, why in skipped.items():
        log(f"skipped {k}: {why}")
    log(f"\nwrote {out / 'results.json'}, {out / 'results.md'}"
        + "".join(f", {p}" for p in plots if p is not None) + f"  (total {timings['total']:.0f}s)")
    return ordered


def _warmup(base: Config, data, rel, out_dir: Path, log):
    """The warm-up epoch(s), the same for every recipe of a group (same loss, data order, seed):
    trained once -> (its state, seconds)."""
    t0 = time.time()
    wcfg = copy.deepcopy(base)
    wcfg.loss.spec, wcfg.loss.options = base.loss.warmup_spec, copy.deepcopy(base.loss.warmup_options)
    wcfg.train.epochs, wcfg.train.out_dir = base.loss.warmup_epochs, str(out_dir)
    log(f"\n== shared warm-up{' (pixels)' if base.data.path == 'demo_pixels' else ''}: "
        f"{base.loss.warmup_epochs} epoch(s) of {base.loss.warmup_spec} {json.dumps(base.loss.warmup_options)} ==")
    warm = Trainer(wcfg, data=data, relevance=rel, log=log)
    warm.fit()
    state = copy.deepcopy(warm.state_dict())
    del warm
    return state, time.time() - t0


def _run_recipe(recipe: Recipe, base: Config, data, rel, warm_state, out: Path, log,
                results, histories, skipped, timings) -> None:
    """Train one recipe from the warm-up state and evaluate it, with and without re-ranking."""
    name = recipe.name
    cfg = copy.deepcopy(base)
    cfg.loss.spec, cfg.loss.options = recipe.spec, copy.deepcopy(recipe.options)
    cfg.train.out_dir = str(out / "runs" / name)
    log(f"\n== {name}: {recipe.title} ({recipe.spec}) ==")
    t0 = time.time()
    try:
        trainer = Trainer(cfg, data=data, relevance=rel, log=log)
        trainer.load_state_dict(warm_state)
        trainer.fit()
    except NotImplementedError as err:
        skipped[name] = f"loss not available yet ({type(err).__name__}{': ' + str(err) if str(err) else ''})"
        log(f"   skipped {name}: {skipped[name]}")
        return
    histories[name] = trainer.history
    sim = trainer.similarity()
    results[name] = trainer.evaluate(graded=rel[1] is not None, sim=sim)
    try:
        results[f"{name}+rerank"] = trainer.evaluate(graded=rel[1] is not None, rerank=True, sim=sim)
    except NotImplementedError as err:
        skipped[f"{name}+rerank"] = (f"fast re-ranking not available yet ({type(err).__name__}"
                                     f"{': ' + str(err) if str(err) else ''})")
        log(f"   skipped {name}+rerank: {skipped[name + '+rerank']}")
    timings[name] = time.time() - t0
    log(f"   {name}: RSUM {results[name]['rsum']:.1f}"
        + (f", re-ranked {results[name + '+rerank']['rsum']:.1f}" if f"{name}+rerank" in results else "")
        + f" ({timings[name]:.1f}s)")


def _markdown_report(results, cfg: Config, names, known, skipped, timings, cs_k, pixel_cfg=None) -> str:
    d, m, o, t = cfg.data, cfg.model, cfg.optim, cfg.train
    lines = ["# fastrank demo results", "",
             f"Demo data: {d.demo_n_train} training images x 5 captions, test split {d.demo_n_test} images "
             f"x 5 captions (seed {d.demo_seed}). Model: {m.image_encoder} + {m.text_encoder}, embed_dim "
             f"{m.embed_dim}. AdamW lr {o.lr:g} (x{o.lr_gamma:g} at epochs {o.lr_milestones}), batch "
             f"{t.batch_size}, {t.epochs} epochs, seed {t.seed}, grad clip {o.grad_clip:g}. Every recipe "
             f"starts from the same {cfg.loss.warmup_epochs} warm-up epoch(s) of `{cfg.loss.warmup_spec}` "
             f"{json.dumps(cfg.loss.warmup_options)} (hardest-negative mining from scratch collapses on this "
             f"data) and then trains {t.epochs - cfg.loss.warmup_epochs} epoch(s) with its own loss. Relevance: "
             f"{cfg.relevance.source}. Metrics: `fastrank.metrics.evaluate` on the test split after the "
             f"last epoch (no checkpoint selection on the test split); R@K in percent; `+rerank` = fast "
             f"re-ranking (DVSE) at evaluation.", "",
             markdown_table(results, cs_k), "", "| recipe | loss |", "|---|---|"]
    if pixel_cfg is not None:
        pm, po, pt = pixel_cfg.model, pixel_cfg.optim, pixel_cfg.train
        pd = pixel_cfg.data
        pixel_text = [f"Pixel recipes (`pixel_*`): the same demo scenes and captions ({pd.demo_n_train} training, "
                      f"{pd.demo_n_test} test images x 5 captions, seed {pd.demo_seed}) rendered as {DEMO_PIXELS} x "
                      f"{DEMO_PIXELS} images, image encoder `{pm.image_encoder}` {json.dumps(pm.image_kw)} "
                      f"trained from scratch + {pm.text_encoder}, embed_dim {pm.embed_dim}, AdamW lr {po.lr:g}, "
                      f"batch {pt.batch_size}, {pt.epochs} epochs of which the first is their own shared warm-up "
                      f"(`{pixel_cfg.loss.warmup_spec}` over all negatives). Relevance: "
                      f"{pixel_cfg.relevance.source}.", ""]
        if any(known[n].pixels for n in names) and all(known[n].pixels for n in names):
            lines[2:3] = pixel_text[:1]          # no region-feature recipe ran: only the pixel setup
        else:
            lines[4:4] = pixel_text
    lines += [f"| {n} | `{known[n].spec}` {json.dumps(known[n].options)} |" for n in names]
    if skipped:
        lines += ["", "Skipped:"] + [f"- {k}: {v}" for k, v in skipped.items()]
    lines += ["", "Time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()), "",
              "![loss](loss.png) ![rsum](rsum.png)", ""]
    return "\n".join(lines)
