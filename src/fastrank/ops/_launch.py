"""Calling a native kernel: the one place where an op's tensors become a kernel call.

The extension modules take the fields of a kernel's parameter struct (csrc/include/fastrank/
<op>.h, one struct for both backends) as positional values in declaration order
(csrc/bindings/fill.h): raw pointers (``data_ptr()``), sizes, element strides,
hyper-parameters, the dtype code first and, for CUDA, the current stream last. An op declares
each kernel it calls with the names of the fields it fills, ``FORWARD = kernel(name, "lists
sim ...")`` (checked against the struct's own names, which the modules export, when it is
declared), and calls ``FORWARD(x, *values)``: ``call(name, x, *values)``, which picks the module
for x's device (``fastrank._C_cpu`` or ``fastrank._C_cuda``; under
``fastrank._native.emulate_cuda``, the emulated CUDA module for CPU tensors) and adds the dtype
code and the stream. The values are the same on every backend; ``cuda_kernels(x)`` tells an op
what that module reads: CUDA kernels read half precision directly, take relevance in its own
dtype and need the device workspaces the op allocates (0 for the CPU), so an emulated run gets
exactly the buffers the CUDA path allocates.
"""
from __future__ import annotations

import functools

import torch

from .._native import (DIRECTION_CODE, DTYPE_CODE, REDUCTION_CODE, acc_dtype, cpu_module, cuda_module,
                       declare_fields, emulated_cuda, stream_of)

# the raw cudaStream_t of the current stream, read without building a Stream object
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# This file runs on every call: it asks a tensor `is_cuda` / `is_cpu` (70 ns) rather than
# `device.type` (0.3 us: a new string each time), and its stride() once (0.1 us, not 0.18
# per stride(i)).
_HALF = (torch.float16, torch.bfloat16)


def cuda_kernels(x: torch.Tensor) -> bool:
    """Whether x's native kernels are CUDA kernels (a CUDA tensor, or a CPU tensor while an
    emulated CUDA module is set)."""
    return x.is_cuda or (x.is_cpu and emulated_cuda() is not None)


def kernel_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a kernel reads x in: CPU kernels take float32/float64 (half inputs are
    upcast), CUDA kernels take all four float dtypes."""
    dtype = x.dtype
    return torch.float32 if dtype in _HALF and not cuda_kernels(x) else dtype


def kernel_input(x: torch.Tensor) -> torch.Tensor:
    """x as its kernels read it: itself, or (half precision for the CPU kernels) a float32 copy."""
    kd = kernel_dtype(x)
    return x if kd == x.dtype else x.to(kd)


def kernel_relevance(sim: torch.Tensor, relevance: torch.Tensor) -> torch.Tensor:
    """relevance as the Kendall kernels read it (sim in its kernel dtype): in sim's dtype or
    the accumulation dtype, any other float dtype converted to the accumulation dtype."""
    acc = acc_dtype(sim.dtype)
    return relevance if relevance.dtype == sim.dtype or relevance.dtype == acc else relevance.to(acc)


def module_for(x: torch.Tensor):
    if x.is_cuda:
        mod = cuda_module()
    else:
        mod = emulated_cuda() or cpu_module()
    if mod is None:  # the functional forms check this first; reaching here is a bug
        raise RuntimeError(f"fastrank: no native module for device {x.device}")
    return mod


def mat(x: torch.Tensor):
    """(pointer, row stride, column stride) of a 2-D tensor, strides in elements."""
    s0, s1 = x.stride()
    return x.data_ptr(), s0, s1


def call(name: str, like: torch.Tensor, *args):
    """Run kernel ``name`` of the module for like's device with the dtype code of like, on
    like's device and its current CUDA stream; returns what the kernel entry returns."""
    code = DTYPE_CODE[like.dtype]
    if like.is_cuda:
        dev = like.device
        fn = getattr(cuda_module(), name)
        if _raw_stream is not None and dev.index == torch.cuda.current_device():
            return fn(code, *args, _raw_stream(dev.index))
        with torch.cuda.device(dev):
            return fn(code, *args, stream_of(like))
    emulated = emulated_cuda()
    if emulated is not None:
        return getattr(emulated, name)(code, *args, 0)  # the emulator runs every launch at once
    return getattr(cpu_module(), name)(code, *args)


def kernel(name: str, fields: str):
    """The call of kernel ``name`` whose parameter struct the caller fills with ``fields`` (their
    names, in order, space-separated; the dtype code and the stream are added by ``call``):
    ``kernel(name, fields)(x, *values) = call(name, x, *values)``. Raises TypeError now unless
    they are the struct's fields (every native module loaded; an emulated one when it is set)."""
    declare_fields(name, tuple(fields.split()))
    return functools.partial(call, name)


NO_LISTS = (0, 0, 0) * 2


def lists_args(lists, dtype: torch.dtype):
    """(the kernel's two ListsIn: rows, then columns, each offsets, index and values pointers;
    the value tensors they point into, in ``dtype``, to keep alive for the call) of a
    relevance given as lists (docs/spec.md §2.1b; :func:`relevance_lists`)."""
    values = [v if v.dtype == dtype else v.to(dtype) for v in (lists[2], lists[5])]
    return (lists[0].data_ptr(), lists[1].data_ptr(), values[0].data_ptr(),
            lists[3].data_ptr(), lists[4].data_ptr(), values[1].data_ptr()), values


def relevance_args(sim: torch.Tensor, relevance, lists):
    """A graded loss's relevance as its kernels read it (sim in its kernel dtype): (the dtype
    code, the matrix's (pointer, s0, s1), the two ListsIn, what to keep alive for the call), from
    the (N, M) matrix ``relevance`` or, when it is None, from ``lists`` (:func:`relevance_lists`),
    which no backend turns into a matrix. The values are in sim's dtype or the accumulation
    dtype (:func:`kernel_relevance`; on the CPU the two are the same)."""
    if relevance is None:
        acc = acc_dtype(sim.dtype)
        dtype = lists[2].dtype if lists[2].dtype in (sim.dtype, acc) else acc
        ptrs, held = lists_args(lists, dtype)
        return DTYPE_CODE[dtype], (0, 0, 0), ptrs, held
    r = kernel_relevance(sim, relevance)
    return DTYPE_CODE[r.dtype], mat(r), NO_LISTS, r


def relevance_lists(relevance, direction: str, columns: bool = True) -> list:
    """A :class:`fastrank.TopKRelevance` as an op takes it: the rows' and the columns' (offsets,
    index, values) in turn, values detached. The rows' are views of its (N, k) tensors (row q's
    entries at positions q * k .. q * k + k - 1), made here, where they are used; the columns'
    are ``TopKRelevance.column_lists``. The rows' stand in for the columns' (never read) where
    the direction is i2t alone, or where the kernels make the columns' themselves (``columns``
    false: the CPU kernels, by a counting pass over the rows', O(nnz + M),
    csrc/cpu/relevance_lists.h)."""
    indices, values = relevance.indices, relevance.values.detach()
    n, k = indices.shape
    offsets = torch.arange(0, n * k + 1, k, dtype=torch.int64, device=indices.device) if k > 0 else \
        torch.zeros(n + 1, dtype=torch.int64, device=indices.device)
    rows = (offsets, indices.reshape(-1), values.reshape(-1))
    cols = relevance.detach().column_lists() if columns and direction != "i2t" else rows
    return [*rows, *cols]


def graded_relevance(sim: torch.Tensor, relevance, direction: str) -> tuple:
    """(matrix, lists) of a graded op's relevance as its fill takes them: a matrix as it is with no
    lists, or a :class:`fastrank.TopKRelevance` as None and its :func:`relevance_lists` (the
    columns' made here only for the CUDA kernels)."""
    if isinstance(relevance, torch.Tensor):
        return relevance, []
    return None, relevance_lists(relevance, direction, cuda_kernels(sim))


def dense_from_lists(lists, n: int, m: int) -> torch.Tensor:
    """The (n, m) relevance matrix of an op's row lists, for the one kernel that reads the
    matrix only (smooth-NDCG's CUDA version 1, ``fastrank.kernel_variant(version=1)``)."""
    from ..topk import Lists
    return Lists(*lists[0:3]).dense(0, n, m, lists[2].dtype)


def mask_args(mask):
    """(pointer, row stride, column stride) of an optional bool mask; (0, 0, 0) for None.
    The kernels read a bool as one byte (0 or 1)."""
    if mask is None:
        return 0, 0, 0
    s0, s1 = mask.stride()
    return mask.data_ptr(), s0, s1


__all__ = ["acc_dtype", "cuda_kernels", "kernel_dtype", "kernel_input", "kernel_relevance", "mat", "call", "kernel",
           "module_for", "mask_args",
           "lists_args", "relevance_args", "relevance_lists", "graded_relevance", "dense_from_lists", "NO_LISTS", "DIRECTION_CODE", "REDUCTION_CODE"]
