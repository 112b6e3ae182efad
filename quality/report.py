"""The tables and the picture of a training-quality result (quality/study.py): a row per loss,
the ranking metrics on the held-out halves (mean ± std over the splits) and the paired
difference against a reference loss.

Used by tables.py, plots.py and report.py for payloads whose report says
``"layout": "quality"``. A docs marker selects it with ``layout=quality``::

    <!-- benchmarks table: ../benchmarks/results/X.json; layout=quality; ops=Lee bi-encoder;
         ref=ST CoSENTLoss; columns=ndcg, tau, spearman, spearman:diff, time -->

Column tokens: ``ndcg`` (NDCG@10), ``tau`` (mean per-list Kendall tau-b), ``spearman``
(over all test pairs), ``<metric>:diff`` (paired difference, split by split, against the row
``ref`` of the same data set: by default sentence-transformers' CoSENTLoss, or LambdaLoss for
cross-encoder rows), ``<metric>:diff:<row>`` (against that row), ``time`` (median
wall seconds per split, training and evaluation). ``token as Label`` names a column.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import List, Optional

from benchmarks.plots import save_figure
from benchmarks.tables import header_lines

METRIC = {"ndcg": ("ndcg@10", "NDCG@10"), "tau": ("kendall_tau_b", "Kendall τ-b"),
          "spearman": ("spearman", "Spearman ρ")}
DEFAULT_COLUMNS = ["ndcg", "tau", "spearman", "ndcg:diff", "tau:diff", "spearman:diff", "time"]
#: a bi-encoder table of a result with list length as the axis: against both references
SECOND_REF = "ST CosineSimilarityLoss"
K_COLUMNS = ["ndcg", "tau", "spearman", "ndcg:diff", "spearman:diff", f"ndcg:diff:{SECOND_REF}",
             f"spearman:diff:{SECOND_REF}", "time"]


def is_quality(payload: dict) -> bool:
    return (payload.get("report") or {}).get("layout") == "quality"


def reference(op: str, ref: Optional[str] = None) -> str:
    return ref or ("ST LambdaLoss" if "cross-encoder" in op else "ST CoSENTLoss")


def _pm(ms: dict, signed: bool = False) -> str:
    if not ms or ms.get("mean") is None:
        return "n/a"
    mean = f"{ms['mean']:+.3f}" if signed else f"{ms['mean']:.3f}"
    return mean if ms.get("n", 0) < 2 else f"{mean} ± {ms['std']:.3f}"


def _mean_std(xs: List[float]) -> dict:
    if not xs:
        return {}
    mean = sum(xs) / len(xs)
    std = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return {"mean": mean, "std": std, "n": len(xs)}


def paired_diff(rec: dict, other: dict, key: str) -> dict:
    """Mean and std over the splits both measured of ``rec``'s metric minus ``other``'s."""
    theirs = {s["split"]: s.get(key) for s in other["quality"]["per_split"]}
    return _mean_std([s[key] - theirs[s["split"]] for s in rec["quality"]["per_split"]
                      if s.get(key) is not None and theirs.get(s["split"]) is not None])


def _parse(token: str, ref: str):
    """(metric name, kind, reference) of a column token: ``ndcg``, ``ndcg:diff``, ``ndcg:diff:REF``."""
    name, _, rest = token.partition(":")
    kind, _, own = rest.partition(":")
    return name, kind, (own.strip() or ref)


def _cell(rec: dict, token: str, ref: str, peers: dict) -> str:
    if rec["status"] != "ok":
        return "skip" if token == DEFAULT_COLUMNS[0] else ""
    q = rec["quality"]
    if token == "time":
        return f"{rec['time']['median_s']:.0f} s" if rec["time"]["median_s"] >= 10 else \
            f"{rec['time']['median_s']:.2g} s"
    name, kind, ref = _parse(token, ref)
    key = METRIC[name][0]
    if kind == "diff":
        if rec["impl"] == ref:
            return "(reference)"
        other = peers.get((rec["op"], ref))
        return _pm(paired_diff(rec, other, key), signed=True) if other else "n/a"
    return _pm(q["mean_std"][key])


def _label(token: str, ref: str) -> str:
    if token == "time":
        return "time / split"
    name, kind, ref = _parse(token, ref)
    return f"Δ {METRIC[name][1]} vs {ref.replace('ST ', '')}" if kind == "diff" else METRIC[name][1]


def table(records: List[dict], columns: Optional[List[str]] = None, ref: Optional[str] = None,
          peers: Optional[List[dict]] = None) -> str:
    """One table: a row per loss of ``records`` (one op: a data set, a model kind and a list
    length); a difference is taken against the row ``ref`` of the same op among ``peers`` (all
    the result's records; default ``records``)."""
    by = {(r["op"], r["impl"]): r for r in (peers or records) if r["status"] == "ok"}
    columns = columns or DEFAULT_COLUMNS
    ops = list(OrderedDict.fromkeys(r["op"] for r in records))
    show_op = len(ops) > 1
    cols = []
    for c in columns:
        token, _, label = (t.strip() for t in c.partition(" as "))
        cols.append((token, label))
    head = (["data, model"] if show_op else []) + ["loss"] + [
        label or _label(token, reference(ops[0], ref)) for token, label in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in records:
        rf = reference(r["op"], ref)
        lines.append("| " + " | ".join(([r["op"]] if show_op else []) + [r["impl"]]
                                       + [_cell(r, token, rf, by) for token, _ in cols]) + " |")
    return "\n".join(lines)


def _lee_bi_records(payload: dict) -> List[dict]:
    """The measured Lee bi-encoder records with a list length K: the groups of the axis."""
    return [r for r in payload["results"] if r["status"] == "ok" and r.get("k") and r["kind"] == "bi-encoder"
            and r["op_dataset"] == "Lee"]


def verdict(d: dict) -> str:
    """The case's rule on a paired difference (mean ± std over the splits): a *win* or a *loss*
    only when the mean is more than twice the spread away from zero (the splits agree, with
    room), else a *tie*; fewer than two splits decide nothing."""
    if not d or d.get("mean") is None:
        return "n/a"
    if d.get("n", 0) < 2 or abs(d["mean"]) <= 2 * d["std"]:
        return "tie"
    return "**win**" if d["mean"] > 0 else "**lose**"


def verdict_table(payload: dict, columns: List[str], rows: Optional[List[str]] = None) -> str:
    """Win / tie / lose at each list length: a row per (loss, K) of the Lee bi-encoder groups
    (``rows``: the losses, default every one but zero-shot and the references), a column per
    difference token (``<metric>:diff:<reference row>``), each cell the verdict and the paired
    difference it rests on."""
    recs = _lee_bi_records(payload)
    by = {(r["op"], r["impl"]): r for r in recs}
    tokens = [_parse(c, reference("bi-encoder")) for c in columns]
    if any(kind != "diff" for _, kind, _ in tokens):
        raise ValueError(f"a verdict column is a difference (<metric>:diff:<row>): {columns}")
    refs = {ref for _, _, ref in tokens}
    names = rows or [n for n in OrderedDict.fromkeys(r["impl"] for r in recs) if n != "zero-shot" and n not in refs]
    head = ["loss", "K"] + [f"Δ {METRIC[name][1]} vs {ref.replace('ST ', '')}" for name, _, ref in tokens]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name in names:
        for r in sorted((r for r in recs if r["impl"] == name), key=lambda r: r["k"]):
            cells = []
            for metric, _, ref in tokens:
                other = by.get((r["op"], ref))
                d = paired_diff(r, other, METRIC[metric][0]) if other else {}
                cells.append(f"{verdict(d)} {_pm(d, signed=True)}" if d else "n/a")
            lines.append("| " + " | ".join([name, str(r["k"])] + cells) + " |")
    return "\n".join(lines)


def select(payload: dict, ops: Optional[List[str]] = None) -> List[dict]:
    return [r for r in payload["results"] if ops is None or r["op"] in ops]


def markdown(payload: dict, provenance: str) -> str:
    """The ``.md`` of a quality result: how it was run (``provenance``: tables.provenance's
    line), then a table per data set and model kind."""
    lines = header_lines(payload, provenance, f"; wall time {payload.get('elapsed_s', 0) / 60:.1f} min")
    by_k = (payload.get("report") or {}).get("x_axis") == "K"
    for op in OrderedDict.fromkeys(r["op"] for r in payload["results"]):
        columns = K_COLUMNS if by_k and "cross-encoder" not in op else None
        lines += [f"### {op}", "", table(select(payload, [op]), columns, peers=payload["results"]), ""]
    if payload.get("chosen"):
        lines += ["### The search's choices, per split", "", chosen_table(payload), ""]
    skipped = [r for r in payload["results"] if r["status"] != "ok"]
    if skipped:
        lines += [f"Skipped: {skipped[0]['reason']}", ""]
    return "\n".join(lines)


def _short(params: dict) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in params.items())


def chosen_table(payload: dict) -> str:
    """The learning rate and parameters the search chose, a row per (data set, loss), a column per split."""
    chosen = payload["chosen"]
    splits = sorted({c["split"] for c in chosen})
    rows = OrderedDict()
    for c in chosen:
        rows.setdefault((c["dataset"], c["loss"]), {})[c["split"]] = \
            f"lr {c['lr']:g}" + (f"; {_short(c['params'])}" if c["params"] else "")
    lines = ["| data | loss | " + " | ".join(f"split {s}" for s in splits) + " |",
             "|" + " --- |" * (2 + len(splits))]
    for (d, loss), by_split in rows.items():
        lines.append(f"| {d} | {loss} | " + " | ".join(by_split.get(s, "") for s in splits) + " |")
    return "\n".join(lines)


def plot(payload: dict, path: Path) -> Optional[Path]:
    """The picture of a result: against the list length K when the result has that axis
    (``plot_by_k``), else a bar chart per data set and model kind."""
    if (payload.get("report") or {}).get("x_axis") == "K":
        return plot_by_k(payload, path)
    return plot_bars(payload, path)


def plot_by_k(payload: dict, path: Path) -> Optional[Path]:
    """When does listwise pay off: Δ Spearman and Δ NDCG@10 (rows) of every other Lee bi-encoder
    loss against CoSENT and against CosineSimilarityLoss (columns), mean ± std of the paired
    difference over the splits, against K, the documents per step (each ranks the other K - 1)."""
    recs = _lee_bi_records(payload)
    if not recs:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    by = {(r["op"], r["impl"]): r for r in recs}
    ks = sorted({r["k"] for r in recs})
    op_of = {r["k"]: r["op"] for r in recs}
    refs = ("ST CoSENTLoss", SECOND_REF)
    losses = [n for n in OrderedDict.fromkeys(r["impl"] for r in recs) if n != "zero-shot"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), squeeze=False, sharex=True)
    for col, ref in enumerate(refs):
        for row, (key, title) in enumerate((("spearman", "Δ Spearman ρ"), ("ndcg@10", "Δ NDCG@10"))):
            ax = axes[row][col]
            shown = [n for n in losses if n != ref]
            for i, name in enumerate(shown):
                xs, ms, ss = [], [], []
                for k in ks:
                    mine, theirs = by.get((op_of[k], name)), by.get((op_of[k], ref))
                    if mine is None or theirs is None:
                        continue
                    d = paired_diff(mine, theirs, key)
                    if d:
                        xs.append(k * (1 + 0.025 * (i - len(shown) / 2)))   # side by side, not on top
                        ms.append(d["mean"])
                        ss.append(d["std"])
                fastrank = "fastrank" in name
                ax.errorbar(xs, ms, yerr=ss, marker="o" if fastrank else "s", capsize=3,
                            linestyle="-" if fastrank else ":", linewidth=2 if fastrank else 1,
                            label=name.replace("fastrank ", "").replace("ST ", "ST "))
            ax.axhline(0.0, color="k", linewidth=1)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ks)
            ax.set_xticklabels([str(k) for k in ks])
            ax.set_title(f"{title} vs {ref.replace('ST ', '')}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if row == 1:
                ax.set_xlabel("K: documents per step (each ranks the other K - 1)")
            if row == 0 and col == 0:
                ax.legend(fontsize=7, loc="best")
    n = max(len(r["quality"]["per_split"]) for r in recs)
    fig.suptitle(f"When does listwise pay off? Lee bi-encoder, paired Δ against the reference loss, mean ± std over "
                 f"{n} split(s) ({payload['config'].get('setting', '')} setting); solid: fastrank losses",
                 fontsize=10)
    return save_figure(fig, path)


def plot_bars(payload: dict, path: Path) -> Optional[Path]:
    """Per data set and model kind: NDCG@10 and Spearman of every loss, mean ± std over the
    splits (bars), the reference loss's mean dashed. None when nothing was measured."""
    ops = [op for op in OrderedDict.fromkeys(r["op"] for r in payload["results"])
           if any(r["status"] == "ok" and r["op"] == op for r in payload["results"])]
    if not ops:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(ops), 2, figsize=(12, 3.2 * len(ops)), squeeze=False)
    for row, op in enumerate(ops):
        recs = [r for r in select(payload, [op]) if r["status"] == "ok"]
        ref = reference(op)
        for ax, key, title in ((axes[row][0], "ndcg@10", "NDCG@10"), (axes[row][1], "spearman", "Spearman ρ")):
            ms = [r["quality"]["mean_std"][key] for r in recs]
            ok = [(r["impl"], s) for r, s in zip(recs, ms) if s.get("mean") is not None]
            if not ok:
                ax.set_visible(False)
                continue
            names = [n for n, _ in ok]
            means = [s["mean"] for _, s in ok]
            stds = [s["std"] or 0.0 for _, s in ok]
            colors = ["C0" if n.startswith(("fastrank", "CoSENT +")) else "C7" if n == "zero-shot" else "C1"
                      for n in names]
            ax.barh(range(len(names)), means, xerr=stds, color=colors, capsize=3)
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels(names, fontsize=7)
            ax.invert_yaxis()
            lo = min(m - s for m, s in zip(means, stds))
            hi = max(m + s for m, s in zip(means, stds))
            pad = max(0.02, 0.1 * (hi - lo))
            ax.set_xlim(lo - pad, hi + pad)
            refm = next((s["mean"] for n, s in ok if n == ref), None)
            if refm is not None:
                ax.axvline(refm, color="k", linestyle="--", linewidth=1)
            ax.set_title(f"{op}: {title}", fontsize=8)
            ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"quality, {payload['config'].get('setting', '')} setting: mean ± std over the splits; blue: "
                 f"fastrank, orange: sentence-transformers, grey: zero-shot; dashed: the reference loss "
                 f"(CoSENT, LambdaLoss)", fontsize=9)
    return save_figure(fig, path)
