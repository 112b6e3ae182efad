"""Calling a native kernel from a torch custom op.

The extension modules take raw pointers (``data_ptr()``), sizes, element strides and,
for CUDA, the current stream; this module turns tensors into those arguments, so each
op file only says which kernel to call with which tensors.
"""
from __future__ import annotations

import torch

from .._native import DTYPE_CODE, acc_dtype, cpu_module, cuda_module, stream_of


def kernel_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a kernel reads x in: CPU kernels take float32/float64 (half inputs are
    upcast), CUDA kernels take all four float dtypes."""
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return x.dtype


def module_for(x: torch.Tensor):
    mod = cpu_module() if x.device.type == "cpu" else cuda_module()
    if mod is None:  # the functional forms check this first; reaching here is a bug
        raise RuntimeError(f"fastrank: no native module for device {x.device}")
    return mod


def mat(x: torch.Tensor):
    """(pointer, row stride, column stride) of a 2-D tensor, strides in elements."""
    return x.data_ptr(), x.stride(0), x.stride(1)


def call(name: str, like: torch.Tensor, *args) -> None:
    """Run kernel ``name`` of the module for like's device, on like's device and its
    current CUDA stream, with the dtype code of like."""
    mod = module_for(like)
    code = DTYPE_CODE[like.dtype]
    fn = getattr(mod, name)
    if like.device.type == "cuda":
        with torch.cuda.device(like.device):
            fn(code, *args, stream_of(like))
    else:
        fn(code, *args)


# Codes passed to the fused kernels (one call computes every requested direction and
# the reduction; csrc/include/fastrank/common.h: Direction, Reduction).
DIRECTION_CODE = {"i2t": 1, "t2i": 2, "both": 3}
REDUCTION_CODE = {"none": 0, "mean": 1, "sum": 2}


def mask_args(mask):
    """(pointer, row stride, column stride) of an optional bool mask; (0, 0, 0) for None.
    The kernels read a bool as one byte (0 or 1)."""
    if mask is None:
        return 0, 0, 0
    return mask.data_ptr(), mask.stride(0), mask.stride(1)


def apply(function, op, *args):
    """Run a native loss: ``function.apply(*args)`` (a ``torch.autograd.Function``, the
    cheapest eager path) outside torch.compile, ``op(*args)`` (the ``torch.library``
    custom op with its registered fake and autograd, which dynamo traces) inside it.
    Both call the same kernel wrappers, so they compute the same thing."""
    if torch.compiler.is_compiling():
        return op(*args)
    return function.apply(*args)


__all__ = ["acc_dtype", "kernel_dtype", "mat", "call", "mask_args", "apply", "DIRECTION_CODE",
           "REDUCTION_CODE"]
