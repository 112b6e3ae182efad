"""pml_smooth_ap: fastrank's Smooth-AP against pytorch-metric-learning's SmoothAPLoss, on
embeddings as PML takes them (docs/spec.md §2.8 and 2.10).

    python -m benchmarks pml_smooth_ap              # B = 128 .. 4096 embeddings, d = 128, 4 per class

Input: L2-normalised embeddings (B, 128), labels with 4 samples per class (B / 4
classes), forward+backward of the scalar loss (gradient to the embeddings), float32.
Implementations, run by harness.py: ``fastrank`` (fastrank.compat.SmoothAPLoss, the
adapter that builds sim and positives and calls smooth_ap_loss) and ``pml``
(pytorch_metric_learning.losses.SmoothAPLoss(temperature=0.01)); time and peak memory.
Recorded as skipped, with the reason, while fastrank has no smooth_ap_loss or its adapter,
or pytorch-metric-learning is not installed (``pip install pytorch-metric-learning``).
"""
from __future__ import annotations


import torch

import fastrank

from ..case import Case
from ..harness import Skip, run_peer_case
from ..ops import Op

DIM, PER_CLASS, TAU = 128, 4, 0.01


def embedding_inputs(size, device, dtype, requires_grad):
    b = size["b"]
    emb = torch.nn.functional.normalize(torch.randn(b, DIM, device=device), dim=1).to(dtype)
    return {"embeddings": emb.requires_grad_(requires_grad),
            "labels": torch.arange(b, device=device) // PER_CLASS}


def _fastrank():
    adapter = getattr(getattr(fastrank, "compat", None), "SmoothAPLoss", None)
    if adapter is None:
        raise Skip("fastrank.compat has no SmoothAPLoss adapter yet")
    return adapter(temperature=TAU)


def _pml():
    try:
        from pytorch_metric_learning.losses import SmoothAPLoss
    except ImportError as e:
        raise Skip(f"pytorch_metric_learning is not installed ({e})") from e
    return SmoothAPLoss(temperature=TAU)


def _sizes(*bs):
    return [{"b": b} for b in bs]


OP = Op(
    name="smooth_ap_embeddings",
    about="Smooth-AP on (B, 128) embeddings, 4 per class",
    impls={"fastrank": _fastrank, "pml": _pml},
    inputs=embedding_inputs,
    sizes={"cpu": _sizes(128, 256, 512, 1024, 2048, 4096), "cuda": _sizes(128, 256, 512, 1024, 2048, 4096),
           "quick": _sizes(16, 32)},
    work=lambda s: s["b"] ** 2,
    est_bytes=lambda impl, mode, s, itemsize: (4 * s["b"] if impl == "pml" else 8) * s["b"] ** 2 * 4,
    modes=("forward+backward",),
    baseline="pml",
    size_label=lambda s: f"B = {s['b']}",
    x_of=lambda s: s["b"],
    x_name="B (embeddings, d = 128, 4 per class)",
    requires="smooth_ap_loss",
)


def run(args, device, save):
    return run_peer_case("pml_smooth_ap", OP, args, device, "b", ["pml/fastrank"], f"temperature {TAU}",
                         {"dim": DIM, "per_class": PER_CLASS})


CASE = Case("pml_smooth_ap", "Smooth-AP on embeddings (d = 128, 4 per class, B = 128..4096) against "
                             "pytorch-metric-learning's SmoothAPLoss: time, peak memory", run,
            choices={"impls": list(OP.impls)})
