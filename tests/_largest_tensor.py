"""LargestTensor: the largest tensor any op makes while it is active (a TorchDispatchMode), for
tests that a computation in blocks never holds the whole matrix."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargestTensor(TorchDispatchMode):
    """``with LargestTensor() as seen: ...`` then ``seen.numel``: the most elements of a tensor
    any op produced inside the block."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out
