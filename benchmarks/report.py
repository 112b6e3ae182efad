"""``python -m benchmarks report PATH ...``: everything people read, regenerated from the JSON.

- ``results/X.json`` (or a folder of them): rewrites ``X.md`` (tables.markdown) and
  ``X.png`` (plots.plot) beside it.
- any other markdown file (the README): rewrites every table between a marker and its end
  from the result file the marker names, so a number in the README cannot drift from
  its measurement::

      <!-- benchmarks table: benchmarks/results/cpu-2026-11-23-percall.json; ops=smooth_ndcg,kendall;
           columns=native:time, reference:time, native/trivial as native / trivial op -->
      (generated: a line naming the file and how it was measured, then the table)
      <!-- end benchmarks table -->

  The path is relative to the markdown file. Keys: ``columns`` (tables.py's tokens),
  ``ops``, ``modes``, ``max_n``, ``min_n``, ``row_label`` and ``op_label`` (the size and
  op columns' titles); ``layout=quality`` (with ``ref``) for a training-quality result
  (quality/report.py), ``layout=quality-verdicts`` (``columns`` of differences, ``rows`` the
  losses) for its win / tie / lose table per list length; ``layout=isa`` (no ``columns``) for
  the CPU-level table that cases/isa.py renders into its result; ``layout=cuda-status`` (the
  path a folder of result files, no ``columns``; ``files`` for one line on those sources) for
  what of the CUDA build ran on a GPU, drawn from the ``cuda-*`` results and git (cuda_status.py).
  Outside the generated blocks, no page may say that code ran on a GPU: that claim is the
  CUDA status's, which changes when the code does.
- a folder: its result files, and the markdown files under it that are no result's ``.md``.

``--check`` writes nothing and exits 1 when a markdown file (a result's ``.md`` or a
README or docs/ table) is not what its JSON (and git, for the CUDA status) gives, or a page
claims a GPU run outside the CUDA status (tests/test_benchmarks.py checks the README and docs/).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import List

from quality import report as quality_report

from . import cuda_status, gpu_tests, plots, tables
from .cli_args import A
from .results import is_partial, load

MARKER = re.compile(r"(<!-- benchmarks table:(?P<spec>.*?)-->\n)(?P<body>.*?)(<!-- end benchmarks table -->)",
                    re.S)


def payload_markdown(payload: dict) -> str:
    """The ``.md`` of a result: a GPU test run's counts (gpu_tests.py), or the tables of a case."""
    return gpu_tests.markdown(payload) if gpu_tests.is_tests(payload) else tables.markdown(payload)


def result_markdown(json_path: Path) -> str:
    return payload_markdown(load(json_path))


def render_result(json_path: Path, plot: bool = True) -> List[Path]:
    """Write the .md and .png of one result file; returns the paths written."""
    json_path = Path(json_path)
    payload = load(json_path)
    md = json_path.with_suffix(".md")
    md.write_text(payload_markdown(payload))
    out = [md]
    png = json_path.with_suffix(".png")
    if plot:
        drawn = plots.plot(payload, png)
        if drawn:
            out.append(drawn)
        elif png.exists():
            png.unlink()
    return out


def parse_spec(spec: str) -> dict:
    parts = [p.strip() for p in " ".join(spec.split()).split(";") if p.strip()]
    out = {"file": parts[0]}
    for p in parts[1:]:
        key, _, value = p.partition("=")
        out[key.strip()] = value.strip()
    if "columns" not in out and out.get("layout") not in ("isa", "cuda-status"):
        raise ValueError(f"benchmarks table marker without columns=: {spec!r}")
    return out


def render_block(spec: dict, base: Path) -> str:
    if spec.get("layout") == "cuda-status":   # cuda_status.py: the GPU runs' results against git
        return cuda_status.render(spec, base)
    path = (base / spec["file"]).resolve()
    payload = load(path)
    rel = os.path.relpath(path, base)
    if spec.get("layout") == "quality-verdicts":   # quality/report.py: win / tie / lose per list length
        return (f"From [`{rel}`]({rel}): {tables.provenance(payload)}.\n\n"
                + quality_report.verdict_table(payload, _csv(spec["columns"]), _csv(spec.get("rows"))) + "\n")
    if spec.get("layout") == "quality":   # quality/report.py: a row per loss
        recs = quality_report.select(payload, _csv(spec.get("ops")))
        if not recs:
            raise ValueError(f"{spec['file']}: no record matches {spec}")
        return (f"From [`{rel}`]({rel}): {tables.provenance(payload)}.\n\n"
                + quality_report.table(recs, _csv(spec["columns"]), spec.get("ref"), payload["results"]) + "\n")
    if spec.get("layout") == "isa":   # cases/isa.py renders its own table (a column per CPU level)
        return f"From [`{rel}`]({rel}): {tables.provenance(payload)}.\n\n" + "\n".join(payload["report"]["table"]) + "\n"
    recs = tables.select(payload["results"], ops=_csv(spec.get("ops")), modes=_csv(spec.get("modes")),
                         max_n=_num(spec.get("max_n")), min_n=_num(spec.get("min_n")))
    if not recs:
        raise ValueError(f"{spec['file']}: no record matches {spec}")
    return (f"From [`{rel}`]({rel}): {tables.provenance(payload)}.\n\n"
            + tables.table(recs, _csv(spec["columns"]), spec.get("row_label"), spec.get("op_label")) + "\n")


def render_markdown(text: str, base: Path) -> str:
    """The markdown with every benchmarks table regenerated."""
    def sub(m):
        return m.group(1) + "\n" + render_block(parse_spec(m.group("spec")), base) + "\n" + m.group(4)
    return MARKER.sub(sub, text)


def unsupported_claims(text: str) -> List[str]:
    """What the markdown says ran on a GPU outside its generated blocks (cuda_status.claims)."""
    return cuda_status.claims(MARKER.sub(lambda m: m.group(1) + m.group(4), text))


def markdown_files(folder: Path) -> List[Path]:
    """The markdown files under ``folder`` that are not a result file's ``.md``."""
    return sorted(p for p in folder.rglob("*.md") if not p.with_suffix(".json").is_file())


def _csv(s):
    return [x.strip() for x in s.split(",") if x.strip()] if s else None


def _num(s):
    return float(s) if s else None


def parser() -> A.Parser:
    p = A.Parser(prog="python -m benchmarks report", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", type=A.existing_path, help="result .json files or folders, and markdown files")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a markdown file is stale")
    p.add_argument("--no-plots", action="store_true")
    return p


@A.command
def main(argv=None) -> int:
    args = parser().parse_args(argv)
    stale, written, wrong = [], [], []
    for path in args.paths:
        files = (sorted(f for f in path.glob("*.json") if not is_partial(f)) + markdown_files(path)
                 if path.is_dir() else [path])
        for f in files:
            if f.suffix == ".json":
                want, target = result_markdown(f), f.with_suffix(".md")
                if args.check:
                    if not target.exists() or target.read_text() != want:
                        stale.append(target)
                else:
                    written += render_result(f, plot=not args.no_plots)
            else:
                text = f.read_text()
                wrong += [f"{f}: {claim!r}" for claim in unsupported_claims(text)]
                try:
                    want = render_markdown(text, f.resolve().parent)
                except cuda_status.CudaStatusError as err:
                    print(f"cannot render {f}: {err}")
                    return 1
                if want != text:
                    if args.check:
                        stale.append(f)
                    else:
                        f.write_text(want)
                        written.append(f)
    for claim in wrong:
        print(f"says code ran on a GPU outside the generated CUDA status (layout=cuda-status): {claim}")
    if args.check:
        for f in stale:
            print(f"stale: {f}")
        if stale:
            print("regenerate with: python -m benchmarks report " + " ".join(str(p) for p in args.paths))
        return 1 if stale or wrong else 0
    print("wrote: " + (", ".join(str(w) for w in written) or "nothing (up to date)"))
    return 1 if wrong else 0
