"""``nn.Module`` forms of every fastrank loss: each holds its hyper-parameters and
calls the functional form (``fastrank.<name>``) in ``forward``. Each class is defined
next to its functional form; this package gathers them from the table of losses
(src/fastrank/ops/registry.py), with :class:`CombinedLoss`, which sums them."""
from ..ops.registry import LOSSES as _LOSSES
from .combined import CombinedLoss

_MODULES = {row.module.__name__: row.module for row in _LOSSES.values() if row.module is not None}
globals().update(_MODULES)
__all__ = list(_MODULES)
__all__ += ["CombinedLoss"]
