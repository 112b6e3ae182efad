"""One row of the table of losses (src/fastrank/ops/registry.py): a loss or op as everything
that lists them reads it. Each module of fastrank.ops and fastrank.losses declares its rows
next to what they name, as ``ROWS``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from ._contract import BadInput, Contract


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
