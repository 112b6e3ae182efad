"""``nn.Module`` forms of every fastrank loss: each holds its hyper-parameters and
calls the functional form (``fastrank.<name>``) in ``forward``. Each class is defined
next to its functional form; this package gathers them."""
from ..ops.smooth_ndcg import SmoothNDCGLoss
from ..ops.smooth_ap import SmoothAPLoss
from ..ops.recall_at_k import RecallAtKLoss
from ..ops.kendall import KendallLoss
from ..ops.kendall_sw import KendallSWLoss
from ..ops.fast_rerank import FastRerank
from ..losses.triplet import TripletLoss
from ..losses.ladder import LadderLoss
from ..losses.topk import TopKLoss
from ..losses.dvse import VarianceWeightedLoss, OrthogonalLoss
from .combined import CombinedLoss

# the module forms of the table of losses (src/fastrank/ops/registry.py), written out for
# static analysis (the API pages); tests/test_contract.py holds the two equal
__all__ = [
    "SmoothNDCGLoss", "SmoothAPLoss", "RecallAtKLoss", "KendallLoss", "KendallSWLoss", "FastRerank",
    "TripletLoss", "LadderLoss", "TopKLoss", "VarianceWeightedLoss", "OrthogonalLoss", "CombinedLoss",
]
