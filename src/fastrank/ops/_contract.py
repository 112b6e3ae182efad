"""What tests/test_contract.py runs on every native op, and the pieces ops share to say it.

Each op's declaration (src/fastrank/ops/<op>.py) ends with its :class:`Contract`: a factory of
example inputs, the forward custom op's arguments for an example (the contract calls each
custom op on them, through :meth:`fastrank.ops._native_op.NativeOp.samples`), and bad inputs
with the error they must raise, and its row of the table of ops (``ROWS``) carries it to
src/fastrank/ops/registry.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple, Type

import torch
from torch import Tensor

from ..topk import TopKRelevance
from ._launch import DIRECTION_CODE, REDUCTION_CODE, graded_relevance

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


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def scores(n: int, m: int, dtype: torch.dtype, g: torch.Generator) -> Tensor:
    return torch.randn(n, m, generator=g, dtype=torch.float64).to(dtype)


def random_mask(n: int, m: int, g: torch.Generator) -> Tensor:
    mask = torch.rand(n, m, generator=g) < 0.8
    mask[:, 0] = True      # every list keeps at least one entry
    return mask


def codes(hyper) -> Tuple[int, int]:
    return DIRECTION_CODE[hyper.get("direction", "both")], REDUCTION_CODE[hyper.get("reduction", "mean")]


def upstream(loss: Tensor) -> Tensor:
    return torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype).reshape(loss.shape)


TENSOR_CASES = (
    BadInput("sim is a list", TypeError, "sim", inputs=lambda x: {"sim": x["sim"].tolist()}),
    BadInput("sim is 1-D", ValueError, "sim", inputs=lambda x: {"sim": x["sim"][0]}),
    BadInput("sim holds NaN", ValueError, "sim",
             inputs=lambda x: {"sim": x["sim"].detach().clone().fill_(float("nan"))}),
)
HYPER_CASES = (
    BadInput("direction is not a direction", ValueError, "direction", hyper={"direction": "up"}),
    BadInput("reduction is not a reduction", ValueError, "reduction", hyper={"reduction": "avg"}),
    BadInput("impl is not an implementation", ValueError, "impl", hyper={"impl": "gpu"}),
)
MASK_CASES = (
    BadInput("mask of floats", TypeError, "mask", inputs=lambda x: {"mask": x["mask"].float()}),
    BadInput("mask of another shape", ValueError, "mask", inputs=lambda x: {"mask": x["mask"][:, 1:]}),
)
RELEVANCE_CASES = (
    BadInput("relevance of another shape", ValueError, "relevance",
             inputs=lambda x: {"relevance": x["relevance"][1:]}),
    BadInput("relevance holds NaN", ValueError, "relevance",
             inputs=lambda x: {"relevance": torch.full_like(x["relevance"], float("nan"))}),
)
POSITIVES_CASES = (
    BadInput("positives of floats", TypeError, "positives", inputs=lambda x: {"positives": x["positives"].float()}),
    BadInput("positives of another shape", ValueError, "positives",
             inputs=lambda x: {"positives": x["positives"][1:]}),
    BadInput("no positives for a non-square sim", ValueError, "positives", inputs=lambda x: {"positives": None}),
)


#: entries of each list in a contract example's TopKRelevance
TOPK = 3


def graded_examples(both_hyper, one_direction, one_hyper):
    """Examples of a loss on graded relevance: both directions, mean, with a mask (``both_hyper``);
    ``one_direction`` alone, no reduction, without a mask (``one_hyper``); and the first again with
    the relevance as a :class:`fastrank.TopKRelevance` of each row's TOPK best entries (the sparse
    lists the kernels read without the matrix)."""
    def examples(dtype, seed=0, size=(5, 7)):
        g = gen(seed)
        sim, rel, mask = scores(*size, dtype, g), torch.rand(*size, generator=g, dtype=dtype), random_mask(*size, g)
        both = {**both_hyper, "direction": "both", "reduction": "mean", "impl": "native"}
        return [Example("both, mean, mask", {"sim": sim, "relevance": rel, "mask": mask}, both),
                Example(f"{one_direction}, none", {"sim": sim, "relevance": rel},
                        {**one_hyper, "direction": one_direction, "reduction": "none", "impl": "native"}),
                Example(f"both, mean, mask, top-{TOPK} lists",
                        {"sim": sim, "relevance": TopKRelevance.from_dense(rel, min(TOPK, size[1])), "mask": mask},
                        both)]
    return examples


def graded(inputs: Dict[str, object], hyper: Dict[str, object]) -> tuple:
    """(relevance matrix or None, mask, lists): a graded op's fill arguments for an example's
    relevance, a matrix or a TopKRelevance, as the op's public function passes them."""
    rel, lists = graded_relevance(inputs["sim"], inputs["relevance"], hyper.get("direction", "both"))
    return rel, inputs.get("mask"), lists


def random_positives(n, m, g):
    pos = torch.rand(n, m, generator=g) < 0.3
    pos[torch.arange(n), torch.arange(n) % m] = True   # every query has a positive
    return pos


def subset_examples(head_hyper):
    def examples(dtype, seed=0, size=(5, 7)):
        g = gen(seed)
        sim, pos, mask = scores(*size, dtype, g), random_positives(*size, g), random_mask(*size, g)
        return [Example("both, mean, mask", {"sim": sim, "positives": pos, "mask": mask},
                        {**head_hyper, "tau": 0.3, "direction": "both", "reduction": "mean", "impl": "native"}),
                Example("i2t, none", {"sim": sim, "positives": pos},
                        {**head_hyper, "tau": 0.5, "direction": "i2t", "reduction": "none", "impl": "native"})]
    return examples


OpSample = Tuple[str, tuple]   # (qualified custom op name, its arguments)


@dataclass(frozen=True)
class Contract:
    """An op's part of the contract: ``examples(dtype, seed=0, size=(5, 7))``, the calls of its
    custom ops on an example (``op_samples``) and its bad inputs."""
    custom_ops: Tuple[str, ...]                # "fastrank::name", forward and backward ops
    examples: Callable[..., List[Example]]
    op_samples: Callable[[Example], List[OpSample]]
    bad_inputs: Tuple[BadInput, ...]


def glue_contract(op, op_args: Callable[[Dict[str, object], Dict[str, object]], tuple], examples,
                  bad_inputs: Tuple[BadInput, ...], extra: Optional[Callable[[Example], List[OpSample]]] = None,
                  extra_ops: Tuple[str, ...] = ()) -> Contract:
    """The contract of an op declared through the glue (a NativeOp): its forward and backward
    custom ops called on ``op_args(inputs, hyper)`` of each example, and ``extra`` samples
    (of its custom ops ``extra_ops`` too)."""
    def samples(ex):
        out = op.samples(op_args(ex.inputs, ex.hyper), upstream)
        return out + (extra(ex) if extra else [])
    names = (op.name, op.backward.name) + tuple(extra_ops)
    return Contract(names, examples, samples, bad_inputs)
