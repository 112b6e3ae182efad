"""fastrank: ranking losses for image-text retrieval with fused C++/CUDA kernels.

Functional losses live at the top level (``fastrank.smooth_ndcg_loss``), their
``nn.Module`` forms in ``fastrank.nn``. See docs/spec.md for the contract.
"""
from ._version import __version__
from ._native import KernelVariant, backends, kernel_variant
from . import nn
from .ops.registry import LOSSES as _LOSSES
from .topk import TopKRelevance

# the functional form of every row of the table of losses (src/fastrank/ops/registry.py):
# native ops (fused C++/CUDA kernels, the pure-PyTorch reference with impl="reference") and
# the vectorised PyTorch losses, in the table's order
_FUNCTIONALS = {row.functional.__name__: row.functional for row in _LOSSES.values()}
globals().update(_FUNCTIONALS)
__all__ = ["__version__", "backends", "kernel_variant", "KernelVariant", "nn", "TopKRelevance"]
__all__ += list(_FUNCTIONALS)

_LAZY_SUBMODULES = ("metrics", "relevance", "models", "data", "train", "distributed", "compat", "memory")


def __getattr__(name):
    """fastrank.metrics, .relevance, .models, .data, .train, .distributed, .compat, .memory
    are imported on first use, so `import fastrank` stays fast (sentence-transformers is heavy)."""
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'fastrank' has no attribute {name!r}")
