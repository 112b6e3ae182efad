"""memory_bank: the smooth-rank losses linear in the candidates: a batch of queries ranked
against a large candidate set (the batch plus a memory bank of past embeddings).

    python -m benchmarks memory_bank      # 256 queries, 5 positives each, C = 4096 .. 65536

Input: sim (256, C) of L2-normalised 64-d embeddings, 5 positives per query at random
columns, i2t, forward+backward, float32. Implementations: ``smooth_ap`` and ``recall_at_k``
(native, impl="native") and the Smooth-AP reference (pure PyTorch, O(Q * C^2) pair terms:
only where it fits the per-case limit). The floor: 2 passes x 256 x 5 x C sigmoids (the
positives' ranks, then their gradient), at the device's exp rate.
"""
from __future__ import annotations

import functools

import torch

import fastrank

from ..case import Case
from ..harness import run_peer_case
from ..ops import Op

QUERIES, POSITIVES, DIM, TAU = 256, 5, 64, 0.01


def bank_inputs(size, device, dtype, requires_grad):
    c = size["c"]
    g = torch.Generator().manual_seed(c)
    q = torch.nn.functional.normalize(torch.randn(QUERIES, DIM, generator=g), dim=1)
    bank = torch.nn.functional.normalize(torch.randn(c, DIM, generator=g), dim=1)
    sim = (q @ bank.T).to(device=device, dtype=dtype)
    pos = torch.zeros(QUERIES, c, dtype=torch.bool)
    cols = torch.stack([torch.randperm(c, generator=g)[:POSITIVES] for _ in range(QUERIES)])
    pos[torch.arange(QUERIES)[:, None], cols] = True
    return {"sim": sim.requires_grad_(requires_grad), "positives": pos.to(device)}


def _loss(fn, impl):
    return lambda: functools.partial(getattr(fastrank, fn), tau=TAU, direction="i2t", impl=impl)


def floor(mode, size, itemsize):
    c = size["c"]
    return {"bytes": 3 * QUERIES * c * itemsize, "exp": 2 * QUERIES * POSITIVES * c}


OP = Op(
    name="smooth_rank_memory_bank",
    about=f"i2t: {QUERIES} queries x {POSITIVES} positives against C candidates",
    impls={"smooth_ap": _loss("smooth_ap_loss", "native"), "recall_at_k": _loss("recall_at_k_loss", "native"),
           "smooth_ap_reference": _loss("smooth_ap_loss", "reference")},
    inputs=bank_inputs,
    sizes={"cpu": [{"c": c} for c in (4096, 16384, 65536)], "cuda": [{"c": c} for c in (4096, 16384, 65536, 262144)],
           "quick": [{"c": 512}]},
    work=lambda s: QUERIES * s["c"],
    est_bytes=lambda impl, mode, s, itemsize: (QUERIES * s["c"] * (s["c"] if "reference" in impl else 8)
                                               * itemsize),
    floor=floor,
    modes=("forward+backward",),
    baseline="smooth_ap_reference",
    size_label=lambda s: f"{QUERIES} x {s['c']}",
    x_of=lambda s: s["c"],
    x_name="C (candidates per query)",
    requires="smooth_ap_loss",
)


def run(args, device, save):
    return run_peer_case("memory_bank", OP, args, device, "c", [], f"i2t, tau {TAU}, {QUERIES} queries, "
                         f"{POSITIVES} positives each", {})


CASE = Case("memory_bank", f"Smooth-AP and Recall@k linear in the candidates: {QUERIES} queries x {POSITIVES} "
                           "positives against 4096..65536 candidates (a memory bank): time, peak memory, floor", run,
            choices={"impls": list(OP.impls)})
