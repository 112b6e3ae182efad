"""The CUDA test matrix's shared checks, and the SIMT emulator's controls.

The matrix is every CUDA kernel's values and gradients against the reference: the tests
marked ``cuda_matrix`` at the end of each op's tests/test_<op>.py. They run in one of two ways:

- emulated, on the CPU: tests/test_emulated.py builds the CUDA kernels against the SIMT
  emulator (tests/simt) and runs the files the table's rows name (``cuda_matrix``,
  src/fastrank/ops/registry.py) with ``-m cuda_matrix`` in child processes, the sanitizers'
  runtime preloaded and ``FASTRANK_SIMT_MODULE`` naming the module. Importing this module
  then loads that module and reroutes the CUDA path of every op onto CPU tensors
  (``fastrank._native.emulate_cuda``); every case runs under several thread/block
  schedules, whose outputs must be bit-identical;
- on a GPU, in the same session as the other tests: the same cases on CUDA tensors, each run
  twice (the kernels are deterministic: bit-identical again).

With neither, tests/conftest.py deselects them. Without ``FASTRANK_SIMT_MODULE`` importing
this module loads nothing emulated.

A loss case is ``loss_fn(s, r, direction, reduction, mask)`` with impl="native" on the target
device and the same call with impl="reference" on float64 CPU tensors. ``check_loss``
compares values and the gradient of a weighted sum of the per-query losses (or of the
reduced loss), under every schedule.
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

import fastrank
from fastrank import _native
from fastrank._tolerance import TOLERANCE, low_precision_bound

MODULE = os.environ.get("FASTRANK_SIMT_MODULE")
EMULATED = bool(MODULE)

# (order, seed, poison byte of shared memory): forward, reversed, shuffled. Two schedules
# whose outputs differ expose a race or a read of memory no thread wrote. Every case runs
# under the first two (reversing swaps every pair of threads and blocks); the cases of
# every direction and reduction under all three.
SCHEDULES = [(0, 0, 0xFF), (1, 0, 0x7F), (2, 12345, 0x00)]

_lib = None
if EMULATED:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "simt"))
    import build as simt_build  # noqa: E402

    _module = simt_build.load(Path(MODULE))
    _lib = ctypes.CDLL(MODULE)  # the same loaded module: its control functions
    _native.emulate_cuda(_module)


def configure(order: int = 0, seed: int = 0, poison: int = 0xFF, dry_run: bool = False) -> None:
    if _lib is not None:
        _lib.simt_configure(order, ctypes.c_ulonglong(seed), poison, int(dry_run))


def launch_log() -> list:
    """The emulator's record of the launches since the last clear: (kernel name, grid, block)."""
    if _lib is None:
        return []
    out = []
    buf = ctypes.create_string_buffer(4096)
    for i in range(_lib.simt_log_size()):
        _lib.simt_log_entry(i, buf, len(buf))
        name, grid, block, _ = buf.value.decode().split(" ")
        out.append((name, tuple(int(x) for x in grid[5:].split(",")), tuple(int(x) for x in block[6:].split(","))))
    return out


def clear_launch_log() -> None:
    if _lib is not None:
        _lib.simt_log_clear()


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        return t.detach().cpu().contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t.detach().cpu()


def _flatten(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if out is None:
        return []
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flatten(o)]
    raise TypeError(f"a case must return tensors, got {type(out).__name__}")


def each_schedule(fn, schedules=None):
    """fn() under every schedule (on a GPU: twice). Asserts that all runs give bit-identical
    tensors and returns the first run's."""
    runs = schedules if schedules is not None else SCHEDULES[:2]
    results = []
    try:
        for order, seed, poison in runs:
            configure(order, seed, poison)
            results.append([t.detach().clone() for t in _flatten(fn())])
    finally:
        configure()
    first = results[0]
    for k, other in enumerate(results[1:], start=1):
        assert len(other) == len(first)
        for i, (a, b) in enumerate(zip(first, other)):
            assert a.shape == b.shape and a.dtype == b.dtype
            same = torch.equal(_bits(a), _bits(b))
            assert same, (f"output {i} differs between schedule {runs[0]} and {runs[k]} "
                          f"(a race, or a read of memory no thread wrote): max |diff| = "
                          f"{(a.double() - b.double()).abs().nan_to_num(float('inf')).max().item()}")
    return first



DIRECTIONS = ("i2t", "t2i", "both")
REDUCTIONS = ("none", "mean", "sum")
TOL = TOLERANCE  # the rule of the matrix and of `fastrank check` (src/fastrank/_tolerance.py)


def case(n: int, m: int, seed: int, ties: bool = False, scale: float = 1.0, levels: int = 0):
    """sim (n, m) float64 and relevance in [0, 1] (graded; `levels` > 0: that many values)."""
    g = torch.Generator().manual_seed(seed)
    sim = torch.randn(n, m, generator=g, dtype=torch.float64) * scale
    rel = torch.rand(n, m, generator=g, dtype=torch.float64)
    if ties:
        sim = (sim * 2).round() / 2
    if levels:
        rel = (rel * (levels - 1)).round() / (levels - 1)
    return sim, rel


def layout(x: torch.Tensor, how: str, device) -> torch.Tensor:
    """x (n, m) on device with the same values in another memory layout."""
    if how == "contiguous":
        return x.to(device).contiguous()
    if how == "transposed":  # a (n, m) view of an (m, n) contiguous tensor
        return x.t().contiguous().to(device).t()
    if how == "strided":  # every other column of a wider tensor
        wide = torch.zeros(x.shape[0], 2 * x.shape[1], dtype=x.dtype).to(device)
        wide[:, ::2] = x.to(device)
        return wide[:, ::2]
    raise ValueError(how)


def n_queries(n: int, m: int, direction: str) -> int:
    return n * (direction != "t2i") + m * (direction != "i2t")


def weights(n: int, m: int, direction: str, reduction: str, seed: int = 0) -> torch.Tensor:
    k = n_queries(n, m, direction) if reduction == "none" else 1
    w = torch.rand(k, generator=torch.Generator().manual_seed(seed + 7), dtype=torch.float64) + 0.5
    return w if reduction == "none" else w[0]


def run_case(loss_fn: Callable, sim, rel, direction, reduction, mask=None, *, dtype, device,
             grad_layout: str = "contiguous", schedules=None):
    """(loss, d(w . loss)/d sim) of loss_fn on the device, with sim cast to dtype. The
    upstream gradient w reaches the backward contiguous, expanded (stride 0) or strided."""
    n, m = sim.shape
    w = weights(n, m, direction, reduction).to(device)

    r = rel.to(device)
    mk = None if mask is None else mask.to(device)

    def once():
        same = sim.dtype == dtype and sim.device == device  # keep the caller's memory layout
        s = (sim.detach() if same else sim.detach().to(device=device, dtype=dtype)).requires_grad_(True)
        loss = loss_fn(s, r, direction, reduction, mk)
        if grad_layout == "expanded":  # d sum(loss) / d loss: ones with stride 0
            upstream = torch.ones((), dtype=loss.dtype, device=device).expand(loss.shape)
        elif grad_layout == "strided" and loss.dim() == 1:
            wide = torch.zeros(2 * loss.shape[0], dtype=loss.dtype, device=device)
            wide[::2] = w.to(loss.dtype)
            upstream = wide[::2]
        else:
            upstream = w.to(loss.dtype).expand(loss.shape).contiguous() if loss.dim() else w.to(loss.dtype)
        (grad,) = torch.autograd.grad(loss, s, grad_outputs=upstream)
        return loss.detach(), grad

    return each_schedule(once, schedules)


def reference_case(ref_fn: Callable, sim, rel, direction, reduction, mask=None, *, grad_layout="contiguous"):
    n, m = sim.shape
    w = weights(n, m, direction, reduction)
    s = sim.detach().double().cpu().requires_grad_(True)
    r = rel.double().cpu() if rel.is_floating_point() else rel.cpu()  # labels, or bool positives
    loss = ref_fn(s, r, direction, reduction, None if mask is None else mask.cpu())
    if grad_layout == "expanded":
        upstream = torch.ones_like(loss)
    else:
        upstream = w.expand(loss.shape) if loss.dim() else w
    (grad,) = torch.autograd.grad(loss, s, grad_outputs=upstream)
    return loss.detach(), grad


def check_loss(loss_fn, ref_fn, sim, rel, direction, reduction, mask=None, *, dtype, device,
               grad_layout="contiguous", tol: Optional[dict] = None, schedules=None):
    got = run_case(loss_fn, sim, rel, direction, reduction, mask, dtype=dtype, device=device,
                   grad_layout=grad_layout, schedules=schedules)
    want = reference_case(ref_fn, sim.to(dtype), rel, direction, reduction, mask, grad_layout=grad_layout)
    tol = tol or TOL[dtype]
    torch.testing.assert_close(got[0].double().cpu(), want[0], **tol)
    torch.testing.assert_close(got[1].double().cpu(), want[1], **tol)
    assert got[1].dtype == dtype and got[1].shape == sim.shape
    return got


def low_precision_errors(loss_fn, ref_fn, sim, rel, dtype, device):
    """(kernel error, error of the reference run in dtype), both against the float64
    reference on the same rounded input: the rule is kernel <= 2 x reference
    (low_precision_bound, src/fastrank/_tolerance.py)."""
    rounded = sim.to(dtype).double()
    want = reference_case(ref_fn, rounded, rel, "both", "none")
    got = run_case(loss_fn, rounded, rel, "both", "none", dtype=dtype, device=device)
    s = rounded.to(dtype).requires_grad_(True)
    lp = ref_fn(s, rel.to(dtype) if rel.is_floating_point() else rel, "both", "none", None)
    (g,) = torch.autograd.grad(lp, s, grad_outputs=weights(*sim.shape, "both", "none").to(lp.dtype))
    kern = max((got[0].double().cpu() - want[0]).abs().max().item(), (got[1].double().cpu() - want[1]).abs().max().item())
    ref = max((lp.detach().double() - want[0]).abs().max().item(), (g.double() - want[1]).abs().max().item())
    return kern, ref


def check_nonfinite_propagates(loss_fn, sim, rel, device, directions=DIRECTIONS) -> None:
    """docs/spec.md §1 with the value check off (the CUDA default): a loss over an input with a NaN
    or inf comes back non-finite, and so does its gradient."""
    for direction in directions:
        s = sim.to(device).requires_grad_(True)
        loss = loss_fn(s, rel.to(device), direction, "mean", None)
        loss.backward()
        assert not torch.isfinite(loss).all() and not torch.isfinite(s.grad).all(), direction


def dry_run_launches(call) -> list:
    """The launches (kernel, grid, block) of call() with the emulator checking their shapes
    against the hardware's limits without running them."""
    clear_launch_log()
    configure(dry_run=True)
    try:
        call()
    finally:
        configure()
    return launch_log()


def launches(call) -> list:
    """The names of the kernels call() launches, in order."""
    clear_launch_log()
    call()
    return [k for k, _, _ in launch_log()]


class GradedLossCases:
    """The CUDA matrix cases every loss over (sim, graded relevance) shares: smooth-NDCG,
    Kendall and Kendall SW-HS. An op's test file subclasses it as ``TestGradedLossMatrix``
    with its ``native`` and ``reference`` calls (``loss_fn(s, r, direction, reduction, mask)``,
    as staticmethods), the relevance ``levels`` of its cases (0: continuous) and whether it
    takes a ``mask``."""
    pytestmark = [pytest.mark.cuda_matrix]
    native: Callable
    reference: Callable
    levels = 0
    masks = True

    @pytest.mark.parametrize("how", ["transposed", "strided"])
    def test_transposed_and_strided_inputs(self, device, how):
        sim, rel = case(18, 23, seed=4, levels=self.levels)
        s, r = layout(sim, how, device), layout(rel, how, device)
        if not self.masks:
            check_loss(self.native, self.reference, s, r, "both", "none", dtype=torch.float64, device=device)
            return
        mask = torch.rand(18, 23, generator=torch.Generator().manual_seed(4)) > 0.3
        mk = layout(mask, how, device)
        for reduction in ("none", "mean"):
            check_loss(self.native, self.reference, s, r, "both", reduction, mk, dtype=torch.float64, device=device)

    @pytest.mark.parametrize("grad_layout", ["expanded", "strided"])
    def test_strided_grad_output(self, device, grad_layout):
        sim, rel = case(17, 20, seed=5, levels=self.levels)
        check_loss(self.native, self.reference, sim, rel, "both", "none", dtype=torch.float64, device=device,
                   grad_layout=grad_layout)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_half_precision_error_bound(self, device, dtype):
        sim, rel = case(24, 20, seed=7, levels=self.levels)
        kern, ref = low_precision_errors(self.native, self.reference, sim, rel, dtype, device)
        assert kern <= low_precision_bound(ref), (kern, ref)

    @pytest.mark.parametrize("bad", [float("nan"), float("inf")])
    @pytest.mark.parametrize("where", ["sim", "relevance"])
    def test_nonfinite_propagates(self, device, no_finite_check, bad, where):
        sim, rel = case(9, 11, seed=9)
        (sim if where == "sim" else rel)[2, 3] = bad
        check_nonfinite_propagates(self.native, sim, rel, device)


def sparse_relevance_case(n: int, m: int, seed: int, k: int = 3, ties: bool = False, masked: bool = False):
    """(sim, relevance, mask or None), float64: at most k nonzero relevances a row, with (n > 2)
    row 1 all zero and row 2 all nonzero; ``ties``: tied scores and relevances; ``masked``: a
    mask with an empty row and an empty column where the shape allows."""
    g = torch.Generator().manual_seed(seed)
    sim = torch.randn(n, m, generator=g, dtype=torch.float64)
    rel = torch.zeros(n, m, dtype=torch.float64)
    for i in range(n):
        cols = torch.randperm(m, generator=g)[:min(k, m)]
        rel[i, cols] = torch.rand(len(cols), generator=g, dtype=torch.float64) + 0.05
    if ties:
        sim = (sim * 2).round() / 2
        rel = (rel * 3).ceil() / 3
    if n > 2:
        rel[1] = 0.0
        rel[2] = torch.rand(m, generator=g, dtype=torch.float64) + 0.1
    mask = None
    if masked:
        mask = torch.rand(n, m, generator=g) < 0.8
        if n > 3 and m > 3:
            mask[3] = False
            mask[:, 1] = False
    return sim, rel, mask


def forced(path: str, fn: Callable) -> Callable:
    """fn with the graded kernels' pass forced for every list ("dense", "sparse" or "auto")."""
    def call(*args):
        with fastrank.kernel_variant(pair_pass=path):
            return fn(*args)
    return call


class SparseRelevanceCases:
    """The CUDA matrix cases of the graded losses whose kernels read top-k relevance lists and
    take a sparse pass per list (smooth-NDCG version 2, Kendall; docs/spec.md §2.1b): the
    relevance given as the (N, M) matrix or as a :class:`fastrank.TopKRelevance` (never made
    into a matrix), each list on the dense pass or the sparse one (forced, and auto), gives the
    dense pass's values to 1e-12 in float64. An op's test file subclasses it as
    ``TestSparseRelevanceMatrix`` with its ``native`` and ``reference`` calls
    (``loss_fn(s, r, direction, reduction, mask)``; r a matrix or a TopKRelevance)."""
    pytestmark = [pytest.mark.cuda_matrix]
    native: Callable
    reference: Callable

    def _forms_agree(self, sim, rel, mask, direction, reduction, device, dtype=torch.float64, schedules=None):
        import fastrank
        top = fastrank.TopKRelevance.from_dense(rel, rel.shape[1])  # every nonzero entry: the matrix exactly
        assert torch.equal(top.to_dense(), rel)
        want = check_loss(forced("dense", self.native), self.reference, sim, rel, direction, reduction, mask,
                          dtype=dtype, device=device, schedules=schedules)
        reference = reference_case(self.reference, sim.to(dtype), rel, direction, reduction, mask)
        for path in ("dense", "sparse", "auto"):
            for form, r in (("matrix", rel), ("lists", top)):
                if path == "dense" and form == "matrix":
                    continue
                got = run_case(forced(path, self.native), sim, r, direction, reduction, mask, dtype=dtype,
                               device=device, schedules=schedules)
                # float64: the dense pass's values; float32: the reference's, within the dense pass's tolerance
                ref = want if dtype == torch.float64 else reference
                tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else TOL[dtype]
                for i in range(2):
                    torch.testing.assert_close(got[i].double(), ref[i].double(), **tol,
                                               msg=lambda s, p=path, f=form: f"{p} pass, {f}: {s}")

    @pytest.mark.parametrize("n,m", [(1, 1), (1, 19), (19, 1), (9, 40), (40, 9)])
    def test_lists_and_sparse_pass_equal_the_dense_pass(self, device, n, m):
        """Masks (an empty list each way), ties, all-zero and all-nonzero lists, both directions."""
        for seed, (ties, masked) in enumerate([(False, False), (True, True)]):
            sim, rel, mask = sparse_relevance_case(n, m, seed=n * 100 + m + seed, ties=ties, masked=masked)
            self._forms_agree(sim, rel, mask, "both", "none", device)

    @pytest.mark.parametrize("direction,reduction", [("i2t", "none"), ("t2i", "mean"), ("both", "sum")])
    def test_each_direction_and_reduction(self, device, direction, reduction):
        sim, rel, mask = sparse_relevance_case(12, 20, seed=21, ties=True, masked=True)
        self._forms_agree(sim, rel, mask, direction, reduction, device, schedules=SCHEDULES)

    def test_float32(self, device):
        sim, rel, mask = sparse_relevance_case(14, 30, seed=22, masked=True)
        self._forms_agree(sim, rel, mask, "both", "none", device, dtype=torch.float32)

    def test_long_lists_many_nonzero(self, device):
        """Lists longer than a block's threads (and than Kendall's 1024-candidate chunk), 40
        nonzero items a list (ten groups of the sparse pass's rows)."""
        sim, rel, _ = sparse_relevance_case(2, 1100, seed=23, k=40)
        self._forms_agree(sim, rel, None, "i2t", "none", device)
        sim, rel, _ = sparse_relevance_case(300, 2, seed=24, k=1)
        self._forms_agree(sim, rel, None, "t2i", "none", device)

    def test_half_scores_with_float32_lists(self, device):
        """bfloat16 scores, float32 relevance: the lists are read in the accumulation type, as
        the matrix is (the same values, bit for bit, whichever pass)."""
        import fastrank
        sim, rel, _ = sparse_relevance_case(10, 24, seed=25)
        s, r = sim.to(torch.bfloat16).to(device), rel.float()
        top = fastrank.TopKRelevance.from_dense(r, 24).to(device)
        for path in ("dense", "sparse"):
            a = each_schedule(lambda: forced(path, self.native)(s, r.to(device), "both", "none", None))[0]
            b = each_schedule(lambda: forced(path, self.native)(s, top, "both", "none", None))[0]
            assert a.dtype == torch.float32 and torch.equal(a, b), path

    @pytest.mark.parametrize("where", ["zero-relevance item", "nonzero-relevance item"])
    def test_nonfinite_score_propagates_on_the_sparse_pass(self, device, no_finite_check, where):
        import fastrank
        sim, rel, _ = sparse_relevance_case(4, 30, seed=26, k=2)
        j = int((rel[0] == 0).nonzero()[0]) if where == "zero-relevance item" else int((rel[0] != 0).nonzero()[0])
        sim[0, j] = float("nan")
        top = fastrank.TopKRelevance.from_dense(rel, 30).to(device)
        s = sim.to(device).requires_grad_(True)
        loss = forced("sparse", self.native)(s, top, "i2t", "none", None)
        (grad,) = torch.autograd.grad(loss.sum(), s)
        assert torch.isnan(loss[0]) and torch.isfinite(loss[1:]).all()
        assert torch.isnan(grad[0]).any() and torch.isfinite(grad[1:]).all()
