"""fast_rerank: Python -> one fused forward + one fused backward (docs/spec.md §3, DVSE Eq. 13-15).

One call = one forward kernel entry and, under autograd, one backward kernel entry:

- ``fastrank::fast_rerank`` (``_forward``) computes the column log-sum-exp of gamma1 * sim
  and the row log-sum-exp of lam1 * sim in one read of sim, then writes both score
  matrices in one more sweep, in sim's dtype (CUDA reads and writes half precision
  directly; the CPU kernels take float32/float64). It also returns ``stats`` = (col_lse (M),
  row_lse (N)) in the accumulation dtype, all the backward needs besides sim.
- ``fastrank::fast_rerank_backward`` (``_backward``) writes d loss / d sim: one sweep for
  the column sums of G1 and row sums of G2, one sweep writing the gradient
  (csrc/cpu/fast_rerank.cpp, csrc/cuda/fast_rerank.cu; CUDA: 3 launches per pass, the same
  at every size).

Eager calls go through an autograd.Function calling the kernels directly (the cheapest
path); torch.compile traces the custom ops (fake + autograd registered), both made by
src/fastrank/ops/_native_op.py from ``_forward`` / ``_backward``, so they compute the same thing. Memory: the two outputs, the
O(N + M) statistics and an O(N + M) workspace; nothing else (N, M)-sized.

Non-finite sim (docs/spec.md §1): the kernels propagate NaN/inf into the scores and the
gradient. The raising check reads only the statistics: on CPU the kernel reports whether
they are finite (no extra pass, no extra op); on CUDA the check is off by default (no
host sync, capturable in a CUDA graph) and ``FASTRANK_CHECK_FINITE=1`` turns it on.

``fastrank::fast_rerank_lse`` is the statistics sweep alone, used by
:func:`fastrank.fast_rerank_topk`.

Gradient (G1 = dL/d i2t, G2 = dL/d t2i, P = softmax over each column of gamma1 * sim,
Q = softmax over each row of lam1 * sim):
    dL/d sim = gamma2 G1 - gamma1 P * colsum(G1) + lam2 G2 - lam1 Q * rowsum(G2).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _validation as V
from .._native import acc_dtype, has_native
from ..reference.fast_rerank import fast_rerank as fast_rerank_reference
from ._floor import PASSES
from ._launch import cuda_kernels, kernel, kernel_input, mat, module_for
from ._module import ModuleForm
from ._native_op import NativeOp
from . import _contract as C
from ._row import Loss


# the fields of FastRerankLse / FastRerankForward / FastRerankBackward (fast_rerank.h), in order
_LSE = kernel("fast_rerank_lse", "dt n m sim g1 l1 workspace col_lse row_lse")
_FORWARD = kernel("fast_rerank_forward", "dt n m sim g1 g2 l1 l2 workspace col_lse row_lse i2t t2i")
_BACKWARD = kernel("fast_rerank_backward", "dt n m sim g_i2t g_t2i col_lse row_lse g1 g2 l1 l2 workspace grad")


def _run(run, x: Tensor, *args) -> Optional[bool]:
    """Run a kernel's call (``_launch.kernel``) for x. Returns the CPU kernels' "statistics
    finite" flag, or None from CUDA kernels (asynchronous: the flag is unknown)."""
    ok = run(x, *args)
    return None if cuda_kernels(x) else bool(ok)


def _workspace(x: Tensor, n: int, m: int, acc: torch.dtype) -> Optional[Tensor]:
    """Partial statistics of the kernels over a fixed grid of bands: O(N + M) values. CUDA:
    allocated here by torch (stream-ordered, capturable); CPU: None, the kernel allocates
    its own for the call (one allocation and size query less per pass)."""
    if not cuda_kernels(x):
        return None
    return torch.empty((int(module_for(x).fast_rerank_workspace(n, m)),), dtype=acc, device=x.device)


def _ptr(t: Optional[Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _forward(sim: Tensor, g1: float, g2: float, l1: float, l2: float):
    """(i2t, t2i, stats, finite): the two (N, M) score matrices in sim's dtype, stats =
    (col_lse (M), row_lse (N)) concatenated in the accumulation dtype, and (CPU) whether the
    statistics are all finite."""
    x = kernel_input(sim)
    n, m = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    i2t = torch.empty((n, m), dtype=x.dtype, device=x.device)
    t2i = torch.empty((n, m), dtype=x.dtype, device=x.device)
    stats = torch.empty((m + n,), dtype=acc, device=x.device)
    ws = _workspace(x, n, m, acc)  # held in a variable: it must outlive the call
    sp = stats.data_ptr()
    ok = _run(_FORWARD, x, n, m, *mat(x), g1, g2, l1, l2,
              _ptr(ws), sp, sp + m * stats.element_size(), i2t.data_ptr(), t2i.data_ptr())
    if x is not sim:  # CPU half precision
        i2t, t2i = i2t.to(sim.dtype), t2i.to(sim.dtype)
    return i2t, t2i, stats, ok


def _grad_args(g: Optional[Tensor], dtype: torch.dtype):
    """(tensor kept alive, pointer, row stride, column stride); pointer 0 = zero gradient.
    Any strides (expanded gradients of .sum() have stride 0)."""
    if g is None:
        return None, 0, 0, 0
    if g.dtype != dtype:
        g = g.to(dtype)
    return g, g.data_ptr(), g.stride(0), g.stride(1)


def _backward(grad_i2t: Optional[Tensor], grad_t2i: Optional[Tensor], sim: Tensor, stats: Tensor,
              g1: float, g2: float, l1: float, l2: float) -> Tensor:
    """d (sum(grad_i2t * i2t) + sum(grad_t2i * t2i)) / d sim, contiguous, in sim's dtype.
    A None gradient counts as zero."""
    x = kernel_input(sim)
    n, m = x.shape
    k1, p1, s1r, s1c = _grad_args(grad_i2t, x.dtype)
    k2, p2, s2r, s2c = _grad_args(grad_t2i, x.dtype)
    grad = torch.empty((n, m), dtype=x.dtype, device=x.device)
    ws = _workspace(x, n, m, stats.dtype)
    sp = stats.data_ptr()
    _run(_BACKWARD, x, n, m, *mat(x), p1, s1r, s1c, p2, s2r, s2c,
         sp, sp + m * stats.element_size(), g1, g2, l1, l2, _ptr(ws), grad.data_ptr())
    del k1, k2, ws
    return grad if x is sim else grad.to(sim.dtype)


def check_statistics(*stats: Tensor, ok: Optional[bool] = None, sim_name: str = "sim") -> None:
    """docs/spec.md §1: raise on a non-finite sim where the per-device rule asks for it, from its
    O(N + M) log-sum-exp statistics (a NaN or +-inf in sim, or gamma1 * sim, lam1 * sim
    overflowing, makes them non-finite). ok: the CPU kernel's own flag where there is one
    (no extra work); otherwise, and always on CUDA (only with FASTRANK_CHECK_FINITE=1 or
    set_check_finite(True)), the statistics are read: a host sync there. ``sim_name``: what
    the user passed that sim comes from (fast_rerank_topk: the embeddings' product)."""
    if not V.check_finite_enabled(stats[0].device):
        return
    if ok is None:
        ok = all(V.all_finite(x) for x in stats)
    if not ok:
        raise ValueError(f"{sim_name} contains NaN or infinite values (or gamma[0] * {sim_name} or "
                         f"lam[0] * {sim_name} overflows the dtype)")


def _fake_forward(sim, g1, g2, l1, l2):
    n, m = sim.shape
    return sim.new_empty((n, m)), sim.new_empty((n, m)), sim.new_empty((m + n,), dtype=acc_dtype(sim.dtype))


def _check_forward(result) -> None:
    """Eagerly, after the forward: the statistics are finite (False: raise if checking; None,
    from CUDA kernels: read them if checking)."""
    if result[3] is not True:
        check_statistics(result[2], ok=result[3])


# fastrank::fast_rerank -> (i2t, t2i, stats), fastrank::fast_rerank_backward, the eager
# Function and the switch between them: src/fastrank/ops/_native_op.py. The finite check runs
# on the eager path (the compiled one keeps no host-side flag).
FAST_RERANK = NativeOp("fast_rerank", _forward, ("i2t", "t2i", "stats"), _fake_forward, _backward, public=2,
                       after=_check_forward, in_sim_dtype=True)
fast_rerank_op = FAST_RERANK.op
fast_rerank_backward_op = FAST_RERANK.backward.op


def floor(mode: str, size: dict, itemsize: int) -> dict:
    """The benchmarks' floor (src/fastrank/ops/_floor.py): memory-bound, read sim once and write
    the two (N, M) outputs (backward: read the two output gradients and sim, write the
    gradient); 2 N*M exps per pass."""
    nm = size["n"] * size["m"]
    elems = {"forward": 3, "backward": 4, "forward+backward": 7}[mode]
    return {"bytes": elems * nm * itemsize, "exp": 2 * PASSES[mode] * nm}


# ---- the statistics alone (fast_rerank_topk) -------------------------------------------------
@torch.library.custom_op("fastrank::fast_rerank_lse", mutates_args=())
def fast_rerank_lse(sim: Tensor, gamma1: float, lam1: float) -> tuple[Tensor, Tensor]:
    """sim (N, M) any strides. Returns (col_lse (M,), row_lse (N,)) in the accumulation
    dtype: col_lse[j] = logsumexp_l(gamma1 * sim[l, j]), row_lse[i] = logsumexp_l(lam1 * sim[i, l])."""
    x = kernel_input(sim)
    acc = acc_dtype(x.dtype)
    n, m = x.shape
    col_lse = x.new_empty((m,), dtype=acc)
    row_lse = x.new_empty((n,), dtype=acc)
    ws = _workspace(x, n, m, acc)
    _run(_LSE, x, n, m, *mat(x), float(gamma1), float(lam1), _ptr(ws), col_lse.data_ptr(),
         row_lse.data_ptr())
    return col_lse, row_lse


@fast_rerank_lse.register_fake
def _(sim, gamma1, lam1):
    acc = acc_dtype(sim.dtype)
    return sim.new_empty((sim.shape[1],), dtype=acc), sim.new_empty((sim.shape[0],), dtype=acc)


# ---- public API ---------------------------------------------------------------------------------
_HYPER: dict = {}  # (gamma, lam) tuples of plain floats already checked -> ((g1, g2), (l1, l2))


def _check_hyper(gamma, lam):
    """(gamma, lam) as pairs of floats, or the error that names the bad one. Memoised for tuples
    of plain floats (the functional's usual call): its per-call check stays metadata-only and
    cheap."""
    plain = (type(gamma) is tuple and type(lam) is tuple and len(gamma) == 2 and len(lam) == 2
             and type(gamma[0]) is float and type(gamma[1]) is float and type(lam[0]) is float
             and type(lam[1]) is float)
    if plain:
        hit = _HYPER.get((gamma, lam))
        if hit is not None:
            return hit
    checked = V.check_pair(gamma, "gamma"), V.check_pair(lam, "lam")
    if plain and len(_HYPER) < 64:
        _HYPER[(gamma, lam)] = checked
    return checked


def fast_rerank(sim: Tensor, gamma: Tuple[float, float] = (25.0, 25.0), lam: Tuple[float, float] = (20.0, 20.0),
                impl: str = "auto") -> Tuple[Tensor, Tensor]:
    """Fast re-ranking of a similarity matrix (docs/spec.md §3; DVSE, Eq. 13-15), in log space.

    Args:
        sim: (N, M) scores, row i = image i, column j = caption j.
        gamma: (gamma1, gamma2) > 0 of the i2t scores (each column normalised).
        lam: (lam1, lam2) > 0 of the t2i scores (each row normalised).
        impl: "auto", "native" or "reference".

    Returns:
        (i2t_scores, t2i_scores), both (N, M) in sim's dtype:
        i2t_scores[i, j] = gamma2 * sim[i, j] - logsumexp_l(gamma1 * sim[l, j]) ranks the
        captions j of image i; t2i_scores[i, j] = lam2 * sim[i, j] - logsumexp_l(lam1 * sim[i, l])
        ranks the images i of caption j. exp() of them are the paper's matrices.
        Differentiable with respect to sim.

    Non-finite sim (docs/spec.md §1): ValueError on CPU by default; on CUDA no check by default
    (no host sync, CUDA-graph capturable), and NaN/inf come back in the scores and the
    gradient. The native path is one fused forward and one fused backward per call; peak
    memory is the two outputs + O(N + M).
    """
    return _fast_rerank(_check_hyper, sim, gamma, lam, impl)


def _fast_rerank(check_hyper, sim, gamma, lam, impl):
    """fast_rerank with its hyper-parameters checked by ``check_hyper``: the op's own, or, for its
    module form, none (the module checked them when they were set)."""
    V.check_tensor(sim, "sim", 2, finite=False)
    (g1, g2), (l1, l2) = check_hyper(gamma, lam)
    impl = V.check_impl(impl)
    if not has_native(sim.device, impl, "fast_rerank"):
        V.check_sim(sim)
        i2t, t2i = fast_rerank_reference(sim.to(acc_dtype(sim.dtype)), (g1, g2), (l1, l2))
        return i2t.to(sim.dtype), t2i.to(sim.dtype)
    return FAST_RERANK(sim, g1, g2, l1, l2)


class FastRerank(ModuleForm, functional=fast_rerank, inputs=("sim",), check=_check_hyper, checked=_fast_rerank):
    """Module form of :func:`fastrank.fast_rerank`: ``i2t, t2i = FastRerank()(sim)``."""


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
def _examples(dtype, seed=0, size=(5, 7)):
    g = C.gen(seed)
    sim = C.scores(*size, dtype, g)
    return [C.Example("default", {"sim": sim}, {"gamma": (2.0, 3.0), "lam": (1.5, 2.5), "impl": "native"}),
            C.Example("transposed", {"sim": sim.t()}, {"gamma": (1.0, 1.0), "lam": (4.0, 0.5), "impl": "native"})]


def _op_args(x, h):
    return (x["sim"], *h["gamma"], *h["lam"])


def _more_samples(ex):
    """The backward op with one gradient None (counted as zero), and the statistics op."""
    sim = ex.inputs["sim"].detach()
    (g1, g2), (l1, l2) = ex.hyper["gamma"], ex.hyper["lam"]
    _, t2i, stats = fast_rerank_op(sim, g1, g2, l1, l2)
    return [("fastrank::fast_rerank_backward", (None, C.upstream(t2i), sim, stats, g1, g2, l1, l2)),
            ("fastrank::fast_rerank_lse", (sim, g1, l1))]


CONTRACT = C.glue_contract(
    FAST_RERANK, _op_args, _examples,
    C.TENSOR_CASES + (
        C.BadInput("impl is not an implementation", ValueError, "impl", hyper={"impl": "gpu"}),
        C.BadInput("gamma of one number", ValueError, "gamma", hyper={"gamma": (1.0,)}),
        C.BadInput("lam with a zero", ValueError, "lam", hyper={"lam": (0.0, 1.0)})),
    extra=_more_samples, extra_ops=("fastrank::fast_rerank_lse",))


# ---------------------------------------------------------------- its row of the table of losses (registry.py)
ROWS = (Loss("fast_rerank", fast_rerank, FastRerank, CONTRACT, combined=False, floor=floor),)
