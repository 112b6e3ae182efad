"""The registry of fastrank's native ops: what each one is made of, and how to call it.

Every op with native kernels (docs/spec.md §2, §3) has one :class:`NativeOp` entry here:
its functional form, its ``nn.Module`` form, the ``torch.library`` custom ops it is
compiled through (``torch.ops.fastrank.*``), a factory of example inputs, a way to call
each custom op on those inputs, and bad-input cases with the error they must raise.

tests/test_contract.py runs one contract over every entry: ``torch.library.opcheck`` on
each custom op, ``torch.compile(fullgraph=True)`` equal to eager, float64 gradcheck,
determinism, module form equal to the functional form, and bad input raising a
ValueError/TypeError that names the argument. A custom op registered under the
``fastrank`` namespace that no entry lists fails that test, so a new op cannot skip the
contract: add its entry here (CONTRIBUTING.md, "Adding an op").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple, Type

import torch
from torch import Tensor

from . import fast_rerank as _fast_rerank
from . import fast_rerank_topk as _fast_rerank_topk
from . import kendall as _kendall
from . import kendall_sw as _kendall_sw
from . import recall_at_k as _recall_at_k
from . import smooth_ap as _smooth_ap
from . import smooth_ndcg as _smooth_ndcg
from ._launch import DIRECTION_CODE, REDUCTION_CODE

@dataclass(frozen=True)
class Example:
    """One call: ``functional(**inputs, **hyper)``, or ``module(**hyper)(**inputs)``.
    ``grad`` names the inputs that require grad (empty: the op has no gradient)."""
    name: str
    inputs: Dict[str, object]
    hyper: Dict[str, object]
    grad: Tuple[str, ...] = ("sim",)


@dataclass(frozen=True)
class BadInput:
    """A call that must raise ``error`` with a message that starts with ``argument``:
    the example's inputs with ``inputs(example_inputs)`` merged in, its hyper-parameters
    with ``hyper``."""
    about: str
    error: Type[Exception]
    argument: str
    inputs: Callable[[Dict[str, object]], Dict[str, object]] = lambda x: {}
    hyper: Dict[str, object] = field(default_factory=dict)


OpSample = Tuple[str, tuple]   # (qualified custom op name, its arguments)


@dataclass(frozen=True)
class NativeOp:
    name: str
    functional: Callable
    module: Optional[type]                     # the nn.Module form (None: ``no_module`` says why)
    custom_ops: Tuple[str, ...]                # "fastrank::name", forward and backward ops
    examples: Callable[..., List[Example]]     # (dtype, seed=0, size=(5, 7)) -> examples
    op_samples: Callable[[Example], List[OpSample]]   # each custom op called on an example
    bad_inputs: Tuple[BadInput, ...]
    no_module: str = ""


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _scores(n: int, m: int, dtype: torch.dtype, g: torch.Generator) -> Tensor:
    return torch.randn(n, m, generator=g, dtype=torch.float64).to(dtype)


def _mask(n: int, m: int, g: torch.Generator) -> Tensor:
    mask = torch.rand(n, m, generator=g) < 0.8
    mask[:, 0] = True      # every list keeps at least one entry
    return mask


def _codes(hyper) -> Tuple[int, int]:
    return DIRECTION_CODE[hyper.get("direction", "both")], REDUCTION_CODE[hyper.get("reduction", "mean")]


def _with_grad(x: Tensor) -> Tensor:
    """The forward op's sim for opcheck: a leaf that requires grad (its autograd is checked);
    the backward op's inputs come from a forward on ``sim.detach()``."""
    return x.detach().clone().requires_grad_(True)


def _upstream(loss: Tensor) -> Tensor:
    return torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype).reshape(loss.shape)


_TENSOR_CASES = (
    BadInput("sim is a list", TypeError, "sim", inputs=lambda x: {"sim": x["sim"].tolist()}),
    BadInput("sim is 1-D", ValueError, "sim", inputs=lambda x: {"sim": x["sim"][0]}),
    BadInput("sim holds NaN", ValueError, "sim",
             inputs=lambda x: {"sim": x["sim"].detach().clone().fill_(float("nan"))}),
)
_HYPER_CASES = (
    BadInput("direction is not a direction", ValueError, "direction", hyper={"direction": "up"}),
    BadInput("reduction is not a reduction", ValueError, "reduction", hyper={"reduction": "avg"}),
    BadInput("impl is not an implementation", ValueError, "impl", hyper={"impl": "gpu"}),
)
_MASK_CASES = (
    BadInput("mask of floats", TypeError, "mask", inputs=lambda x: {"mask": x["mask"].float()}),
    BadInput("mask of another shape", ValueError, "mask", inputs=lambda x: {"mask": x["mask"][:, 1:]}),
)
_RELEVANCE_CASES = (
    BadInput("relevance of another shape", ValueError, "relevance",
             inputs=lambda x: {"relevance": x["relevance"][1:]}),
    BadInput("relevance holds NaN", ValueError, "relevance",
             inputs=lambda x: {"relevance": torch.full_like(x["relevance"], float("nan"))}),
)
_POSITIVES_CASES = (
    BadInput("positives of floats", TypeError, "positives", inputs=lambda x: {"positives": x["positives"].float()}),
    BadInput("positives of another shape", ValueError, "positives",
             inputs=lambda x: {"positives": x["positives"][1:]}),
    BadInput("no positives for a non-square sim", ValueError, "positives", inputs=lambda x: {"positives": None}),
)


# ---------------------------------------------------------------- smooth_ndcg
def _graded_examples(both_hyper, one_direction, one_hyper):
    """Examples of a loss on graded relevance: both directions, mean, with a mask (``both_hyper``),
    and ``one_direction`` alone, no reduction, without a mask (``one_hyper``)."""
    def examples(dtype, seed=0, size=(5, 7)):
        g = _gen(seed)
        sim, rel, mask = _scores(*size, dtype, g), torch.rand(*size, generator=g, dtype=dtype), _mask(*size, g)
        return [Example("both, mean, mask", {"sim": sim, "relevance": rel, "mask": mask},
                        {**both_hyper, "direction": "both", "reduction": "mean", "impl": "native"}),
                Example(f"{one_direction}, none", {"sim": sim, "relevance": rel},
                        {**one_hyper, "direction": one_direction, "reduction": "none", "impl": "native"})]
    return examples


def _smooth_ndcg_samples(ex):
    x, h = ex.inputs, ex.hyper
    d, r = _codes(h)
    sim = _with_grad(x["sim"])
    args = (sim, x["relevance"], x.get("mask"), h["tau"], d, r)
    loss, ws = _smooth_ndcg.smooth_ndcg_op(sim.detach(), *args[1:])
    return [("fastrank::smooth_ndcg", args),
            ("fastrank::smooth_ndcg_backward", (_upstream(loss), sim.detach(), x.get("mask"), ws, h["tau"], d, r))]


# ---------------------------------------------------------------- smooth_ap, recall_at_k
def _positives(n, m, g):
    pos = torch.rand(n, m, generator=g) < 0.3
    pos[torch.arange(n), torch.arange(n) % m] = True   # every query has a positive
    return pos


def _subset_examples(head_hyper):
    def examples(dtype, seed=0, size=(5, 7)):
        g = _gen(seed)
        sim, pos, mask = _scores(*size, dtype, g), _positives(*size, g), _mask(*size, g)
        return [Example("both, mean, mask", {"sim": sim, "positives": pos, "mask": mask},
                        {**head_hyper, "tau": 0.3, "direction": "both", "reduction": "mean", "impl": "native"}),
                Example("i2t, none", {"sim": sim, "positives": pos},
                        {**head_hyper, "tau": 0.5, "direction": "i2t", "reduction": "none", "impl": "native"})]
    return examples


def _subset_samples(op_name, op, head_args):
    def samples(ex):
        x, h = ex.inputs, ex.hyper
        d, r = _codes(h)
        sim = _with_grad(x["sim"])
        args = (sim, x["positives"], x.get("mask"), *head_args(h), h["tau"], d, r)
        loss, ws = op(sim.detach(), *args[1:])
        return [(op_name, args),
                ("fastrank::smooth_rank_backward", (_upstream(loss), sim.detach(), x.get("mask"), ws, d, r))]
    return samples


def _recall_head(h):
    ks = _recall_at_k.check_ks(h["ks"])
    return [float(k) for k in ks], [float(t) for t in _recall_at_k.check_tau_k(h["tau_k"], len(ks))]


# ---------------------------------------------------------------- kendall, kendall_sw
def _kendall_samples(ex):
    x, h = ex.inputs, ex.hyper
    d, r = _codes(h)
    sim = _with_grad(x["sim"])
    args = (sim, x["relevance"], x.get("mask"), h["alpha"], d, r)
    loss, dsim, aux = _kendall.kendall_op(sim.detach(), *args[1:])
    return [("fastrank::kendall", args),
            ("fastrank::kendall_backward", (_upstream(loss), dsim, aux, sim.detach(), d, r))]


def _kendall_sw_examples(dtype, seed=0, size=(5, 7)):
    g = _gen(seed)
    sim, rel = _scores(*size, dtype, g), torch.rand(*size, generator=g, dtype=dtype)
    return [Example("both, mean", {"sim": sim, "relevance": rel},
                    {"alpha": 0.1, "beta": 0.2, "label_range": (0.0, 1.0), "direction": "both",
                     "reduction": "mean", "impl": "native"}),
            Example("t2i, none", {"sim": sim, "relevance": rel},
                    {"alpha": 0.2, "beta": 0.1, "label_range": (0.0, 1.0), "direction": "t2i",
                     "reduction": "none", "impl": "native"})]


def _kendall_sw_samples(ex):
    x, h = ex.inputs, ex.hyper
    d, r = _codes(h)
    lo, hi = h["label_range"]
    n_w = _kendall_sw._check_windows(h["alpha"], h["beta"], (lo, hi))
    sim = _with_grad(x["sim"])
    args = (sim, x["relevance"], h["alpha"], h["beta"], hi, n_w, d, r)
    loss, idx, aux = _kendall_sw.kendall_sw_op(sim.detach(), *args[1:])
    return [("fastrank::kendall_sw", args),
            ("fastrank::kendall_sw_backward", (_upstream(loss), sim.detach(), idx, aux, d, r))]


# ---------------------------------------------------------------- fast_rerank, fast_rerank_topk
def _fast_rerank_examples(dtype, seed=0, size=(5, 7)):
    g = _gen(seed)
    sim = _scores(*size, dtype, g)
    return [Example("default", {"sim": sim}, {"gamma": (2.0, 3.0), "lam": (1.5, 2.5), "impl": "native"}),
            Example("transposed", {"sim": sim.t()}, {"gamma": (1.0, 1.0), "lam": (4.0, 0.5), "impl": "native"})]


def _fast_rerank_samples(ex):
    sim = _with_grad(ex.inputs["sim"])
    (g1, g2), (l1, l2) = ex.hyper["gamma"], ex.hyper["lam"]
    i2t, t2i, stats = _fast_rerank.fast_rerank_op(sim.detach(), g1, g2, l1, l2)
    return [("fastrank::fast_rerank", (sim, g1, g2, l1, l2)),
            ("fastrank::fast_rerank_backward", (_upstream(i2t), _upstream(t2i), sim.detach(), stats, g1, g2, l1, l2)),
            ("fastrank::fast_rerank_backward", (None, _upstream(t2i), sim.detach(), stats, g1, g2, l1, l2)),
            ("fastrank::fast_rerank_lse", (sim.detach(), g1, l1))]


def _topk_examples(dtype, seed=0, size=(5, 7)):
    g = _gen(seed)
    img, txt = _scores(size[0], 4, dtype, g), _scores(size[1], 4, dtype, g)
    return [Example("both, tiles of 4", {"img_emb": img, "txt_emb": txt},
                    {"k": 3, "gamma": (2.0, 3.0), "lam": (1.5, 2.5), "block": 4, "direction": "both",
                     "impl": "native"}, grad=()),
            Example("i2t, one tile", {"img_emb": img, "txt_emb": txt},
                    {"k": 20, "gamma": (1.0, 1.0), "lam": (1.0, 1.0), "direction": "i2t", "impl": "native"},
                    grad=())]


def _topk_samples(ex):
    sim = ex.inputs["img_emb"] @ ex.inputs["txt_emb"].t()
    return [("fastrank::fast_rerank_lse", (sim, ex.hyper["gamma"][0], ex.hyper["lam"][0]))]


# ---------------------------------------------------------------- the registry
NATIVE_OPS: Dict[str, NativeOp] = {op.name: op for op in (
    NativeOp("smooth_ndcg", _smooth_ndcg.smooth_ndcg_loss, _smooth_ndcg.SmoothNDCGLoss,
             ("fastrank::smooth_ndcg", "fastrank::smooth_ndcg_backward"),
             _graded_examples({"tau": 0.3}, "t2i", {"tau": 0.5}), _smooth_ndcg_samples,
             _TENSOR_CASES + _RELEVANCE_CASES + _MASK_CASES + _HYPER_CASES + (
                 BadInput("negative relevance", ValueError, "relevance",
                          inputs=lambda x: {"relevance": x["relevance"] - 1}),
                 BadInput("tau = 0", ValueError, "tau", hyper={"tau": 0.0}))),
    NativeOp("smooth_ap", _smooth_ap.smooth_ap_loss, _smooth_ap.SmoothAPLoss,
             ("fastrank::smooth_ap", "fastrank::smooth_rank_backward"),
             _subset_examples({}), _subset_samples("fastrank::smooth_ap", _smooth_ap.smooth_ap_op, lambda h: ()),
             _TENSOR_CASES + _POSITIVES_CASES + _MASK_CASES + _HYPER_CASES + (
                 BadInput("tau < 0", ValueError, "tau", hyper={"tau": -1.0}),)),
    NativeOp("recall_at_k", _recall_at_k.recall_at_k_loss, _recall_at_k.RecallAtKLoss,
             ("fastrank::recall_at_k", "fastrank::smooth_rank_backward"),
             _subset_examples({"ks": (1, 2, 4), "tau_k": (1.0, 0.5, 2.0)}),
             _subset_samples("fastrank::recall_at_k", _recall_at_k.recall_at_k_op, _recall_head),
             _TENSOR_CASES + _POSITIVES_CASES + _MASK_CASES + _HYPER_CASES + (
                 BadInput("tau = 0", ValueError, "tau", hyper={"tau": 0.0}),
                 BadInput("ks holds 0", ValueError, "ks", hyper={"ks": (0, 1), "tau_k": 1.0}),
                 BadInput("ks is empty", ValueError, "ks", hyper={"ks": (), "tau_k": 1.0}),
                 BadInput("ks holds a float", ValueError, "ks", hyper={"ks": (1.5,), "tau_k": 1.0}),
                 BadInput("tau_k of the wrong length", ValueError, "tau_k", hyper={"tau_k": (1.0, 1.0)}),
                 BadInput("tau_k = 0", ValueError, "tau_k", hyper={"tau_k": 0.0}))),
    NativeOp("kendall", _kendall.kendall_loss, _kendall.KendallLoss,
             ("fastrank::kendall", "fastrank::kendall_backward"),
             _graded_examples({"alpha": 0.1}, "i2t", {"alpha": 0.05}), _kendall_samples,
             _TENSOR_CASES + _RELEVANCE_CASES + _MASK_CASES + _HYPER_CASES + (
                 BadInput("alpha < 0", ValueError, "alpha", hyper={"alpha": -0.1}),)),
    NativeOp("kendall_sw", _kendall_sw.kendall_sw_loss, _kendall_sw.KendallSWLoss,
             ("fastrank::kendall_sw", "fastrank::kendall_sw_backward"),
             _kendall_sw_examples, _kendall_sw_samples,
             _TENSOR_CASES + _RELEVANCE_CASES + _HYPER_CASES + (
                 BadInput("relevance outside label_range", ValueError, "relevance",
                          inputs=lambda x: {"relevance": x["relevance"] + 2}),
                 BadInput("alpha < 0", ValueError, "alpha", hyper={"alpha": -0.1}),
                 BadInput("beta = 0", ValueError, "beta", hyper={"beta": 0.0}),
                 BadInput("label_range with lo > hi", ValueError, "label_range", hyper={"label_range": (1.0, 0.0)}))),
    NativeOp("fast_rerank", _fast_rerank.fast_rerank, _fast_rerank.FastRerank,
             ("fastrank::fast_rerank", "fastrank::fast_rerank_backward", "fastrank::fast_rerank_lse"),
             _fast_rerank_examples, _fast_rerank_samples,
             _TENSOR_CASES + (
                 BadInput("impl is not an implementation", ValueError, "impl", hyper={"impl": "gpu"}),
                 BadInput("gamma of one number", ValueError, "gamma", hyper={"gamma": (1.0,)}),
                 BadInput("lam with a zero", ValueError, "lam", hyper={"lam": (0.0, 1.0)}))),
    NativeOp("fast_rerank_topk", _fast_rerank_topk.fast_rerank_topk, None, ("fastrank::fast_rerank_lse",),
             _topk_examples, _topk_samples,
             (BadInput("img_emb is a list", TypeError, "img_emb", inputs=lambda x: {"img_emb": x["img_emb"].tolist()}),
              BadInput("img_emb of integers", TypeError, "img_emb", inputs=lambda x: {"img_emb": x["img_emb"].long()}),
              BadInput("txt_emb of another width", ValueError, "txt_emb",
                       inputs=lambda x: {"txt_emb": x["txt_emb"][:, 1:]}),
              BadInput("txt_emb holds NaN", ValueError, "txt_emb",
                       inputs=lambda x: {"txt_emb": torch.full_like(x["txt_emb"], float("nan"))}),
              BadInput("k = 0", ValueError, "k", hyper={"k": 0}),
              BadInput("block = 0", ValueError, "block", hyper={"block": 0}),
              BadInput("direction is not a direction", ValueError, "direction", hyper={"direction": "up"}),
              BadInput("gamma with a zero", ValueError, "gamma", hyper={"gamma": (0.0, 1.0)})),
             no_module="a retrieval step over embeddings, not a loss: it has no state and no gradient"),
)}

