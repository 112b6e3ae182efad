"""fastrank: ranking losses for image-text retrieval with fused C++/CUDA kernels.

Functional losses live at the top level (``fastrank.smooth_ndcg_loss``), their
``nn.Module`` forms in ``fastrank.nn``. See docs/spec.md for the contract.
"""
from ._version import __version__
from ._native import backends

# native ops (fused C++/CUDA kernels, pure-PyTorch reference via impl="reference")
from .ops.smooth_ndcg import smooth_ndcg_loss
from .ops.smooth_ap import smooth_ap_loss
from .ops.recall_at_k import recall_at_k_loss
from .ops.kendall import kendall_loss
from .ops.kendall_sw import kendall_sw_loss
from .ops.fast_rerank import fast_rerank
from .ops.fast_rerank_topk import fast_rerank_topk

# vectorised PyTorch losses
from .losses.triplet import triplet_loss
from .losses.ladder import ladder_loss
from .losses.topk import topk_loss
from .losses.dvse import variance_weighted_loss, orthogonal_loss

from . import nn  # noqa: E402  (module forms)

_LAZY_SUBMODULES = ("metrics", "relevance", "models", "data", "train", "distributed", "compat", "memory")


def __getattr__(name):
    """fastrank.metrics, .relevance, .models, .data, .train, .distributed, .compat, .memory
    are imported on first use, so `import fastrank` stays fast (sentence-transformers is heavy)."""
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'fastrank' has no attribute {name!r}")


# the functional forms of the table of losses (src/fastrank/ops/registry.py), written out for
# static analysis (the API pages); tests/test_contract.py holds the two equal
__all__ = [
    "__version__", "backends", "nn",
    "smooth_ndcg_loss", "smooth_ap_loss", "recall_at_k_loss", "kendall_loss", "kendall_sw_loss",
    "fast_rerank", "fast_rerank_topk",
    "triplet_loss", "ladder_loss", "topk_loss", "variance_weighted_loss", "orthogonal_loss",
]
