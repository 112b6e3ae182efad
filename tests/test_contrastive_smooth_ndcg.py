"""InfoNCE / SigLIP + weight x smooth-NDCG straight from the embeddings (docs/spec.md §2.13): equal
(value and every gradient, float64) to open_clip's ClipLoss / SigLipLoss plus
fastrank.smooth_ndcg_loss on img @ txt.T, and to the separate losses on the full matrix for
n != m, every direction, block sizes that do not divide n, B = 1, ties and an all-zero relevance;
with a gradient wanted, the gradients made in the forward (three matmuls a block a pass, none in
the backward: the fused path) and checked by gradcheck; the per-query terms' and the two terms
apart's gradients (the blocks made again); never the (n, m) matrix; the CUDA test matrix case. The
contract (opcheck, torch.compile fullgraph, gradcheck float64, determinism, module form, bad
input) is tests/test_contract.py's."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fastrank
from _cuda_matrix import EMULATED
from _largest_tensor import LargestTensor

BLOCKS = [None, 1, 3, 64]


def inputs(n, m, dim=5, seed=0, k=3, density=0.5, norm=2.0):
    """img, txt (rows of norm ``norm``), a TopKRelevance of k graded captions an image (some of
    them 0), each image's positive caption."""
    g = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(n, dim, generator=g, dtype=torch.float64), dim=1) * norm
    txt = torch.nn.functional.normalize(torch.randn(m, dim, generator=g, dtype=torch.float64), dim=1) * norm
    rel = torch.rand(n, m, generator=g, dtype=torch.float64) * (torch.rand(n, m, generator=g) < density)
    return img, txt, fastrank.TopKRelevance.from_dense(rel, min(k, m)), torch.randint(0, m, (n,), generator=g)


def with_grads(fn, *inputs):
    """(value, gradients of every input) of the scalar ``fn(*inputs)``."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    return [out.detach(), *torch.autograd.grad(out, leaves)]


def assert_all_close(got, want, rtol=1e-12, atol=1e-12):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def combined(contrastive, rel, positives=None, **hyper):
    """The loss under test as fn(img, txt, scale[, bias])."""
    if contrastive == "info_nce":
        return lambda a, b, s: fastrank.contrastive_smooth_ndcg_loss_from_embeddings(
            a, b, rel, s, positives=positives, **hyper)
    return lambda a, b, s, c: fastrank.contrastive_smooth_ndcg_loss_from_embeddings(
        a, b, rel, s, c, positives, contrastive="siglip", **hyper)


def separate(contrastive, rel, positives, weight, tau, direction="both", reduction="mean"):
    """The sum of the two existing losses, each on the full (n, m) matrix."""
    def ndcg(a, b):
        return weight * fastrank.smooth_ndcg_loss(a @ b.t(), rel, tau, direction, reduction)
    if contrastive == "info_nce":
        return lambda a, b, s: fastrank.info_nce_loss_from_embeddings(
            a, b, s, positives, direction, reduction, impl="reference") + ndcg(a, b)
    return lambda a, b, s, c: fastrank.siglip_loss_from_embeddings(
        a, b, s, c, positives, reduction, impl="reference") + ndcg(a, b)


def scalars(contrastive, scale=3.0, bias=-1.5):
    s = [torch.tensor(scale, dtype=torch.float64)]
    return s + [torch.tensor(bias, dtype=torch.float64)] if contrastive == "siglip" else s


# ---------------------------------------------------------------- open_clip + smooth_ndcg_loss
@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
@pytest.mark.parametrize("n,dim,scale", [(1, 4, 1 / 0.07), (7, 5, 10.0), (16, 12, 100.0)])
@pytest.mark.parametrize("block", BLOCKS)
def test_equals_open_clip_plus_smooth_ndcg(open_clip, contrastive, n, dim, scale, block):
    """Value and the gradients of img, txt, logit_scale (and logit_bias), float64: open_clip's
    loss plus weight x fastrank.smooth_ndcg_loss(img @ txt.T, relevance), as a function and as a
    module."""
    img, txt, rel, _ = inputs(n, n, dim, seed=n, norm=1.0)
    weight, tau = 0.7, 0.05
    got = with_grads(combined(contrastive, rel, weight=weight, tau=tau, block=block), img, txt,
                     *scalars(contrastive, scale, -10.0))
    loss = open_clip.ClipLoss() if contrastive == "info_nce" else open_clip.SigLipLoss()

    def want_fn(a, b, *s):
        return loss(a, b, *s) + weight * fastrank.smooth_ndcg_loss(a @ b.t(), rel, tau)
    want = with_grads(want_fn, img, txt, *scalars(contrastive, scale, -10.0))
    assert_all_close(got, want, rtol=1e-12, atol=1e-12 * scale)
    module = fastrank.nn.ContrastiveSmoothNDCGLossFromEmbeddings(contrastive=contrastive, weight=weight, tau=tau,
                                                                 block=block)
    assert_all_close(with_grads(lambda a, b, *s: module(a, b, rel, *s), img, txt, *scalars(contrastive, scale, -10.0)),
                     got, rtol=0, atol=0)


def test_module_takes_the_bias(open_clip):
    img, txt, rel, _ = inputs(6, 6, seed=2)
    s, b = scalars("siglip")
    module = fastrank.nn.ContrastiveSmoothNDCGLossFromEmbeddings(contrastive="siglip", block=4)
    assert torch.equal(module(img, txt, rel, s, b),
                       fastrank.contrastive_smooth_ndcg_loss_from_embeddings(img, txt, rel, s, b, contrastive="siglip",
                                                                             block=4))


# ---------------------------------------------------------------- the separate losses on the full matrix
@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
@pytest.mark.parametrize("direction", ["both", "i2t", "t2i"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("n,m", [(1, 1), (1, 4), (5, 3), (7, 10), (10, 7)])
def test_equals_the_separate_losses(contrastive, direction, reduction, n, m):
    """n != m with each image's positive given, every direction and reduction, block sizes that do
    not divide n or m: the sum of info_nce / siglip and smooth_ndcg on the full matrix."""
    img, txt, rel, positives = inputs(n, m, seed=10 * n + m)
    weight, tau = 1.3, 0.2
    want = with_grads(separate(contrastive, rel, positives, weight, tau, direction, reduction), img, txt,
                      *scalars(contrastive))
    for block in BLOCKS:
        got = with_grads(combined(contrastive, rel, positives, weight=weight, tau=tau, direction=direction,
                                  reduction=reduction, block=block), img, txt, *scalars(contrastive))
        assert_all_close(got, want)
    reference = with_grads(combined(contrastive, rel, positives, weight=weight, tau=tau, direction=direction,
                                    reduction=reduction, impl="reference"), img, txt, *scalars(contrastive))
    assert_all_close(reference, want)


@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
def test_ties_and_all_zero_relevance(contrastive):
    """Tied similarities (repeated captions and images) and an all-zero relevance (smooth-NDCG 0
    with no gradient: the contrastive term alone)."""
    img, txt, rel, positives = inputs(8, 8, seed=4)
    img[3], txt[5], txt[6] = img[1], txt[2], txt[2]
    for r in (rel, fastrank.TopKRelevance(torch.full((8, 2), -1, dtype=torch.int64),
                                          torch.zeros(8, 2, dtype=torch.float64), 8)):
        want = with_grads(separate(contrastive, r, positives, 0.9, 0.1), img, txt, *scalars(contrastive))
        got = with_grads(combined(contrastive, r, positives, weight=0.9, tau=0.1, block=3), img, txt,
                         *scalars(contrastive))
        assert_all_close(got, want)
    alone = with_grads(separate(contrastive, r, positives, 0.0, 0.1), img, txt, *scalars(contrastive))
    assert_all_close(got, alone)


def test_weight_zero_is_the_contrastive_loss():
    img, txt, rel, positives = inputs(6, 9, seed=5)
    s = torch.tensor(4.0, dtype=torch.float64)
    assert_all_close(with_grads(combined("info_nce", rel, positives, weight=0.0, block=2), img, txt, s),
                     with_grads(lambda a, b, c: fastrank.info_nce_loss_from_embeddings(a, b, c, positives, block=2),
                                img, txt, s))


# ---------------------------------------------------------------- one matmul a block a pass; never the matrix
class CountMatmuls(TorchDispatchMode):
    """The matmuls seen (not those inside a custom op: its body runs below the mode) and the
    fastrank ops called: (name, given weights: fused)."""
    def __init__(self):
        super().__init__()
        self.count, self.ops = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            self.count += 1
        if func.namespace == "fastrank":
            name = func.overloadpacket.__name__
            self.ops.append((name, bool(args[8]) if name == "contrastive_ranking_from_embeddings" else None))
        return func(*args, **(kwargs or {}))


def called(fn, *inputs):
    """(the fastrank ops the forward calls, those the backward calls, its matmuls) of the scalar
    ``fn(*inputs)``."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    with CountMatmuls() as forward:
        out = fn(*leaves)
    with CountMatmuls() as backward:
        out.backward()
    return forward.ops, backward.ops, backward.count


OP, BACKWARD = "contrastive_ranking_from_embeddings", "contrastive_ranking_from_embeddings_backward"


@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
def test_one_matmul_a_block_a_pass_or_three_fused(contrastive):
    """The sweep of blocks: one matmul a block of each pass (images against captions, captions
    against images) serves both terms; with upstream weights, that block's two gradient matmuls
    more (fused in the forward, or the backward's blocks made again)."""
    from fastrank.ops import _contrastive_listwise_blocks as B
    from fastrank.ops._launch import relevance_lists
    n, m, block = 10, 7, 3
    img, txt, rel, positives = inputs(n, m, seed=6)
    s, b = torch.tensor(3.0, dtype=torch.float64), torch.tensor(-1.0, dtype=torch.float64)
    lists = relevance_lists(rel, "both")
    blocks = -(-n // block) + -(-m // block)
    args = (img, txt, txt, img, s, b, positives, lists)
    with CountMatmuls() as forward:
        values = B.forward_or_fused(*args, [], contrastive, 0.1, 3, block)[:3]
    weights = [torch.ones_like(v) for v in values]
    with CountMatmuls() as fused:
        B.forward_or_fused(*args, weights, contrastive, 0.1, 3, block)
    with CountMatmuls() as backward:
        B.sweep(*args, contrastive, 0.1, 3, block, weights, False)
    assert (forward.count, fused.count, backward.count) == (blocks, 3 * blocks, 3 * blocks)


@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
def test_one_batch_sums_each_embeddings_two_gradients_in_one_buffer(contrastive, monkeypatch):
    """One process's batch passes img and txt twice (queries of one pass, candidates of the
    other): the fused op, told so (shared), holds two embedding-sized gradients from the forward
    to the backward, not four: img's in img_q's place, txt's in txt_all's, the other two empty,
    equal to the sums of the four it makes otherwise. The combined loss tells it so."""
    from fastrank.ops import _contrastive_listwise_blocks as B
    from fastrank.ops import contrastive_smooth_ndcg as CS
    from fastrank.ops._launch import relevance_lists
    img, txt, rel, positives = inputs(10, 7, seed=6)
    s, b = torch.tensor(3.0, dtype=torch.float64), torch.tensor(-1.0, dtype=torch.float64)
    args = (img, txt, txt, img, s, b, positives, relevance_lists(rel, "both"))
    values = B.forward_or_fused(*args, [], contrastive, 0.1, 3, 3)[:3]
    weights = [torch.rand_like(v) for v in values]
    four = B.forward_or_fused(*args, weights, contrastive, 0.1, 3, 3)[4:]
    two = B.forward_or_fused(*args, weights, contrastive, 0.1, 3, 3, True)[4:]
    assert two[2].numel() == 0 and two[3].numel() == 0
    torch.testing.assert_close(two[0], four[0] + four[3], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(two[1], four[1] + four[2], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(two[4:], four[4:], rtol=1e-12, atol=1e-12)
    told = []
    real = CS.contrastive_ranking_from_embeddings
    monkeypatch.setattr(CS, "contrastive_ranking_from_embeddings",
                        lambda *a: told.append(a[-1]) or real(*a))
    fn = combined(contrastive, rel, positives, tau=0.1, block=3)
    called(fn, img, txt, *scalars(contrastive))
    assert told == [True]


class CountGathers(TorchDispatchMode):
    """The gathers (advanced indexing, aten.index) seen."""
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket is torch.ops.aten.index
        return func(*args, **(kwargs or {}))


def test_one_batch_makes_the_positive_logits_once(monkeypatch):
    """One process's batch, InfoNCE in both directions: caption positives[i]'s t2i pair is image
    i, the i2t pair i read the other way, so the positives' logits are gathered and made once
    (one gather: txt[positives]) and used for both directions: by the combined loss with a
    gradient wanted (fused) and without, and by the two terms apart. The same counter sees the
    two gathers more of the t2i positives made apart where the pairs are not known to be the
    same (shared not told, as fastrank.distributed's rank-local call), and one direction's."""
    from fastrank.ops import contrastive_smooth_ndcg as CS
    img, txt, rel, positives = inputs(10, 7, seed=6)
    s = torch.tensor(3.0, dtype=torch.float64)
    gathers = []
    real = CS._positive_logits

    def counted(*a):
        with CountGathers() as seen:
            out = real(*a)
        gathers.append(seen.count)
        return out
    monkeypatch.setattr(CS, "_positive_logits", counted)

    def count(fn, *x):
        gathers.clear()
        fn(*x)
        return list(gathers)
    fn = combined("info_nce", rel, positives, tau=0.1, block=3)
    leaves = [x.detach().clone().requires_grad_(True) for x in (img, txt, s)]
    assert count(fn, *leaves) == [1]
    with torch.no_grad():
        assert count(fn, img, txt, s) == [1]
    assert count(lambda *x: CS.both_terms(*x[:2], rel, x[2], positives=positives, block=3), *leaves) == [1]
    args = CS._single_process(img, txt, rel, s, torch.zeros_like(s), positives, "both")
    assert count(CS.loss, *args, "info_nce", 0.1, "both", 3, 1.0, [1.0, 1.0], True) == [1]
    assert count(CS.loss, *args, "info_nce", 0.1, "both", 3, 1.0, [1.0, 1.0], False) == [3]
    for direction, apart in (("i2t", [1]), ("t2i", [2])):
        fn = combined("info_nce", rel, positives, tau=0.1, direction=direction, block=3)
        assert count(fn, *leaves) == apart


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_positive_logits_made_once_equal_them_made_twice(reduction, monkeypatch):
    """The positives' logits made once for both directions (one process's batch, InfoNCE, both
    directions) are bit for bit those the t2i pairs give made apart, and the combined loss and
    the two terms apart (value and the gradients of img, txt, logit_scale) equal those of the
    path that makes them twice, float64."""
    from fastrank.ops import contrastive_smooth_ndcg as CS
    img, txt, rel, positives = inputs(10, 7, seed=14)
    s = torch.tensor(3.0, dtype=torch.float64)
    a, b, _, _, _, _, pos, pairs, _ = CS._single_process(img, txt, rel, s, torch.zeros_like(s), positives, "both")
    once = CS._positive_logits(a, b, b, a, s, pos, pairs, "both", True)
    twice = CS._positive_logits(a, b, b, a, s, pos, pairs, "both", False)
    assert len(once) == len(twice) == 2 and once[1] is once[0]
    assert torch.equal(once[0], twice[0]) and torch.equal(once[1], twice[1])

    def fns():
        def apart(x, y, z):
            con, ranked = CS.both_terms(x, y, rel, z, positives=positives, tau=0.1, reduction=reduction, block=3)
            return 0.3 * con + 1.9 * ranked
        return combined("info_nce", rel, positives, weight=0.8, tau=0.1, reduction=reduction, block=3), apart
    got = [with_grads(fn, img, txt, s) for fn in fns()]
    with torch.no_grad():
        got_values = [fn(img, txt, s) for fn in fns()]
    real = CS._positive_logits
    monkeypatch.setattr(CS, "_positive_logits", lambda *x: real(*x[:-1], False))   # twice, as where not shared
    want = [with_grads(fn, img, txt, s) for fn in fns()]
    with torch.no_grad():
        want_values = [fn(img, txt, s) for fn in fns()]
    for g, w in zip(got, want):
        assert torch.equal(g[0], w[0])
        assert_all_close(g, w)
    for g, w in zip(got_values, want_values):
        assert torch.equal(g, w)


@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
def test_the_combined_loss_fuses_where_a_gradient_is_wanted(contrastive):
    """With a gradient wanted the combined loss calls the op fused (gradients made in the
    forward) and its backward calls no op and no matmul (it scales them); under no_grad the op
    unfused; the two terms taken apart (both_terms, each its own upstream gradient) unfused, the
    backward making the blocks again."""
    from fastrank.ops.contrastive_smooth_ndcg import both_terms
    img, txt, rel, positives = inputs(10, 7, seed=6)
    fn = combined(contrastive, rel, positives, tau=0.1, block=3)
    assert called(fn, img, txt, *scalars(contrastive)) == ([(OP, True)], [], 0)
    with torch.no_grad(), CountMatmuls() as no_grad:
        fn(img, txt, *scalars(contrastive))
    assert no_grad.ops == [(OP, False)]
    bias = {"logit_bias": scalars(contrastive)[1]} if contrastive == "siglip" else {}

    def apart(a, b, s):
        c, r = both_terms(a, b, rel, s, positives=positives, contrastive=contrastive, tau=0.1, block=3, **bias)
        return c + r
    assert called(apart, img, txt, scalars(contrastive)[0])[:2] == ([(OP, False)], [(BACKWARD, None)])


@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
@pytest.mark.parametrize("direction", ["both", "i2t", "t2i"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_gradients_gradcheck(contrastive, direction, reduction):
    """The fused path (gradients made in the forward, scaled by the backward) against finite
    differences, float64, n != m, a block that divides neither, an upstream gradient != 1."""
    img, txt, rel, positives = inputs(5, 4, dim=3, seed=11)
    fn = combined(contrastive, rel, positives, weight=0.8, tau=0.3, direction=direction, reduction=reduction,
                  block=2)
    leaves = [x.detach().clone().requires_grad_(True) for x in (img, txt, *scalars(contrastive))]
    assert torch.autograd.gradcheck(lambda *x: 1.7 * fn(*x), leaves)
    assert called(fn, *leaves)[:2] == ([(OP, True)], [])         # it is the fused path


@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
def test_the_terms_apart_weighted_unequally(contrastive):
    """The two terms each with its own upstream gradient (open_clip's output_dict, the unfused
    path): 0.3 x contrastive + 1.9 x smooth-NDCG equals the separate losses' on the full matrix."""
    from fastrank.ops.contrastive_smooth_ndcg import both_terms
    img, txt, rel, positives = inputs(7, 5, seed=12)
    bias = (lambda c: {"logit_bias": c}) if contrastive == "siglip" else (lambda *c: {})

    def apart(a, b, s, *c):
        con, ranked = both_terms(a, b, rel, s, positives=positives, contrastive=contrastive, tau=0.2,
                                 direction="both", block=3, **bias(*c))
        return 0.3 * con + 1.9 * ranked
    want_c = separate(contrastive, rel, positives, 0.0, 0.2)
    want_r = separate(contrastive, rel, positives, 1.9, 0.2)
    want = with_grads(lambda *x: 0.3 * want_c(*x) + want_r(*x) - want_c(*x), img, txt, *scalars(contrastive))
    assert_all_close(with_grads(apart, img, txt, *scalars(contrastive)), want)


@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
@pytest.mark.parametrize("direction", ["both", "i2t", "t2i"])
@pytest.mark.parametrize("shared", [False, True])
def test_per_query_terms_gradcheck(contrastive, direction, shared):
    """The per-query losses (reduction "none": each query its own upstream gradient, the blocks
    made again in the backward) against finite differences, float64; told one process's batch
    (shared: InfoNCE's positives' logits made once for both directions) or not."""
    from fastrank.ops._launch import relevance_lists
    from fastrank.ops.contrastive_smooth_ndcg import terms
    img, txt, rel, positives = inputs(5, 4, dim=3, seed=13)
    lists = relevance_lists(rel, direction)
    pairs = (positives, torch.arange(5))

    def per_query(a, b, s, c):
        con, ranked = terms(a, b, b, a, s, c, positives, pairs, lists, contrastive, 0.3, direction, 2, shared)
        return (con, *ranked)
    leaves = [x.detach().clone().requires_grad_(True) for x in (img, txt, *scalars("siglip"))]
    assert torch.autograd.gradcheck(per_query, leaves)


@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
def test_never_makes_the_matrix(contrastive):
    """The sweep of blocks (the body of the custom ops) with blocks of 8 queries, values only and
    fused (values and gradients): no tensor of n * m elements, or of a quarter of it, is ever
    made (the largest is a block's (8, n))."""
    from fastrank.ops import _contrastive_listwise_blocks as B
    from fastrank.ops._launch import relevance_lists
    n, m = 64, 96
    img, txt, rel, positives = inputs(n, m, dim=6, seed=7, k=8)
    s, b = torch.tensor(10.0, dtype=torch.float64), torch.tensor(-3.0, dtype=torch.float64)
    lists = relevance_lists(rel, "both")
    with LargestTensor() as seen:
        values, _ = B.sweep(img, txt, txt, img, s, b, positives, lists, contrastive, 0.1, 3, 8, None, True)
        B.sweep(img, txt, txt, img, s, b, positives, lists, contrastive, 0.1, 3, 8,
                [torch.ones_like(v) for v in values], True)
    assert seen.numel < n * m // 4, seen.numel
    assert seen.numel >= 8 * m                                   # it did see the blocks


# ---- CUDA test matrix (marked cuda_matrix) -------------------------------------------------------
@pytest.mark.cuda_matrix
@pytest.mark.parametrize("contrastive", ["info_nce", "siglip"])
def test_cuda_contrastive_smooth_ndcg_equals_the_reference(device, contrastive):
    """On the GPU (or emulated on the CPU: the smooth-NDCG kernels' CUDA path), the blocks give
    the float64 reference's loss and gradients in float32."""
    img, txt, rel, positives = inputs(11, 14, seed=9)
    f32 = [img.float(), txt.float(), *(x.float() for x in scalars(contrastive, 10.0, -3.0))]

    def call(rel, positives, impl):
        return combined(contrastive, rel, positives, weight=0.8, tau=0.1, block=4, impl=impl)
    got = with_grads(call(rel.to(torch.float32).to(device), positives.to(device), "native"),
                     *(x.to(device) for x in f32))
    want = with_grads(call(rel, positives, "reference"), *(x.double() for x in f32))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu().double(), b, rtol=1e-4, atol=1e-5)
    assert EMULATED or device.type == "cuda"
