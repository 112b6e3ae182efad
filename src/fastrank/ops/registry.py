"""The table of fastrank's losses and ops: one row each, read by everything that lists them.

A row names the functional form (``fastrank.<functional>``), the ``nn.Module`` form
(``fastrank.nn.<Module>``), and, for an op with native kernels (docs/spec.md §2, §3), its
part of the contract (src/fastrank/ops/_contract.py: example inputs, the calls of its
``torch.library`` custom ops, bad inputs), declared in the op's own file next to its glue.

Read from here: ``fastrank.__all__`` and ``fastrank.nn.__all__``; :class:`fastrank.nn.CombinedLoss`'s
names (``combined``); the compat tables (``compat``: fastrank.compat.open_clip,
fastrank.compat.sentence_transformers); the benchmarks' ops (benchmarks/ops.py); the
emulated CUDA matrix's files (``cuda_matrix``, tests/test_emulated.py); and
tests/test_contract.py, which runs one contract over every native row (:data:`NATIVE_OPS`)
and fails on a custom op under ``fastrank::`` that no row lists, so a new op cannot skip it
(CONTRIBUTING.md, "Adding an op").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from ..losses import dvse as _dvse
from ..losses import ladder as _ladder
from ..losses import topk as _topk
from ..losses import triplet as _triplet
from . import fast_rerank as _fast_rerank
from . import fast_rerank_topk as _fast_rerank_topk
from . import kendall as _kendall
from . import kendall_sw as _kendall_sw
from . import recall_at_k as _recall_at_k
from . import smooth_ap as _smooth_ap
from . import smooth_ndcg as _smooth_ndcg
from . import _smooth_rank
from ._contract import BadInput, Contract, Example, OpSample

__all__ = ["Loss", "LOSSES", "NATIVE_OPS", "Example", "BadInput", "OpSample"]


@dataclass(frozen=True)
class Loss:
    """One row of the table.

    name: the spec name (CombinedLoss's ``"name:weight"``, the benchmarks, the compat tables).
    functional, module: the two public forms (module None: ``no_module`` says why).
    contract: an op with native kernels: what tests/test_contract.py runs on it.
    combined: a term of CombinedLoss (takes ``sim`` first, returns a loss).
    compat: the compat tables it is a listwise term of: ``"open_clip"`` (graded relevance and
        a mask, ClipLoss's ``listwise=``), ``"sentence_transformers"`` (InBatchListwiseLoss).
    cuda_matrix: for a native row whose cases of the CUDA test matrix are not in its own
        tests/test_<name>.py, the file of tests/ that holds them (:attr:`matrix_file`).
    floor: an op with native kernels: the work no implementation of it avoids, declared with
        its glue (src/fastrank/ops/_floor.py); the benchmarks measure against it.
    """
    name: str
    functional: Callable
    module: Optional[type]
    contract: Optional[Contract] = None
    combined: bool = True
    compat: Tuple[str, ...] = ()
    cuda_matrix: str = ""
    no_module: str = ""
    floor: Optional[Callable[[str, dict, int], dict]] = None

    @property
    def matrix_file(self) -> str:
        """The file of tests/ with the row's CUDA test matrix cases (the tests marked
        ``cuda_matrix``, run emulated by tests/test_emulated.py)."""
        return self.cuda_matrix or f"test_{self.name}.py"

    # the contract's view of a native row (tests/test_contract.py)
    @property
    def custom_ops(self) -> Tuple[str, ...]:
        return self.contract.custom_ops

    @property
    def examples(self):
        return self.contract.examples

    @property
    def op_samples(self):
        return self.contract.op_samples

    @property
    def bad_inputs(self) -> Tuple[BadInput, ...]:
        return self.contract.bad_inputs


# CombinedLoss lists its names in this order
LOSSES: Dict[str, Loss] = {row.name: row for row in (
    Loss("triplet", _triplet.triplet_loss, _triplet.TripletLoss),
    Loss("smooth_ndcg", _smooth_ndcg.smooth_ndcg_loss, _smooth_ndcg.SmoothNDCGLoss, _smooth_ndcg.CONTRACT,
         floor=_smooth_ndcg.floor, compat=("open_clip", "sentence_transformers")),
    Loss("smooth_ap", _smooth_ap.smooth_ap_loss, _smooth_ap.SmoothAPLoss, _smooth_ap.CONTRACT,
         floor=_smooth_rank.floor, compat=("sentence_transformers",)),
    Loss("recall_at_k", _recall_at_k.recall_at_k_loss, _recall_at_k.RecallAtKLoss, _recall_at_k.CONTRACT,
         floor=_smooth_rank.floor, cuda_matrix="test_smooth_ap.py"),
    Loss("kendall", _kendall.kendall_loss, _kendall.KendallLoss, _kendall.CONTRACT, floor=_kendall.floor, compat=("open_clip",)),
    Loss("kendall_sw", _kendall_sw.kendall_sw_loss, _kendall_sw.KendallSWLoss, _kendall_sw.CONTRACT,
         floor=_kendall_sw.floor, compat=("sentence_transformers",)),
    Loss("ladder", _ladder.ladder_loss, _ladder.LadderLoss),
    Loss("topk", _topk.topk_loss, _topk.TopKLoss),
    Loss("fast_rerank", _fast_rerank.fast_rerank, _fast_rerank.FastRerank, _fast_rerank.CONTRACT, combined=False,
         floor=_fast_rerank.floor),
    Loss("fast_rerank_topk", _fast_rerank_topk.fast_rerank_topk, None, _fast_rerank_topk.CONTRACT, combined=False,
         no_module="a retrieval step over embeddings, not a loss: it has no state and no gradient"),
    Loss("variance_weighted", _dvse.variance_weighted_loss, _dvse.VarianceWeightedLoss, combined=False),
    Loss("orthogonal", _dvse.orthogonal_loss, _dvse.OrthogonalLoss, combined=False),
)}

#: the rows with native kernels, each run through tests/test_contract.py
NATIVE_OPS: Dict[str, Loss] = {name: row for name, row in LOSSES.items() if row.contract is not None}


def functional_names() -> Tuple[str, ...]:
    """The public functions of the table, in its order (``fastrank.__all__``)."""
    return tuple(row.functional.__name__ for row in LOSSES.values())


def module_names() -> Tuple[str, ...]:
    """The module forms of the table, in its order (``fastrank.nn.__all__``)."""
    return tuple(row.module.__name__ for row in LOSSES.values() if row.module is not None)


def compat_losses(table: str) -> Dict[str, Loss]:
    """The rows that are listwise terms of the compat table ``table``, by name."""
    return {name: row for name, row in LOSSES.items() if table in row.compat}
