"""The smooth-rank losses straight from the embeddings (docs/spec.md §2.11): equal to the loss of
q @ d.T (values and gradients, every direction, reduction and block size), never a (n, m) tensor,
under gradient caching and against a memory of past documents, and the CUDA test matrix case.
The contract (opcheck, compile, gradcheck, determinism, module form, bad input) is
tests/test_contract.py's."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fastrank
from _cuda_matrix import EMULATED
from fastrank.train.grad_cache import cached_step

NATIVE_CPU = fastrank.backends()["cpu"]
needs_native = pytest.mark.skipif(not NATIVE_CPU, reason="native CPU module not built")
IMPLS = ["reference"] + (["native"] if NATIVE_CPU else [])


def embeddings(n, m, dim=5, seed=0, dtype=torch.float64, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(n, dim, generator=g, dtype=torch.float64), dim=1) * scale
    d = torch.nn.functional.normalize(torch.randn(m, dim, generator=g, dtype=torch.float64), dim=1) * scale
    return q.to(dtype), d.to(dtype), g


def topk(n, m, k, g, dtype=torch.float64):
    rel = torch.rand(n, m, generator=g, dtype=torch.float64) * (torch.rand(n, m, generator=g) < 0.3)
    rel[0, :] = 0.0                                            # an all-zero list
    return fastrank.TopKRelevance.from_dense(rel.to(dtype), min(k, m))


def positive_indices(n, m, g):
    pos = torch.stack([torch.randperm(m, generator=g)[:2] for _ in range(n)])
    if pos.shape[1] > 1:
        pos[::2, 1] = -1                                       # queries with one positive
    if n > 1:
        pos[1] = -1                                            # a query without a positive
    return pos


def dense_positives(pos, m):
    out = torch.zeros(pos.shape[0], m + 1, dtype=torch.bool)
    out.scatter_(1, torch.where(pos >= 0, pos, m), True)
    return out[:, :m]


def grads(fn, q, d, weight=None):
    q = q.detach().clone().requires_grad_(True)
    d = d.detach().clone().requires_grad_(True)
    loss = fn(q, d)
    w = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype).reshape(loss.shape) if weight is None else weight
    gq, gd = torch.autograd.grad((loss * w).sum(), (q, d))
    return loss.detach(), gq, gd


CASES = {   # name -> (from embeddings, on the similarity matrix)
    "smooth_ndcg": (lambda q, d, r, **h: fastrank.smooth_ndcg_loss_from_embeddings(q, d, r[0], tau=0.2, **h),
                    lambda s, r, **h: fastrank.smooth_ndcg_loss(s, r[0].to_dense(), tau=0.2, **h)),
    "smooth_ap": (lambda q, d, r, **h: fastrank.smooth_ap_loss_from_embeddings(q, d, r[1], tau=0.2, **h),
                  lambda s, r, **h: fastrank.smooth_ap_loss(s, r[2], tau=0.2, **h)),
    "recall_at_k": (lambda q, d, r, **h: fastrank.recall_at_k_loss_from_embeddings(q, d, r[1], ks=(1, 3), tau=0.2,
                                                                                    tau_k=0.5, **h),
                    lambda s, r, **h: fastrank.recall_at_k_loss(s, r[2], ks=(1, 3), tau=0.2, tau_k=0.5, **h)),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("loss", list(CASES))
@pytest.mark.parametrize("n,m", [(1, 1), (1, 7), (7, 1), (9, 13), (13, 9)])
def test_equals_the_loss_of_the_similarity_matrix(impl, loss, n, m):
    q, d, g = embeddings(n, m, seed=n * 31 + m)
    pos = positive_indices(n, m, g)
    rel = (topk(n, m, 3, g), pos, dense_positives(pos, m))
    ours, theirs = CASES[loss]
    for direction in ("i2t", "t2i", "both"):
        for reduction in ("mean", "sum", "none"):
            want = grads(lambda a, b: theirs(a @ b.t(), rel, direction=direction, reduction=reduction,
                                             impl="reference"), q, d)
            for block in (None, 1, 2, 5, 100):
                got = grads(lambda a, b: ours(a, b, rel, direction=direction, reduction=reduction, block=block,
                                              impl=impl), q, d)
                for x, y in zip(got, want):
                    torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


@needs_native
@pytest.mark.parametrize("loss", list(CASES))
def test_float32_within_the_matrix_path_s_error(loss):
    """In float32 the error against the float64 loss of q @ d.T is within twice the error of
    the native loss on the float32 similarity matrix."""
    q, d, g = embeddings(40, 60, dim=16, seed=3)
    pos = positive_indices(40, 60, g)
    rel64 = (topk(40, 60, 4, g), pos, dense_positives(pos, 60))
    rel32 = (rel64[0].to(torch.float32), pos, rel64[2])
    ours, theirs = CASES[loss]
    exact = grads(lambda a, b: theirs(a @ b.t(), rel64, impl="reference"), q, d)
    matrix = grads(lambda a, b: theirs(a @ b.t(), rel32, impl="native"), q.float(), d.float())
    got = grads(lambda a, b: ours(a, b, rel32, block=7, impl="native"), q.float(), d.float())
    for x, y, z in zip(got, matrix, exact):
        own = (y.double() - z).abs().max().item()
        assert (x.double() - z).abs().max().item() <= 2 * own + 1e-6


class _Sizes(TorchDispatchMode):
    """Records the number of elements of every tensor an op makes."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@needs_native
@pytest.mark.parametrize("loss", ["smooth_ndcg", "smooth_ap", "recall_at_k"])
def test_never_makes_the_similarity_matrix(loss):
    """The blockwise forward and backward (the bodies of the two custom ops) with blocks of 8
    queries: no tensor of n * m elements, or of a quarter of it, is ever made (the largest is a
    block's (8, max(n, m)) and its workspace)."""
    from fastrank.ops import _blockwise as B
    from fastrank.ops._launch import relevance_lists
    n, m = 64, 96
    q, d, g = embeddings(n, m, seed=5)
    rel = topk(n, m, 4, g) if loss == "smooth_ndcg" else \
        fastrank.TopKRelevance(positive_indices(n, m, g), torch.ones(n, 2, dtype=torch.float64), m)
    lists = relevance_lists(rel, "both")
    hyper = [0.2, 2.0, 1.0, 3.0, 1.0, 1.0] if loss == "recall_at_k" else [0.2]
    with _Sizes() as sizes:
        per_query = B.per_query_losses(q, d, lists, loss, hyper, 3, 8)
        B.gradients(torch.ones_like(per_query), q, d, lists, loss, hyper, 3, 8)
    assert sizes.largest < n * m // 4, sizes.largest
    assert sizes.largest >= 8 * m                                   # it did see the blocks


class _Calls(TorchDispatchMode):
    """Records (op name, its first argument, its output) of every op called."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls.append((func.name(), args[0] if args else None, out))
        return out


@needs_native
@pytest.mark.parametrize("loss", list(CASES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_the_custom_op_reduces(loss, reduction):
    """The custom op returns the reduced loss, which the function returns as it is (0-dim for
    "mean" and "sum", one loss per query for "none"), and its backward takes that output's
    gradient (docs/spec.md §1: the reduction is the op's, as for the matrix losses)."""
    n, m = 9, 13
    q, d, g = embeddings(n, m, seed=4)
    pos = positive_indices(n, m, g)
    rel = (topk(n, m, 3, g), pos, dense_positives(pos, m))
    q.requires_grad_(True)
    with _Calls() as forward:
        value = CASES[loss][0](q, d, rel, direction="both", reduction=reduction, block=4, impl="native")
    name, _, out = forward.calls[-1]
    assert name == "fastrank::ranking_from_embeddings"
    assert value.shape == (() if reduction != "none" else (n + m,)) and torch.equal(value, out)
    with _Calls() as backward:
        value.backward(torch.ones_like(value))
    grads_in = [first for name, first, _ in backward.calls if name == "fastrank::ranking_from_embeddings_backward"]
    assert len(grads_in) == 1 and grads_in[0].shape == value.shape


@needs_native
def test_gradient_caching_gives_the_full_batch_gradient():
    """The from-embeddings loss under fastrank.train.grad_cache.cached_step: the parameters'
    gradient equals one uncached step's (docs/training-at-scale.md)."""
    torch.manual_seed(0)
    img_tower, txt_tower = torch.nn.Linear(12, 8).double(), torch.nn.Linear(10, 8).double()
    x_img, x_txt = torch.randn(24, 12, dtype=torch.float64), torch.randn(24, 10, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    rel = topk(24, 24, 3, g)

    def loss_fn(q, d):
        return fastrank.smooth_ndcg_loss_from_embeddings(q, d, rel, tau=0.1, block=5)

    params = list(img_tower.parameters()) + list(txt_tower.parameters())
    loss_fn(img_tower(x_img), txt_tower(x_txt)).backward()
    want = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    cached_step(lambda a, b: (img_tower(a), txt_tower(b)), [x_img, x_txt], 7, loss_fn)
    for p, w in zip(params, want):
        torch.testing.assert_close(p.grad, w, rtol=1e-10, atol=1e-12)


@needs_native
def test_a_memory_of_past_documents_with_topk_relevance():
    """Queries against the batch's documents and a memory of past ones (no gradient): with a
    TopKRelevance over (batch + memory) a stored document outside a query's k best has gain 0;
    the loss and the batch's gradients equal the matrix path's."""
    q, d, g = embeddings(16, 16, seed=7)
    memory = torch.randn(40, 5, generator=g, dtype=torch.float64)
    rel = topk(16, 56, 4, g)
    q.requires_grad_(True)
    d.requires_grad_(True)
    candidates = torch.cat([d, memory])
    ours = fastrank.smooth_ndcg_loss_from_embeddings(q, candidates, rel, tau=0.1, direction="i2t", block=3)
    theirs = fastrank.smooth_ndcg_loss(q @ candidates.t(), rel.to_dense(), tau=0.1, direction="i2t",
                                       impl="reference")
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    a = torch.autograd.grad(ours, (q, d))
    b = torch.autograd.grad(theirs, (q, d))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


# ---- CUDA test matrix (marked cuda_matrix) -------------------------------------------------------
@pytest.mark.cuda_matrix
@pytest.mark.parametrize("loss", list(CASES))
def test_cuda_from_embeddings_equals_the_matrix_path(device, loss):
    """On the CUDA kernels (a GPU, or the emulator: EMULATED), the blocks' kernels give the
    loss and gradients of the matrix path of the same kernels."""
    q, d, g = embeddings(11, 14, dim=6, seed=9, dtype=torch.float32)
    pos = positive_indices(11, 14, g)
    rel = (topk(11, 14, 3, g, torch.float32), pos, dense_positives(pos, 14))
    ours, theirs = CASES[loss]
    to = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t.to(device)   # noqa: E731
    rel_dev = tuple(to(r) for r in rel)
    got = grads(lambda a, b: ours(a, b, rel_dev, block=4, impl="native"), q.to(device), d.to(device))
    want = grads(lambda a, b: theirs(a @ b.t(), rel_dev, impl="native"), q.to(device), d.to(device))
    for x, y in zip(got, want):
        torch.testing.assert_close(x.cpu(), y.cpu(), rtol=1e-4, atol=1e-5)
    assert EMULATED or device.type == "cuda"
