"""The package imports, reports its backends, and its binaries do not link libtorch."""
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

import fastrank
from fastrank import _native

pytestmark = pytest.mark.wheel
REQUIRE_NATIVE = os.environ.get("FASTRANK_REQUIRE_NATIVE") == "1"


def test_backends_keys():
    b = fastrank.backends()
    for key in ("cpu", "cuda_built", "cuda_available", "version"):
        assert key in b
    assert b["version"] == fastrank.__version__
    if not b["cuda_built"]:
        assert b["cuda_available"] is False


@pytest.mark.skipif(not REQUIRE_NATIVE, reason="set FASTRANK_REQUIRE_NATIVE=1 to require the native build")
def test_native_modules_built():
    b = fastrank.backends()
    assert b["cpu"], b
    if shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"):
        assert b["cuda_built"], b


@pytest.mark.skipif(not shutil.which("ldd"), reason="no ldd")
def test_binaries_do_not_link_libtorch():
    mods = [m for m in (_native.cpu_module(), _native.cuda_module()) if m is not None]
    if not mods:
        pytest.skip("no native module built")
    for m in mods:
        out = subprocess.run(["ldd", m.__file__], capture_output=True, text=True).stdout
        assert "libtorch" not in out and "libc10" not in out, out
        if "_C_cuda" in m.__file__:
            assert "libcudart" not in out, "the CUDA runtime must be linked statically:\n" + out


def test_cuda_module_reports_no_device_cleanly():
    mod = _native.cuda_module()
    if mod is None:
        pytest.skip("CUDA module not built")
    n = mod.device_count()
    assert isinstance(n, int) and n >= 0
    if not torch.cuda.is_available():
        assert fastrank.backends()["cuda_available"] is False


def test_info_command():
    out = subprocess.run([sys.executable, "-m", "fastrank", "info"], capture_output=True, text=True,
                         check=True).stdout
    assert "cuda_built" in out and "torch" in out


def test_missing_native_module_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(_native, "_modules", {})
    monkeypatch.setattr(_native, "_errors", {"_C_cpu": "ImportError: simulated"})
    monkeypatch.setattr(_native, "_warned", set())
    sim, rel = torch.rand(3, 3), torch.rand(3, 3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = fastrank.smooth_ndcg_loss(sim, rel)
        b = fastrank.smooth_ndcg_loss(sim, rel)
    msgs = [str(x.message) for x in w if "native module" in str(x.message)]
    assert len(msgs) == 1 and "simulated" in msgs[0]
    torch.testing.assert_close(a, b)
    with pytest.raises(RuntimeError, match="native"):
        fastrank.smooth_ndcg_loss(sim, rel, impl="native")
