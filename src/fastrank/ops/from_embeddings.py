"""The smooth-rank losses straight from the embeddings (docs/spec.md §2.11): smooth-NDCG on a
TopKRelevance, Smooth-AP and the Recall@k surrogate on the positives' indices, equal to the loss
of ``q @ d.T`` to rounding and never holding that (n, m) matrix or its gradient.

Python -> two custom ops (``fastrank::ranking_from_embeddings`` and its backward,
src/fastrank/ops/_blockwise.py) -> per block of queries a matmul and the row loss's own kernels
(csrc/cpu/smooth_ndcg.cpp, smooth_ap.cpp, recall_at_k.cpp and their CUDA twins; smooth-NDCG's
sparse path included). The op reduces the per-query losses itself, as every op does (docs/spec.md
§1): "mean" over every query for smooth-NDCG, over the queries with a positive for Smooth-AP and
Recall@k.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from .. import _validation as V
from .._native import acc_dtype, has_native
from ..topk import TopKRelevance
from . import _contract as C
from . import recall_at_k as RK
from . import smooth_ap as SA
from . import smooth_ndcg as SN
from ._blockwise import ranking_from_embeddings
from ._launch import DIRECTION_CODE, REDUCTION_CODE, relevance_lists
from ._module import ModuleForm
from ._row import Loss


# ---------------------------------------------------------------- shared checks and the call
def _check_embeddings(q, d) -> None:
    V.check_embedding_pair(q, "q", d, "d", same_dtype=True)


def _check_values(q: Tensor, d: Tensor, relevance: Optional[TopKRelevance], loss: str) -> None:
    """The value checks (docs/spec.md §1: where the check is on, CPU by default): q and d, and
    the relevance's (smooth-NDCG) or the positives' indices and values."""
    if not V.check_finite_enabled(q.device):
        return
    V.check_finite(q, "q")
    V.check_finite(d, "d")
    if relevance is None:
        return
    if loss == "smooth_ndcg":
        V.check_topk_values(relevance, minimum=0.0, loss=loss)
    else:
        V.check_topk_values(relevance, names=("positives", "positives"))


def _check_block(block) -> Optional[int]:
    """block: None (as many queries as keep a block near 4M similarities) or an int >= 1."""
    return None if block is None else V.check_int(block, "block")


def _check_smooth_ndcg_hyper(tau, direction, reduction, block):
    """smooth_ndcg_loss_from_embeddings's hyper-parameters as it uses them (smooth_ndcg_loss's,
    then block), or the error that names the bad one."""
    return (*SN._check_hyper(tau, direction, reduction), _check_block(block))


def _check_smooth_ap_hyper(tau, direction, reduction, block):
    """smooth_ap_loss_from_embeddings's hyper-parameters as it uses them (smooth_ap_loss's, then
    block), or the error that names the bad one."""
    return (*SA._check_hyper(tau, direction, reduction), _check_block(block))


def _check_recall_at_k_hyper(ks, tau, tau_k, direction, reduction, block):
    """recall_at_k_loss_from_embeddings's hyper-parameters as it uses them (recall_at_k_loss's,
    then block), or the error that names the bad one."""
    return (*RK._check_hyper(ks, tau, tau_k, direction, reduction), _check_block(block))


def _positive_lists(positives, q: Tensor, d: Tensor) -> TopKRelevance:
    """The positives as a TopKRelevance of ones: None = the diagonal (needs as many queries as
    documents), else an int64 (n, k) tensor of each query's positive documents (-1: unused)."""
    n, m = q.shape[0], d.shape[0]
    if positives is None:
        if n != m:
            raise ValueError(f"positives=None means the diagonal, which needs as many queries as documents; got "
                             f"q of {n} rows and d of {m}: pass positives as an int64 (n, k) tensor of indices")
        positives = torch.arange(n, device=q.device).unsqueeze(1)
    if not isinstance(positives, Tensor) or positives.dtype != torch.int64:
        raise TypeError(f"positives must be None or an int64 torch.Tensor of shape (n, k) (each query's positive "
                        f"documents, -1: unused), got "
                        f"{positives.dtype if isinstance(positives, Tensor) else type(positives).__name__}")
    if positives.dim() != 2 or positives.shape[0] != n:
        raise ValueError(f"positives must have shape ({n}, k), one row per query, got {tuple(positives.shape)}")
    if positives.device != q.device:
        raise ValueError(f"positives is on {positives.device} but q is on {q.device}")
    return TopKRelevance(positives, torch.ones(positives.shape, dtype=acc_dtype(q.dtype), device=q.device), m)


def _call(q: Tensor, d: Tensor, rel: TopKRelevance, loss: str, hyper: List[float], direction: str,
          reduction: str, block: Optional[int], mean_over_positives: bool) -> Tensor:
    """The custom op's loss, reduced in the op (docs/spec.md §1; "mean" over the queries with a
    positive for the positive-set losses, over every query for smooth-NDCG)."""
    lists = relevance_lists(rel.detach(), direction)
    return ranking_from_embeddings(q, d, lists, loss, hyper, DIRECTION_CODE[direction], REDUCTION_CODE[reduction],
                                   mean_over_positives, block or 0)


# ---------------------------------------------------------------- smooth-NDCG
def smooth_ndcg_loss_from_embeddings(q: Tensor, d: Tensor, relevance: TopKRelevance, tau: float = 0.01,
                                     direction: str = "both", reduction: str = "mean", block: Optional[int] = None,
                                     impl: str = "auto") -> Tensor:
    """Smooth-NDCG of ``q @ d.T`` (docs/spec.md §2.1, 2.1b, 2.11), computed block by block from the
    embeddings: the (n, m) similarity and its gradient are never held.

    Args:
        q: (n, dim) query embeddings (the i2t queries: images, or the queries of a retrieval batch).
        d: (m, dim) document embeddings, same dtype and device.
        relevance: a :class:`fastrank.TopKRelevance` of shape (n, m): each query's k best
            documents and their graded relevance (>= 0), every other document 0.
        tau, direction, reduction: as :func:`fastrank.smooth_ndcg_loss` ("mean" averages each
            direction over all its queries).
        block: queries per block (None: as many as keep a block's similarities near 4M values).
        impl: "auto", "native" or "reference" (``smooth_ndcg_loss(q @ d.T, relevance.to_dense())``
            of the pure-PyTorch path: O(n * m) memory).

    Memory: O((n + m) * dim + block * max(n, m) + n * k); work per direction O(n * m * dim) for
    the matmuls and the kernels' O(n * m * k) sparse path. The backward recomputes each block's
    similarities (one more matmul and rank pass per block).
    """
    return _smooth_ndcg_loss_from_embeddings(_check_smooth_ndcg_hyper, q, d, relevance, tau, direction, reduction,
                                             block, impl)


def _smooth_ndcg_loss_from_embeddings(check_hyper, q, d, relevance, tau, direction, reduction, block, impl):
    """smooth_ndcg_loss_from_embeddings with its hyper-parameters checked by ``check_hyper``: the
    op's own, or, for its module form, none (the module checked them when they were set)."""
    _check_embeddings(q, d)
    V.check_topk_relevance(relevance, q, shape=(q.shape[0], d.shape[0]), like="q @ d.T")
    tau, direction, reduction, block = check_hyper(tau, direction, reduction, block)
    impl = V.check_impl(impl)
    _check_values(q, d, relevance, "smooth_ndcg")
    if not has_native(q.device, impl, "smooth_ndcg_loss"):
        return SN.smooth_ndcg_loss(q @ d.t(), relevance.to_dense(acc_dtype(q.dtype)), tau, direction, reduction,
                                   impl="reference")
    return _call(q, d, relevance, "smooth_ndcg", [tau], direction, reduction, block, mean_over_positives=False)


class SmoothNDCGLossFromEmbeddings(ModuleForm, functional=smooth_ndcg_loss_from_embeddings,
                                   inputs=("q", "d", "relevance"),
                                   check=_check_smooth_ndcg_hyper, checked=_smooth_ndcg_loss_from_embeddings):
    """Module form of :func:`fastrank.smooth_ndcg_loss_from_embeddings`:
    ``loss = SmoothNDCGLossFromEmbeddings(tau=0.05)(q, d, relevance)``."""


# ---------------------------------------------------------------- Smooth-AP
def smooth_ap_loss_from_embeddings(q: Tensor, d: Tensor, positives: Optional[Tensor] = None, tau: float = 0.01,
                                   direction: str = "both", reduction: str = "mean", block: Optional[int] = None,
                                   impl: str = "auto") -> Tensor:
    """Smooth-AP of ``q @ d.T`` (docs/spec.md §2.8, 2.11), block by block from the embeddings.

    Args:
        q, d: (n, dim) and (m, dim) embeddings, same dtype and device.
        positives: None (query i's positive is document i: needs n == m) or an int64 (n, k)
            tensor of each query's positive documents (-1: an unused slot).
        tau, direction, reduction: as :func:`fastrank.smooth_ap_loss` ("mean" over the queries
            with a positive).
        block, impl: as :func:`fastrank.smooth_ndcg_loss_from_embeddings`.
    """
    return _smooth_ap_loss_from_embeddings(_check_smooth_ap_hyper, q, d, positives, tau, direction, reduction, block,
                                           impl)


def _smooth_ap_loss_from_embeddings(check_hyper, q, d, positives, tau, direction, reduction, block, impl):
    """smooth_ap_loss_from_embeddings with its hyper-parameters checked by ``check_hyper``: the
    op's own, or, for its module form, none (the module checked them when they were set)."""
    _check_embeddings(q, d)
    rel = _positive_lists(positives, q, d)
    tau, direction, reduction, block = check_hyper(tau, direction, reduction, block)
    impl = V.check_impl(impl)
    _check_values(q, d, rel if positives is not None else None, "smooth_ap")
    if not has_native(q.device, impl, "smooth_ap_loss"):
        return SA.smooth_ap_loss(q @ d.t(), rel.to_dense() != 0, tau, direction, reduction, impl="reference")
    return _call(q, d, rel, "smooth_ap", [tau], direction, reduction, block, mean_over_positives=True)


class SmoothAPLossFromEmbeddings(ModuleForm, functional=smooth_ap_loss_from_embeddings,
                                 inputs=("q", "d", "positives"),
                                 check=_check_smooth_ap_hyper, checked=_smooth_ap_loss_from_embeddings):
    """Module form of :func:`fastrank.smooth_ap_loss_from_embeddings`:
    ``loss = SmoothAPLossFromEmbeddings()(q, d)`` or ``(q, d, positives)``."""


# ---------------------------------------------------------------- Recall@k
def recall_at_k_loss_from_embeddings(q: Tensor, d: Tensor, positives: Optional[Tensor] = None,
                                     ks: Union[int, Sequence[int]] = RK.DEFAULT_KS, tau: float = 0.01,
                                     tau_k: Union[float, Sequence[float]] = 1.0, direction: str = "both",
                                     reduction: str = "mean", block: Optional[int] = None,
                                     impl: str = "auto") -> Tensor:
    """The Recall@k surrogate of ``q @ d.T`` (docs/spec.md §2.9, 2.11), block by block from the
    embeddings.

    Args:
        q, d, positives: as :func:`fastrank.smooth_ap_loss_from_embeddings`.
        ks, tau, tau_k, direction, reduction: as :func:`fastrank.recall_at_k_loss`.
        block, impl: as :func:`fastrank.smooth_ndcg_loss_from_embeddings`.
    """
    return _recall_at_k_loss_from_embeddings(_check_recall_at_k_hyper, q, d, positives, ks, tau, tau_k, direction,
                                             reduction, block, impl)


def _recall_at_k_loss_from_embeddings(check_hyper, q, d, positives, ks, tau, tau_k, direction, reduction, block, impl):
    """recall_at_k_loss_from_embeddings with its hyper-parameters checked by ``check_hyper``: the
    op's own, or, for its module form, none (the module checked them when they were set)."""
    _check_embeddings(q, d)
    rel = _positive_lists(positives, q, d)
    ks, tau, tau_k, direction, reduction, block = check_hyper(ks, tau, tau_k, direction, reduction, block)
    impl = V.check_impl(impl)
    _check_values(q, d, rel if positives is not None else None, "recall_at_k")
    if not has_native(q.device, impl, "recall_at_k_loss"):
        return RK.recall_at_k_loss(q @ d.t(), rel.to_dense() != 0, ks, tau, tau_k, direction, reduction,
                                   impl="reference")
    hyper = [tau, float(len(ks)), *[float(k) for k in ks], *[float(t) for t in tau_k]]
    return _call(q, d, rel, "recall_at_k", hyper, direction, reduction, block, mean_over_positives=True)


class RecallAtKLossFromEmbeddings(ModuleForm, functional=recall_at_k_loss_from_embeddings,
                                  inputs=("q", "d", "positives"),
                                  check=_check_recall_at_k_hyper, checked=_recall_at_k_loss_from_embeddings):
    """Module form of :func:`fastrank.recall_at_k_loss_from_embeddings`:
    ``loss = RecallAtKLossFromEmbeddings(ks=(1, 5))(q, d)`` or ``(q, d, positives)``."""


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
def _embeddings(dtype, seed, size):
    g = C.gen(seed)
    n, m = size
    q = torch.nn.functional.normalize(torch.randn(n, 6, generator=g, dtype=torch.float64), dim=1).to(dtype)
    d = torch.nn.functional.normalize(torch.randn(m, 6, generator=g, dtype=torch.float64), dim=1).to(dtype)
    return g, q * 3, d * 3   # similarities in [-9, 9]: the smooth ranks are neither flat nor steps


def _topk_examples(dtype, seed=0, size=(5, 7)):
    g, q, d = _embeddings(dtype, seed, size)
    rel = torch.rand(size, generator=g, dtype=torch.float64) * (torch.rand(size, generator=g) < 0.4)
    top = TopKRelevance.from_dense(rel.to(dtype), min(3, size[1]))
    return [C.Example("both, mean, block 2", {"q": q, "d": d, "relevance": top},
                      {"tau": 0.3, "direction": "both", "reduction": "mean", "block": 2, "impl": "native"}, ("q", "d")),
            C.Example("t2i, none", {"q": q, "d": d, "relevance": top},
                      {"tau": 0.5, "direction": "t2i", "reduction": "none", "impl": "native"}, ("q", "d"))]


def _positive_examples(head_hyper):
    def examples(dtype, seed=0, size=(5, 7)):
        g, q, d = _embeddings(dtype, seed, size)
        n, m = size
        pos = torch.stack([torch.randperm(m, generator=g)[:2] for _ in range(n)])
        pos[::3, 1] = -1                                                   # rows with one positive
        return [C.Example("both, mean, block 2", {"q": q, "d": d, "positives": pos},
                          {**head_hyper, "tau": 0.3, "direction": "both", "reduction": "mean", "block": 2,
                           "impl": "native"}, ("q", "d")),
                C.Example("i2t, none", {"q": q, "d": d, "positives": pos},
                          {**head_hyper, "tau": 0.5, "direction": "i2t", "reduction": "none", "impl": "native"},
                          ("q", "d"))]
    return examples


def _samples(loss: str, mean_over_positives: bool, hyper_of, rel_of):
    """The contract's calls of the two custom ops on an example (its direction and reduction)."""
    def samples(ex):
        h = ex.hyper
        direction = h.get("direction", "both")
        q = ex.inputs["q"].detach().clone().requires_grad_(True)
        d = ex.inputs["d"].detach().clone().requires_grad_(True)
        lists = relevance_lists(rel_of(ex.inputs, q, d), direction)
        args = (q, d, lists, loss, hyper_of(h), DIRECTION_CODE[direction], REDUCTION_CODE[h.get("reduction", "mean")],
                mean_over_positives, h.get("block") or 0)
        out = ranking_from_embeddings(q.detach(), d.detach(), *args[2:])
        grad = C.upstream(out)
        return [("fastrank::ranking_from_embeddings", args),
                ("fastrank::ranking_from_embeddings_backward", (grad, q.detach(), d.detach(), *args[2:]))]
    return samples


def _recall_hyper(h):
    ks = RK.check_ks(h["ks"])
    return [h["tau"], float(len(ks)), *[float(k) for k in ks], *RK.check_tau_k(h["tau_k"], len(ks))]


_OPS = ("fastrank::ranking_from_embeddings", "fastrank::ranking_from_embeddings_backward")
_EMBEDDING_CASES = (
    C.BadInput("q is a list", TypeError, "q", inputs=lambda x: {"q": x["q"].tolist()}),
    C.BadInput("q is 1-D", ValueError, "q", inputs=lambda x: {"q": x["q"][0]}),
    C.BadInput("d of another dimension", ValueError, "d", inputs=lambda x: {"d": x["d"][:, 1:]}),
    C.BadInput("q holds NaN", ValueError, "q", inputs=lambda x: {"q": torch.full_like(x["q"], float("nan"))}),
    C.BadInput("block = 0", ValueError, "block", hyper={"block": 0}),
) + C.HYPER_CASES
_POSITIVE_CASES = (
    C.BadInput("positives of floats", TypeError, "positives", inputs=lambda x: {"positives": x["positives"].float()}),
    C.BadInput("positives of other rows", ValueError, "positives", inputs=lambda x: {"positives": x["positives"][1:]}),
    C.BadInput("no positives for n != m", ValueError, "positives", inputs=lambda x: {"positives": None}),
    C.BadInput("a positive out of range", ValueError, "positives", inputs=lambda x: {"positives": x["positives"] + 100}),
)


# ---------------------------------------------------------------- their rows of the table of losses (registry.py)
ROWS = (
    Loss("smooth_ndcg_from_embeddings", smooth_ndcg_loss_from_embeddings, SmoothNDCGLossFromEmbeddings,
         C.Contract(_OPS, _topk_examples,
                    _samples("smooth_ndcg", False, lambda h: [h["tau"]], lambda x, q, d: x["relevance"]),
                    _EMBEDDING_CASES + (
                        C.BadInput("relevance as a matrix", TypeError, "relevance",
                                   inputs=lambda x: {"relevance": x["relevance"].to_dense()}),
                        C.BadInput("tau = 0", ValueError, "tau", hyper={"tau": 0.0}))),
         combined=False, cuda_matrix="test_from_embeddings.py"),
    Loss("smooth_ap_from_embeddings", smooth_ap_loss_from_embeddings, SmoothAPLossFromEmbeddings,
         C.Contract(_OPS, _positive_examples({}),
                    _samples("smooth_ap", True, lambda h: [h["tau"]],
                             lambda x, q, d: _positive_lists(x["positives"], q, d)),
                    _EMBEDDING_CASES + _POSITIVE_CASES + (C.BadInput("tau < 0", ValueError, "tau", hyper={"tau": -1.0}),)),
         combined=False, cuda_matrix="test_from_embeddings.py"),
    Loss("recall_at_k_from_embeddings", recall_at_k_loss_from_embeddings, RecallAtKLossFromEmbeddings,
         C.Contract(_OPS, _positive_examples({"ks": (1, 2, 4), "tau_k": (1.0, 0.5, 2.0)}),
                    _samples("recall_at_k", True, _recall_hyper, lambda x, q, d: _positive_lists(x["positives"], q, d)),
                    _EMBEDDING_CASES + _POSITIVE_CASES + (
                        C.BadInput("ks holds 0", ValueError, "ks", hyper={"ks": (0, 1), "tau_k": 1.0}),)),
         combined=False, cuda_matrix="test_from_embeddings.py"),
)

