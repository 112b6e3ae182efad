"""InfoNCE and the SigLIP loss straight from the embeddings (docs/spec.md §2.12): equal to a slow
loop of the papers' definitions and to open_clip's ClipLoss / SigLipLoss (value and every
gradient, float64 to rounding), for every block size, at B = 1, at large logits, with half
embeddings, never holding the (n, m) logits; and the CUDA test matrix case. The contract
(opcheck, compile, gradcheck, determinism, module form, bad input) is tests/test_contract.py's."""
import math

import pytest
import torch

import fastrank
from _cuda_matrix import EMULATED
from _largest_tensor import LargestTensor

IMPLS = ["native", "reference"]
BLOCKS = [None, 1, 3, 64]


def embeddings(n, m, dim=6, seed=0, dtype=torch.float64, norm=1.0):
    g = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(n, dim, generator=g, dtype=torch.float64), dim=1) * norm
    txt = torch.nn.functional.normalize(torch.randn(m, dim, generator=g, dtype=torch.float64), dim=1) * norm
    return img.to(dtype), txt.to(dtype), g


def with_grads(fn, *inputs):
    """(value, gradients of every input) of ``fn(*inputs)`` after a backward of a fixed weighted
    sum of its elements."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    w = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)
    return [out.detach(), *torch.autograd.grad((out * w).sum(), leaves)]


def assert_all_close(got, want, rtol=1e-12, atol=1e-12):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- slow loops of the definitions
def loop_info_nce(img, txt, scale, positives, direction):
    """The per-query cross-entropies, one by one: i2t -log(exp(L_ip) / sum_j exp(L_ij)), then t2i
    -log(exp(L_ip) / sum_k exp(L_kp)) for each pair (i, p = positives[i])."""
    n, m = img.shape[0], txt.shape[0]

    def logit(i, j):
        return scale * sum(img[i, t] * txt[j, t] for t in range(img.shape[1]))
    out = []
    if direction in ("i2t", "both"):
        for i in range(n):
            p = int(positives[i])
            out.append(-torch.log(torch.exp(logit(i, p)) / sum(torch.exp(logit(i, j)) for j in range(m))))
    if direction in ("t2i", "both"):
        for i in range(n):
            p = int(positives[i])
            out.append(-torch.log(torch.exp(logit(i, p)) / sum(torch.exp(logit(k, p)) for k in range(n))))
    return torch.stack(out)


def loop_siglip(img, txt, scale, bias, positives):
    """Each query's -sum_j log(1 / (1 + exp(-z_ij (scale <img_i, txt_j> + bias))))."""
    out = []
    for i in range(img.shape[0]):
        total = 0.0
        for j in range(txt.shape[0]):
            z = 1.0 if j == int(positives[i]) else -1.0
            logit = scale * (img[i] @ txt[j]) + bias
            total = total - torch.log(1.0 / (1.0 + torch.exp(-z * logit)))
        out.append(total)
    return torch.stack(out)


def reduced(per_query, reduction):
    return {"none": per_query, "sum": per_query.sum(), "mean": per_query.mean()}[reduction]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("direction", ["both", "i2t", "t2i"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("n,m", [(1, 1), (1, 4), (5, 3), (6, 9)])
def test_info_nce_equals_the_loop(impl, direction, reduction, n, m):
    img, txt, g = embeddings(n, m, seed=n * 10 + m, norm=2.0)
    positives = torch.randint(0, m, (n,), generator=g)
    scale = torch.tensor(3.5, dtype=torch.float64)
    for block in BLOCKS:
        got = with_grads(lambda a, b, s: fastrank.info_nce_loss_from_embeddings(
            a, b, s, positives, direction, reduction, block=block, impl=impl), img, txt, scale)
        want = with_grads(lambda a, b, s: reduced(loop_info_nce(a, b, s, positives, direction), reduction),
                          img, txt, scale)
        assert_all_close(got, want)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("n,m", [(1, 1), (1, 4), (5, 3), (6, 9)])
def test_siglip_equals_the_loop(impl, reduction, n, m):
    img, txt, g = embeddings(n, m, seed=n * 10 + m, norm=2.0)
    positives = torch.randint(0, m, (n,), generator=g)
    scale, bias = torch.tensor(3.5, dtype=torch.float64), torch.tensor(-2.0, dtype=torch.float64)
    for block in BLOCKS:
        got = with_grads(lambda a, b, s, c: fastrank.siglip_loss_from_embeddings(
            a, b, s, c, positives, reduction, block=block, impl=impl), img, txt, scale, bias)
        want = with_grads(lambda a, b, s, c: reduced(loop_siglip(a, b, s, c, positives), reduction),
                          img, txt, scale, bias)
        assert_all_close(got, want)


def test_positives_none_is_the_diagonal():
    img, txt, _ = embeddings(7, 7, seed=3)
    diagonal = torch.arange(7)
    for impl in IMPLS:
        assert torch.equal(fastrank.info_nce_loss_from_embeddings(img, txt, 5.0, impl=impl),
                           fastrank.info_nce_loss_from_embeddings(img, txt, 5.0, diagonal, impl=impl))
        assert torch.equal(fastrank.siglip_loss_from_embeddings(img, txt, 5.0, -1.0, impl=impl),
                           fastrank.siglip_loss_from_embeddings(img, txt, 5.0, -1.0, diagonal, impl=impl))


# ---------------------------------------------------------------- open_clip
CLIP_CASES = [  # (n, dim, norm of the embeddings, logit scale, logit bias)
    (1, 4, 1.0, 1 / 0.07, -10.0),       # B = 1; CLIP's initial temperature, SigLIP's initial bias
    (16, 12, 1.0, 100.0, -10.0),        # CLIP's largest scale: logits in [-100, 100]
    (33, 8, 1.0, 10.0, 0.0),
    (12, 6, 30.0, 5.0, 3.0),            # large magnitudes: logits up to 4500, every softmax one-hot
]


@pytest.mark.parametrize("n,dim,norm,scale,bias", CLIP_CASES)
@pytest.mark.parametrize("block", [None, 1, 5])
def test_info_nce_equals_open_clip_clip_loss(open_clip, n, dim, norm, scale, bias, block):
    """Value and the gradients of img, txt and logit_scale, float64: open_clip's ClipLoss."""
    img, txt, _ = embeddings(n, n, dim, seed=n, norm=norm)
    s = torch.tensor(scale, dtype=torch.float64)
    got = with_grads(lambda a, b, c: fastrank.info_nce_loss_from_embeddings(a, b, c, block=block), img, txt, s)
    want = with_grads(lambda a, b, c: open_clip.ClipLoss()(a, b, c), img, txt, s)
    assert_all_close(got, want, rtol=1e-13, atol=1e-12 * max(1.0, norm ** 2 * scale))
    module = fastrank.nn.InfoNCELossFromEmbeddings(block=block)
    assert_all_close(with_grads(module, img, txt, s), got, rtol=0, atol=0)


@pytest.mark.parametrize("n,dim,norm,scale,bias", CLIP_CASES)
@pytest.mark.parametrize("block", [None, 1, 5])
def test_siglip_equals_open_clip_siglip_loss(open_clip, n, dim, norm, scale, bias, block):
    """Value and the gradients of img, txt, logit_scale and logit_bias, float64: open_clip's
    SigLipLoss (one process)."""
    img, txt, _ = embeddings(n, n, dim, seed=n, norm=norm)
    s, b = torch.tensor(scale, dtype=torch.float64), torch.tensor(bias, dtype=torch.float64)
    got = with_grads(lambda x, y, c, d: fastrank.siglip_loss_from_embeddings(x, y, c, d, block=block), img, txt, s, b)
    want = with_grads(lambda x, y, c, d: open_clip.SigLipLoss()(x, y, c, d), img, txt, s, b)
    assert_all_close(got, want, rtol=1e-13, atol=1e-12 * max(1.0, norm ** 2 * scale))
    module = fastrank.nn.SigLIPLossFromEmbeddings(block=block)
    assert_all_close(with_grads(module, img, txt, s, b), got, rtol=0, atol=0)


def test_open_clip_s_learnable_scale_gets_its_gradient(open_clip):
    """The model's parameter is log(scale) and the loss takes its exp, as open_clip's CLIP does:
    the gradient reaches the parameter through the exp."""
    img, txt, _ = embeddings(10, 10, 8, seed=2)
    grads = []
    for loss in (lambda a, b, s: fastrank.info_nce_loss_from_embeddings(a, b, s, block=3),
                 lambda a, b, s: open_clip.ClipLoss()(a, b, s)):
        log_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07), dtype=torch.float64))
        loss(img, txt, log_scale.exp()).backward()
        grads.append(log_scale.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------- dtypes, scalars, memory
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("loss", ["info_nce", "siglip"])
def test_half_embeddings_are_computed_in_float32(dtype, loss):
    """float16 / bfloat16 (and float32) embeddings: a float32 loss equal to the float64 loss of the
    same (rounded) embeddings within float32 rounding; the gradients in the embeddings' dtype."""
    img, txt, g = embeddings(20, 24, 16, seed=4, dtype=dtype)
    positives = torch.randint(0, 24, (20,), generator=g)
    scale, bias = torch.tensor(20.0), torch.tensor(-5.0)
    if loss == "info_nce":
        def call(a, b, s, c):
            return fastrank.info_nce_loss_from_embeddings(a, b, s, positives, block=7) + 0 * c
    else:
        def call(a, b, s, c):
            return fastrank.siglip_loss_from_embeddings(a, b, s, c, positives, block=7)
    got = with_grads(call, img, txt, scale, bias)
    want = with_grads(call, img.double(), txt.double(), scale.double(), bias.double())
    assert got[0].dtype == torch.float32
    assert [x.dtype for x in got[1:]] == [dtype, dtype, torch.float32, torch.float32]
    # the gradients are rounded to the embeddings' dtype on the way out
    eps = torch.finfo(dtype).eps
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=max(eps, 1e-5), atol=max(eps, 1e-5) * b.abs().max().item())


def test_logit_scale_as_a_number_is_a_constant():
    img, txt, _ = embeddings(6, 6, seed=1)
    s = torch.tensor(7.0, dtype=torch.float64)
    assert torch.equal(fastrank.info_nce_loss_from_embeddings(img, txt, 7.0),
                       fastrank.info_nce_loss_from_embeddings(img, txt, s))
    assert torch.equal(fastrank.siglip_loss_from_embeddings(img, txt, 7.0, -2),
                       fastrank.siglip_loss_from_embeddings(img, txt, s, torch.tensor(-2.0, dtype=torch.float64)))
    # a one-element tensor of another shape keeps its shape in its gradient
    s1 = torch.tensor([7.0], dtype=torch.float64, requires_grad=True)
    fastrank.info_nce_loss_from_embeddings(img, txt, s1, block=2).backward()
    assert s1.grad.shape == (1,)


@pytest.mark.parametrize("loss", ["info_nce", "siglip"])
def test_never_makes_the_logits(loss):
    """The forward and backward (the bodies of the custom ops) with blocks of 8 queries: no tensor
    of n * m elements, or of a quarter of it, is ever made (the largest is a block's (8, m) logits)."""
    from fastrank.ops import _contrastive_blocks as CB
    n, m = 64, 96
    img, txt, g = embeddings(n, m, seed=5)
    positives = torch.randint(0, m, (n,), generator=g)
    scale, bias = torch.tensor(10.0, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64)
    with LargestTensor() as seen:
        if loss == "info_nce":
            per_query, row_lse, col_lse = CB.info_nce_forward(img, txt, scale, positives, "both", 8)
            CB.info_nce_gradients(torch.ones_like(per_query), img, txt, scale, positives, row_lse, col_lse, "both", 8)
        else:
            per_query = CB.siglip_forward(img, txt, scale, bias, positives, 8)
            CB.siglip_gradients(torch.ones_like(per_query), img, txt, scale, bias, positives, 8)
    assert seen.numel < n * m // 4, seen.numel
    assert seen.numel >= 8 * m                                   # it did see the blocks


# ---- CUDA test matrix (marked cuda_matrix) -------------------------------------------------------
@pytest.mark.cuda_matrix
@pytest.mark.parametrize("loss", ["info_nce", "siglip"])
def test_cuda_contrastive_equals_the_reference(device, loss):
    """On the GPU (or, emulated, the CPU: these losses are matmuls, with no kernel of their own),
    the blocks give the float64 reference's loss and gradients in float32."""
    img, txt, g = embeddings(11, 14, seed=9, dtype=torch.float32)
    positives = torch.randint(0, 14, (11,), generator=g)
    scale, bias = torch.tensor(10.0), torch.tensor(-3.0)
    if loss == "info_nce":
        def call(a, b, s, c, impl):
            return fastrank.info_nce_loss_from_embeddings(a, b, s, positives.to(a.device), block=4, impl=impl) + 0 * c
    else:
        def call(a, b, s, c, impl):
            return fastrank.siglip_loss_from_embeddings(a, b, s, c, positives.to(a.device), block=4, impl=impl)
    on = [x.to(device) for x in (img, txt, scale, bias)]
    got = with_grads(lambda *x: call(*x, impl="native"), *on)
    want = with_grads(lambda *x: call(*x, impl="reference"), img.double(), txt.double(), scale.double(), bias.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu().double(), b, rtol=1e-4, atol=1e-5)
    assert EMULATED or device.type == "cuda"
