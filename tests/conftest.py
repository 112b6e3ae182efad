"""Test-session setup shared by every test file.

The CUDA test matrix (tests/_cuda_matrix.py) is the tests marked ``cuda_matrix`` at the end of
each op's tests/test_<op>.py. They run on a GPU, in the same session as the other tests, or
emulated on the CPU in the child processes that tests/test_emulated.py starts with
``FASTRANK_SIMT_MODULE`` set; with neither they are deselected (one count in the summary, not a
skip per case).
"""
import pytest
import torch

import fastrank
from _cuda_matrix import EMULATED

CUDA_MATRIX_RUNS = EMULATED or fastrank.backends()["cuda_available"]


def pytest_collection_modifyitems(config, items):
    """Deselects the tests marked cuda_matrix where neither a GPU nor the emulated module can run them."""
    if CUDA_MATRIX_RUNS:
        return
    matrix = [item for item in items if item.get_closest_marker("cuda_matrix")]
    if matrix:
        config.hook.pytest_deselected(items=matrix)
        items[:] = [item for item in items if not item.get_closest_marker("cuda_matrix")]


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The CUDA test matrix's device: CPU tensors when emulated (they take the CUDA path), else
    the GPU."""
    if EMULATED:
        return torch.device("cpu")
    if fastrank.backends()["cuda_available"]:
        return torch.device("cuda")
    pytest.skip("no CUDA device and no emulated module (tests/test_emulated.py runs the matrix emulated)")


@pytest.fixture
def no_finite_check():
    """The CUDA default (no raising value check): NaN must come back in the results."""
    from fastrank import _validation as V
    V.set_check_finite(False)
    yield
    V.set_check_finite(None)


@pytest.fixture(scope="session")
def open_clip():
    """open_clip's own loss.py (its ClipLoss, SigLipLoss), for the parity tests; skipped when
    open_clip_torch is not installed."""
    from fastrank.compat.open_clip import original_loss_module
    mod = original_loss_module()
    if mod is None:
        pytest.skip("open_clip_torch is not installed (pip install --no-deps open_clip_torch)")
    return mod
