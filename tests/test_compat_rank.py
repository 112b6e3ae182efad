"""fastrank.compat adapters of the smooth-rank family (docs/spec.md §2.10):

- ``SmoothAPLoss``: pytorch-metric-learning's call (embeddings, labels), checked against
  PML's own ``SmoothAPLoss`` when the package is installed (the ``test`` extra has it),
  value and gradient in float64, and against a loop oracle for every label layout;
- ``RecallatK``: the Recall@k surrogate authors' criterion, checked against a re-typed
  copy of their ``RecallatK.forward`` kept below (their repository is not a package).
"""

import pytest
import torch
import torch.nn.functional as F

import fastrank
from fastrank.compat import RecallatK, SmoothAPLoss

from _rank_oracles import recall_at_k_query, smooth_ap_query

try:
    import pytorch_metric_learning
    from pytorch_metric_learning.losses import SmoothAPLoss as PMLSmoothAPLoss
except ImportError:  # the comparisons with PML skip; everything else runs
    pytorch_metric_learning = PMLSmoothAPLoss = None

needs_pml = pytest.mark.skipif(PMLSmoothAPLoss is None, reason="pytorch-metric-learning is not installed "
                               "(it is in the test extra: pip install .[test])")


@pytest.fixture
def float64_default():
    """PML builds its masks and its AP vector with torch's default dtype (float32): float64
    throughout needs the default switched for the call."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def embeddings(b, d=8, seed=0, dtype=torch.float64):
    return torch.randn(b, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def grad_of(fn, emb, *args):
    e = emb.detach().clone().requires_grad_(True)
    loss = fn(e, *args)
    (g,) = torch.autograd.grad(loss, e)
    return loss.detach(), g


# ====================================================================== SmoothAPLoss (PML)
def smooth_ap_batch_oracle(emb, labels, tau):
    """Loops: each embedding a query against the whole batch by cosine similarity, its
    positives the items with its label, itself included (docs/spec.md §2.10); mean over the batch."""
    e = F.normalize(emb.double(), dim=1)
    sim, lab = (e @ e.t()).tolist(), labels.tolist()
    losses = [smooth_ap_query(sim[q], [lab[j] == lab[q] for j in range(len(lab))], tau) for q in range(len(lab))]
    return sum(losses) / len(losses)


# batches where PML groups by label: as many items per class as classes, classes contiguous
PML_LAYOUTS = [
    [0],
    [0, 0, 1, 1],
    [1, 1, 0, 0],
    [9, 9, 4, 4],
    [2, 2, 2, 0, 0, 0, 1, 1, 1],
    [c for c in range(4) for _ in range(4)],
    [c for c in (5, 3, 0, 1, 2, 4) for _ in range(6)],
]


@needs_pml
@pytest.mark.parametrize("labels", PML_LAYOUTS)
@pytest.mark.parametrize("temperature", [0.01, 0.1, 1.0])
def test_smooth_ap_matches_pml(labels, temperature, float64_default):
    labels = torch.tensor(labels)
    emb = embeddings(len(labels), seed=len(labels))
    ours = grad_of(SmoothAPLoss(temperature), emb, labels)
    theirs = grad_of(PMLSmoothAPLoss(temperature=temperature), emb, labels)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-10, atol=1e-13)


@needs_pml
def test_smooth_ap_matches_pml_float32():
    labels = torch.tensor([c for c in range(8) for _ in range(8)])
    emb = embeddings(64, d=16, seed=1, dtype=torch.float32)
    ours = grad_of(SmoothAPLoss(0.01), emb, labels)
    theirs = grad_of(PMLSmoothAPLoss(temperature=0.01), emb, labels)
    assert ours[0].dtype == torch.float32
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("labels", PML_LAYOUTS + [
    [0, 0, 0, 0, 1, 1, 1, 1],                      # PML accepts, groups in blocks of 2
    [0, 1, 0, 1],                                  # PML accepts, groups in blocks of 2
    [c for c in range(8) for _ in range(4)],       # PML's own input (4 per class): blocks of 8
    [3, 1, 3, 2, 2, 1, 3, 0],                      # PML refuses: classes of 3, 2, 2, 1
    [5, 5, 5, 5, 5, 7],                            # PML refuses
    [4, 4, 4],                                     # one class
])
def test_smooth_ap_matches_loop_oracle_for_any_labels(labels):
    labels = torch.tensor(labels)
    emb = embeddings(len(labels), seed=2)
    for temperature in (0.01, 0.3):
        got = SmoothAPLoss(temperature)(emb, labels)
        assert got.dtype == torch.float64
        assert got.item() == pytest.approx(smooth_ap_batch_oracle(emb, labels, temperature), rel=1e-10, abs=1e-12)
    # relabelling and reordering the batch change nothing
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(SmoothAPLoss(0.05)(emb[perm], labels[perm] * 7 + 1),
                               SmoothAPLoss(0.05)(emb, labels), rtol=1e-12, atol=1e-14)


@needs_pml
@pytest.mark.skipif(pytorch_metric_learning is not None and not pytorch_metric_learning.__version__.startswith("2.9"),
                    reason="characterises pytorch-metric-learning 2.9's grouping")
def test_pml_groups_blocks_of_as_many_items_as_classes(float64_default):
    """What PML 2.9 computes outside the square layouts (why docs/porting.md warns): its
    positives are the blocks of U consecutive items, U = the number of distinct labels;
    and it refuses classes of different sizes, which the adapter takes."""
    for labels in ([0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 0, 1], [c for c in range(8) for _ in range(4)]):
        labels = torch.tensor(labels)
        b, u = len(labels), len(labels.unique())
        emb = embeddings(b, seed=4)
        e = F.normalize(emb, dim=1)
        blocks = torch.arange(b) // u
        pml_value = PMLSmoothAPLoss(temperature=0.05)(emb, labels)
        on_blocks = fastrank.smooth_ap_loss(e @ e.t(), blocks[:, None] == blocks[None, :], 0.05, "i2t")
        torch.testing.assert_close(pml_value, on_blocks, rtol=1e-12, atol=1e-14)
        assert abs(pml_value.item() - SmoothAPLoss(0.05)(emb, labels).item()) > 1e-3
    with pytest.raises(ValueError, match="same number of elements"):
        PMLSmoothAPLoss()(embeddings(4), torch.tensor([0, 0, 0, 1]))


def test_smooth_ap_adapter_edge_cases_and_half():
    # one embedding: AP = 1, loss 0
    assert SmoothAPLoss()(embeddings(1), torch.tensor([3])).item() == 0.0
    # half precision: computed in float32, the gradient in the input dtype
    emb = embeddings(16, seed=5).half().requires_grad_(True)
    labels = torch.arange(16) // 4
    loss = SmoothAPLoss(0.1)(emb, labels)
    loss.backward()
    assert loss.dtype == torch.float32 and emb.grad.dtype == torch.float16
    assert loss.item() == pytest.approx(smooth_ap_batch_oracle(emb.detach().double(), labels, 0.1), abs=1e-3)
    assert "temperature=0.1" in repr(SmoothAPLoss(0.1))


@pytest.mark.parametrize("call,exc,match", [
    (lambda: SmoothAPLoss(0.0), ValueError, "temperature"),
    (lambda: SmoothAPLoss(impl="fast"), ValueError, "impl"),
    (lambda: SmoothAPLoss()(torch.rand(4), torch.arange(4)), ValueError, "embeddings"),
    (lambda: SmoothAPLoss()(torch.rand(4, 3), torch.rand(4)), TypeError, "labels"),
    (lambda: SmoothAPLoss()(torch.rand(4, 3), torch.arange(3)), ValueError, "labels"),
    (lambda: SmoothAPLoss()(torch.rand(4, 3), [0, 0, 1, 1]), TypeError, "labels"),
    (lambda: SmoothAPLoss()(torch.rand(4, 3), torch.arange(4), indices_tuple=(1, 2, 3)), ValueError, "indices_tuple"),
    (lambda: SmoothAPLoss()(torch.rand(4, 3), torch.arange(4), ref_emb=torch.rand(4, 3)), ValueError, "ref_emb"),
])
def test_smooth_ap_adapter_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ====================================================================== RecallatK (the authors')
def authors_recall_at_k(preds, q_id, anneal, batch_size, num_id, k_vals, k_temperatures):
    """The authors' ``RecallatK.forward(preds, q_id)`` (yash0307/RecallatK_surrogate,
    src/losses.py, MIT licence, Copyright (c) 2021 Yash Patel), re-typed step by step for
    the CPU: same operations in the same order, their clamp of the sigmoid's exponent to
    [-50, 50], their float32 ``torch.Tensor`` constants, their in-place zeroing."""
    def clamped_sigmoid(x, temp):
        return 1.0 / (1.0 + torch.exp(torch.clamp(-x / temp, min=-50, max=50)))

    ks = [min(batch_size, k) for k in k_vals]             # capped in their __init__
    b = preds.shape[0]
    per = b // num_id                                     # samples per class
    norm = torch.tensor([min(k, per - 1) for k in ks], dtype=torch.float32)
    group = q_id // per
    s = (preds[q_id] * preds).sum(1)                      # the query against the batch, itself included
    s_group = s.view(num_id, per)[group]                  # the query's class, itself included
    sg = clamped_sigmoid(s.unsqueeze(-1) - s_group.unsqueeze(0).repeat(b, 1), anneal)   # [k, i]: s_k - s_i
    for i in range(per):
        sg[group * per + i, i] = 0.0                      # no item outranks itself
    rank = (1.0 + sg.sum(0)).unsqueeze(0)                 # (1, per): ranks among the whole batch
    rank[:, q_id % per] = 0.0
    rank = rank.unsqueeze(-1).repeat(1, 1, len(ks))
    kt = torch.tensor(ks, dtype=torch.float32).unsqueeze(0).unsqueeze(0).repeat(1, per, 1)
    x = kt - rank
    for i in range(len(ks)):
        x[:, :, i] = clamped_sigmoid(x[:, :, i], float(k_temperatures[i]))
    x[:, q_id % per, :] = 0.0                             # the query is not its own positive
    recall = torch.minimum(x.sum(1), torch.tensor(ks, dtype=torch.float32).unsqueeze(0))
    recall = recall.sum(0) / norm
    recall = recall.sum() / len(ks)
    return (1.0 - recall) / b


def authors_batch(preds, **kw):
    """Their training loop: the sum over every query of the batch."""
    return sum(authors_recall_at_k(preds, q, **kw) for q in range(preds.shape[0]))


def unit(b, d=16, seed=0, dtype=torch.float64):
    return F.normalize(embeddings(b, d, seed, dtype), dim=1)   # their network's output is L2-normalised


AUTHORS_CASES = [  # (num_id, per class, anneal, k_vals, k_temperatures)
    (2, 2, 0.01, (1, 2, 4, 8, 16), (1, 2, 4, 8, 16)),          # every k but 1 capped at B = 4
    (3, 4, 0.01, (1, 2, 4, 8, 16), (1, 2, 4, 8, 16)),
    (8, 4, 0.05, (1, 2, 4, 8), (1.0, 1.0, 2.0, 2.0)),
    (5, 2, 1e-3, (1, 2), (1, 2)),                              # most rank sigmoids past the clamp
    (4, 6, 0.5, (2, 5), (0.5, 8)),
]


@pytest.mark.parametrize("num_id,per,anneal,k_vals,k_temps", AUTHORS_CASES)
def test_recall_at_k_matches_authors(num_id, per, anneal, k_vals, k_temps):
    b = num_id * per
    preds = unit(b, seed=b)
    kw = dict(anneal=anneal, batch_size=b, num_id=num_id, k_vals=k_vals, k_temperatures=k_temps)
    ours_fn = RecallatK(anneal, b, num_id, 16, k_vals, k_temps, False)
    ours = grad_of(ours_fn, preds)
    theirs = grad_of(lambda p: authors_batch(p, **kw), preds)
    assert ours[0].dtype == torch.float64
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-10, atol=1e-12)
    # their one-query call
    for q in (0, b - 1, b // 2):
        one = grad_of(lambda p: ours_fn(p, q), preds)
        ref = grad_of(lambda p: authors_recall_at_k(p, q, **kw), preds)
        torch.testing.assert_close(one[0], ref[0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(one[1], ref[1], rtol=1e-10, atol=1e-12)


def test_recall_at_k_authors_float32_and_unnormalised():
    """Scores are plain dot products, as theirs (no normalisation of their input)."""
    preds = embeddings(12, d=8, seed=6, dtype=torch.float32) * 0.3
    kw = dict(anneal=0.05, batch_size=12, num_id=3, k_vals=(1, 2, 4), k_temperatures=(1, 2, 4))
    ours = RecallatK(0.05, 12, 3, None, (1, 2, 4), (1, 2, 4))(preds)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, authors_batch(preds, **kw), rtol=1e-5, atol=1e-6)


def recall_batch_oracle(preds, labels, anneal, ks, tau_k):
    """Loops, docs/spec.md §2.10 as read above: each query's list is the whole batch (itself
    included), its positives the other items of its label; the sum over queries / B."""
    sim, lab = (preds.double() @ preds.double().t()).tolist(), labels.tolist()
    b = len(lab)
    total = 0.0
    for q in range(b):
        loss = recall_at_k_query(sim[q], [lab[j] == lab[q] and j != q for j in range(b)], anneal, ks, tau_k)
        total += 0.0 if loss is None else loss
    return total / b


@pytest.mark.parametrize("labels", [
    [0, 0, 1, 1, 1, 2, 2, 2, 2, 2],       # classes of different sizes
    [3, 1, 3, 2, 2, 1, 3, 0, 0, 1],       # any order
    [0, 1, 2, 3, 0],                      # singletons: no positive, they add 0
    [7] * 6,
])
def test_recall_at_k_any_labels_matches_loop_oracle(labels):
    labels = torch.tensor(labels)
    preds = unit(len(labels), seed=7)
    ks, temps = (1, 2, 4), (1.0, 2.0, 4.0)
    got = RecallatK(0.05, k_vals=ks, k_temperatures=temps)(preds, labels=labels)
    assert got.item() == pytest.approx(recall_batch_oracle(preds, labels, 0.05, ks, temps), rel=1e-10, abs=1e-12)
    # their layout as labels gives their result
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(RecallatK(0.05, k_vals=ks, k_temperatures=temps)(preds[perm], labels=labels[perm]),
                               got, rtol=1e-12, atol=1e-14)


def test_recall_at_k_authors_layout_equals_labels_and_singletons():
    preds = unit(12, seed=9)
    by_layout = RecallatK(0.05, num_id=4)(preds)
    by_labels = RecallatK(0.05)(preds, labels=torch.arange(12) // 3)
    torch.testing.assert_close(by_layout, by_labels, rtol=0, atol=0)
    # one item per class: their code divides 0 by 0; here every query adds 0
    assert torch.isnan(authors_recall_at_k(preds[:4], 0, 0.05, 4, 4, (1, 2), (1, 2)))
    assert RecallatK(0.05, num_id=4, k_vals=(1, 2), k_temperatures=(1, 2))(preds[:4]).item() == 0.0


@pytest.mark.parametrize("call,exc,match", [
    (lambda: RecallatK(0.0), ValueError, "anneal"),
    (lambda: RecallatK(0.01, 10, 3), ValueError, "batch_size"),
    (lambda: RecallatK(0.01, k_vals=()), ValueError, "ks"),
    (lambda: RecallatK(0.01, k_vals=(1, 2), k_temperatures=(1, 2, 4)), ValueError, "tau_k"),
    (lambda: RecallatK(0.01, mixup=True), ValueError, "mixup"),
    (lambda: RecallatK(0.01)(unit(4)), ValueError, "num_id"),
    (lambda: RecallatK(0.01, num_id=3)(unit(4)), ValueError, "num_id"),
    (lambda: RecallatK(0.01, num_id=2)(unit(4), 4), ValueError, "q_id"),
    (lambda: RecallatK(0.01, num_id=2)(unit(4), -1), ValueError, "q_id"),
    (lambda: RecallatK(0.01)(unit(4), labels=torch.zeros(4)), TypeError, "labels"),
    (lambda: RecallatK(0.01)(unit(4), labels=torch.zeros(3, dtype=torch.long)), ValueError, "labels"),
    (lambda: RecallatK(0.01)(torch.rand(4), labels=torch.zeros(4, dtype=torch.long)), ValueError, "preds"),
])
def test_recall_at_k_adapter_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
