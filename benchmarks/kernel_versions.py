"""The CUDA kernel versions side by side in one process: did the new version win, by how much,
does it agree with the old one, and was the issue-time model right.

    python benchmarks/kernel_versions.py --out DIR [--time-limit S] [--repeats R]

Both versions are in every build (smooth-NDCG: csrc/cuda/smooth_ndcg.cu is version 2,
smooth_ndcg_v1.cu version 1); ``fastrank.kernel_variant(version=1)`` selects version 1 per
call (a field of the call's parameter struct), so this script alternates the two on the same inputs, round
by round (v1, v2, v1, v2, ...: a drift of the clock or of the load hits both), timing each
forward+backward call with CUDA events, and reports the medians, their ratio, the largest
difference between the two versions' losses and gradients, and the model's prediction for
each (the issue-time model table of docs/cuda-resources.md, read from the page). Cases run
smallest first, so a time limit cuts the largest. Writes cuda-<date>-kernel-versions.json and
.md into DIR (not a case of `python -m benchmarks`: to publish them, put them under
benchmarks/results/versions/, as the profiles are under results/profiles/). gpu_check.sh runs
it right after the CUDA tests.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the benchmarks package next to an installed fastrank
    sys.path.append(str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import fastrank  # noqa: E402
from benchmarks.ops import OPS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("v1", "v2")
# (op, N, dtype): smallest first; the sizes of the model's table and of the two H100 points
CASES = [("smooth_ndcg", 1024, "float32"), ("smooth_ap", 4096, "float32"), ("smooth_ap", 4096, "bfloat16"),
         ("smooth_ndcg", 2048, "float32"), ("recall_at_k", 8192, "float32"), ("smooth_ap", 8192, "float32"),
         ("smooth_ap", 8192, "bfloat16"), ("smooth_ndcg", 4096, "float32")]


def predictions(doc: Path = ROOT / "docs" / "cuda-resources.md") -> dict:
    """(op, version, N) -> the model's predicted seconds, from the page's generated table."""
    out = {}
    if not doc.is_file():
        return out
    for m in re.finditer(r"^\| (\w+) \| (v\d) \| (\d+) \|(?:[^|]*\|){5} ([\d.e+-]+) ms \|", doc.read_text(), re.M):
        out[(m[1], m[2], int(m[3]))] = float(m[4]) * 1e-3
    return out


def run_case(op_name: str, n: int, dtype: str, repeats: int, deadline: float) -> dict:
    op = OPS[op_name]
    device = torch.device("cuda")
    inputs = op.inputs({"n": n, "m": n}, device, getattr(torch, dtype), True)
    fn = op.impls["native"]()
    sim = inputs["sim"]

    def call():
        sim.grad = None
        loss = fn(**inputs)
        loss.backward()
        return loss.detach().double(), sim.grad.detach().double()

    results, times = {}, {v: [] for v in VERSIONS}
    for v in VERSIONS:  # warm-up, and each version's result
        with fastrank.kernel_variant(version=int(v[1:])):
            results[v] = call()
    torch.cuda.synchronize()
    for _ in range(repeats):
        if time.monotonic() > deadline:
            break
        for v in VERSIONS:
            with fastrank.kernel_variant(version=int(v[1:])):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                stop.record()
                stop.synchronize()
            times[v].append(start.elapsed_time(stop) * 1e-3)
    (l1, g1), (l2, g2) = results["v1"], results["v2"]
    scale = g1.abs().max().clamp_min(1e-30)
    return {"op": op_name, "n": n, "dtype": dtype,
            "seconds": {v: statistics.median(t) if t else None for v, t in times.items()},
            "samples": {v: len(t) for v, t in times.items()},
            "loss_diff": float((l1 - l2).abs().max()), "grad_diff_rel": float((g1 - g2).abs().max() / scale)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds for all cases (default 120)")
    ap.add_argument("--repeats", type=int, default=7, help="alternated rounds a case (default 7)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.time_limit
    pred = predictions()
    rows = []
    for op_name, n, dtype in CASES:
        if time.monotonic() > deadline:
            rows.append({"op": op_name, "n": n, "dtype": dtype, "skipped": "time limit"})
            continue
        try:
            r = run_case(op_name, n, dtype, args.repeats, deadline)
        except Exception as e:  # noqa: BLE001 - a failed case is reported, the others still run
            r = {"op": op_name, "n": n, "dtype": dtype, "error": f"{type(e).__name__}: {e}"}
        if dtype == "float32":
            r["predicted"] = {v: pred.get((op_name, v, n)) for v in VERSIONS}
        rows.append(r)
        print(json.dumps(r), flush=True)
    date = datetime.date.today().isoformat()
    record = {"case": "kernel_versions", "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "fastrank": fastrank.__version__,
              "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "rows": rows}
    (args.out / f"cuda-{date}-kernel-versions.json").write_text(json.dumps(record, indent=1))
    (args.out / f"cuda-{date}-kernel-versions.md").write_text(markdown(record))
    print(markdown(record))
    return 1 if any("error" in r for r in rows) else 0


def _ms(s):
    return f"{s * 1e3:.3g} ms" if s else "-"


def markdown(record: dict) -> str:
    lines = [f"# kernel versions side by side: {record['device']}, {record['created'][:10]}", "",
             f"`{record['command']}`; torch {record['torch']}; fastrank {record['fastrank']}", "",
             "| op | N | dtype | v1 | v2 | v1 / v2 | predicted v1 | predicted v2 | max loss diff | max grad diff (rel) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in record["rows"]:
        if "seconds" not in r:
            lines.append(f"| {r['op']} | {r['n']} | {r['dtype']} | {r.get('error') or r.get('skipped')} |||||||")
            continue
        s, p = r["seconds"], r.get("predicted") or {}
        ratio = f"{s['v1'] / s['v2']:.2f}x" if s["v1"] and s["v2"] else "-"
        lines.append(f"| {r['op']} | {r['n']} | {r['dtype']} | {_ms(s['v1'])} | {_ms(s['v2'])} | {ratio} | "
                     f"{_ms(p.get('v1'))} | {_ms(p.get('v2'))} | {r['loss_diff']:.3g} | {r['grad_diff_rel']:.3g} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
