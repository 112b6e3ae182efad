"""The CUDA test matrix: every CUDA kernel's values and gradients against the reference.

It runs in one of two ways:

- emulated, on the CPU: ``tests/test_emulated.py`` builds the CUDA kernels against the SIMT
  emulator (tests/simt) and runs this folder in a child process with the sanitizers'
  runtime preloaded, ``FASTRANK_SIMT_MODULE`` naming the module. CPU tensors then go
  through the CUDA path of every op (``fastrank._native.emulate_cuda``), and every case
  runs under several thread/block schedules, whose outputs must be bit-identical;
- on a GPU, when there is one (``pytest tests/cuda_matrix``): the same cases on CUDA
  tensors, each run twice (the kernels are deterministic: bit-identical again).

Elsewhere the folder is not collected (tests/conftest.py).
"""
from __future__ import annotations

import pytest
import torch

import fastrank

from _matrix import EMULATED


@pytest.fixture(scope="session")
def device() -> torch.device:
    if EMULATED:
        return torch.device("cpu")
    if fastrank.backends()["cuda_available"]:
        return torch.device("cuda")
    pytest.skip("no CUDA device and no emulated module (tests/test_emulated.py runs this folder emulated)")


@pytest.fixture
def no_finite_check():
    """The CUDA default (no raising value check): NaN must come back in the results."""
    from fastrank import _validation as V
    V.set_check_finite(False)
    yield
    V.set_check_finite(None)
