"""fastrank.models hf_text / hf_vision / cnn: tiny random transformers configs saved with
save_pretrained into a temporary directory and loaded back by path (weights by name, no
download), shapes, gradient flow, freezing, pooling choices, bad input."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from PIL import Image  # noqa: E402


def _pil(tf, name):
    """The PIL-backend image processor class (transformers 5 names it <name>Pil; 4.x has the plain one)."""
    return getattr(tf, name + "Pil", None) or getattr(tf, name)

from fastrank.models import (VSE, HFTextEncoder, HFVisionEncoder, build_image_encoder,  # noqa: E402
                             build_text_encoder)

E = 8
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog", "runs", "in", "the", "park", "two",
         "cats", "sleep", ".", "man", "red", "on"]
CAPTIONS = ["A dog runs in the park.", "Two cats sleep.", "A man on a red dog."]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> directory of a tiny random model (+ tokenizer / image processor)."""
    root = tmp_path_factory.mktemp("hf")
    tf = transformers
    out = {}
    out["bert"] = root / "bert"
    tf.BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(out["bert"])
    tf.BertModel(tf.BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32, max_position_embeddings=32)).save_pretrained(out["bert"])
    out["vit"] = root / "vit"
    tf.ViTModel(tf.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                             image_size=32, patch_size=8)).save_pretrained(out["vit"])
    _pil(tf, "ViTImageProcessor")(size={"height": 32, "width": 32}).save_pretrained(out["vit"])
    out["resnet"] = root / "resnet"
    tf.ResNetModel(tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 12], depths=[1, 1],
                                   layer_type="basic")).save_pretrained(out["resnet"])
    _pil(tf, "ConvNextImageProcessor")(size={"shortest_edge": 32}, crop_pct=1.0).save_pretrained(out["resnet"])
    out["clip"] = root / "clip"
    tf.CLIPVisionModel(tf.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=32, patch_size=8)
                       ).save_pretrained(out["clip"])
    _pil(tf, "CLIPImageProcessor")(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
                             ).save_pretrained(out["clip"])
    return {k: str(v) for k, v in out.items()}


def pil_images(n, seed=0, size=(40, 30)):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(n)]


# ------------------------------------------------------------------ text
@pytest.mark.parametrize("pooling", ["gpo", "mean", "cls"])
def test_hf_text_shapes_and_gradients(models, pooling):
    torch.manual_seed(0)
    enc = build_text_encoder("hf_text", None, E, model=models["bert"], pooling=pooling)
    assert isinstance(enc, HFTextEncoder) and enc.in_dim == 16 and enc.embed_dim == E
    out = enc(CAPTIONS)
    assert out.shape == (3, E) and torch.isfinite(out).all()
    out.square().sum().backward()
    bert_grads = [p.grad for p in enc.model.parameters() if p.requires_grad]
    assert bert_grads and any(g is not None and g.abs().sum() > 0 for g in bert_grads)
    assert enc.proj.weight.grad.abs().sum() > 0


def test_hf_text_name_in_encoder_name_and_padding_invariance(models):
    torch.manual_seed(0)
    enc = build_text_encoder(f"hf_text:{models['bert']}", embed_dim=E, pooling="mean").eval()
    both = enc(CAPTIONS)
    alone = torch.cat([enc([c]) for c in CAPTIONS])    # no padding when alone
    torch.testing.assert_close(both, alone, rtol=1e-5, atol=1e-5)
    ids, mask = enc.tokenize(CAPTIONS)
    torch.testing.assert_close(enc(ids, mask), both)
    torch.testing.assert_close(enc(ids, mask.sum(1)), both)


def test_hf_text_frozen(models):
    enc = build_text_encoder("hf_text", None, E, model=models["bert"], finetune=False)
    enc.train()
    assert not enc.model.training and enc.proj.training
    assert not any(p.requires_grad for p in enc.model.parameters())
    out = enc(CAPTIONS)
    out.sum().backward()
    assert enc.proj.weight.grad is not None
    assert all(p.grad is None for p in enc.model.parameters())


def test_hf_text_bad_input(models):
    with pytest.raises(ValueError, match="model="):
        build_text_encoder("hf_text", None, E)
    with pytest.raises(ValueError, match="pooling"):
        build_text_encoder("hf_text", None, E, model=models["bert"], pooling="max")
    with pytest.raises(ValueError, match="in_dim"):
        build_text_encoder("hf_text", 17, E, model=models["bert"])
    with pytest.raises(ValueError, match="do not pass model"):
        build_text_encoder(f"hf_text:{models['bert']}", None, E, model=models["bert"])
    with pytest.raises(TypeError, match="finetune"):
        build_text_encoder("hf_text", None, E, model=models["bert"], finetune="yes")
    enc = build_text_encoder("hf_text", None, E, model=models["bert"])
    with pytest.raises(TypeError, match="captions"):
        enc([])
    with pytest.raises(TypeError, match="captions"):
        enc(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="lengths"):
        enc(CAPTIONS, torch.tensor([1, 2, 3]))
    loaded = transformers.AutoModel.from_pretrained(models["bert"])
    with pytest.raises(ValueError, match="tokenizer="):
        HFTextEncoder(None, E, model=loaded)
    with pytest.raises(TypeError, match="model must be"):
        HFTextEncoder(None, E, model=123, tokenizer=models["bert"])


# ------------------------------------------------------------------ vision
VISION = [("vit", "gpo"), ("vit", "cls"), ("vit", "pooled"), ("resnet", "gpo"), ("resnet", "mean"),
          ("resnet", "max"), ("resnet", "pooled"), ("clip", "pooled"), ("clip", "mean")]


@pytest.mark.parametrize("name,pooling", VISION)
def test_hf_vision_pil_and_pixels(models, name, pooling):
    torch.manual_seed(0)
    enc = build_image_encoder(f"hf_vision:{models[name]}", None, E, pooling=pooling)
    assert isinstance(enc, HFVisionEncoder)
    imgs = pil_images(3)
    out = enc(imgs)
    assert out.shape == (3, E) and torch.isfinite(out).all()
    out.square().sum().backward()
    grads = [p.grad for p in enc.model.parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    enc.eval()
    pixels = enc.backbone.preprocess(imgs)
    assert pixels.shape == (3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(enc(imgs), enc(pixels))
        flat = build_image_encoder("hf_vision", 3 * 32 * 32, E, model=models[name], pooling=pooling)
        flat.load_state_dict(enc.state_dict())
        flat.eval()
        torch.testing.assert_close(flat(pixels.flatten(1)), enc(pixels))


def test_hf_vision_full_clip_checkpoint_uses_its_vision_tower(tmp_path):
    tf = transformers
    cfg = tf.CLIPConfig(text_config=dict(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=16),
                        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=32, patch_size=8),
                        projection_dim=8)
    tf.CLIPModel(cfg).save_pretrained(tmp_path)
    enc = build_image_encoder("hf_vision", None, E, model=str(tmp_path), processor=False, pooling="pooled")
    assert enc(torch.randn(2, 3, 32, 32)).shape == (2, E)
    assert not any(n.startswith("backbone.model.text") for n, _ in enc.named_parameters())


def test_hf_vision_frozen_and_state_dict_holds_the_backbone_once(models):
    enc = build_image_encoder("hf_vision", None, E, model=models["resnet"], finetune=False)
    enc.train()
    assert not enc.model.training and not any(p.requires_grad for p in enc.model.parameters())
    enc(torch.randn(2, 3, 32, 32)).sum().backward()
    assert enc.proj.weight.grad is not None
    keys = list(enc.state_dict())
    assert not any(k.startswith("model.") for k in keys) and any(k.startswith("backbone.model.") for k in keys)


def test_hf_vision_in_a_vse_with_hf_text(models):
    torch.manual_seed(0)
    vse = VSE(build_image_encoder("hf_vision", None, E, model=models["vit"], pooling="mean"),
              build_text_encoder("hf_text", None, E, model=models["bert"], pooling="mean"))
    out = vse(pil_images(2), CAPTIONS)
    assert out.sim.shape == (2, 3)
    torch.testing.assert_close(out.img_emb.norm(dim=1), torch.ones(2))


def test_hf_vision_bad_input(models):
    with pytest.raises(ValueError, match="model="):
        build_image_encoder("hf_vision", None, E)
    with pytest.raises(ValueError, match="class token"):
        build_image_encoder("hf_vision", None, E, model=models["resnet"], pooling="cls")
    with pytest.raises(ValueError, match="pooling"):
        build_image_encoder("hf_vision", None, E, model=models["vit"], pooling="sum")
    with pytest.raises(ValueError, match="in_dim"):
        build_image_encoder("hf_vision", 100, E, model=models["vit"])
    enc = build_image_encoder("hf_vision", None, E, model=models["vit"])
    with pytest.raises(ValueError, match="in_dim"):
        enc(torch.randn(2, 3 * 32 * 32))
    with pytest.raises(ValueError, match="channels"):
        enc(torch.randn(2, 1, 32, 32))
    with pytest.raises(ValueError, match="lengths"):
        enc(torch.randn(2, 3, 32, 32), torch.tensor([1, 1]))
    with pytest.raises(TypeError, match="PIL"):
        enc("image.jpg")
    bare = build_image_encoder("hf_vision", None, E, model=transformers.AutoModel.from_pretrained(models["vit"]))
    with pytest.raises(ValueError, match="no image processor"):
        bare(pil_images(1))


# ------------------------------------------------------------------ the small CNN
@pytest.mark.parametrize("pooling", ["mean", "max", "gpo"])
def test_cnn_shapes_gradients_and_flat_input(pooling):
    torch.manual_seed(0)
    enc = build_image_encoder("cnn", 3 * 16 * 16, E, widths=(4, 8), pooling=pooling)
    x = torch.randn(5, 3, 16, 16)
    out = enc(x)
    assert out.shape == (5, E)
    out.square().sum().backward()
    assert all(p.grad is not None for p in enc.parameters())
    enc.eval()
    torch.testing.assert_close(enc(x.flatten(1)), enc(x))


def test_cnn_bad_input():
    with pytest.raises(ValueError, match="in_dim"):
        build_image_encoder("cnn", 3 * 16 * 16 + 1, E)
    with pytest.raises(ValueError, match="pooling"):
        build_image_encoder("cnn", None, E, pooling="cls")
    with pytest.raises(ValueError, match="widths"):
        build_image_encoder("cnn", None, E, widths=(4, 0))
    enc = build_image_encoder("cnn", None, E, widths=(4,))
    with pytest.raises(ValueError, match="in_dim"):
        enc(torch.randn(2, 3 * 16 * 16))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        enc(torch.randn(2, 5, 3, 16, 16))


# ------------------------------------------------------------------ through the reference trainer
def test_trainer_fine_tunes_hf_vision_and_hf_text_on_demo_pixels(models, tmp_path):
    """The reference trainer with a pixel backbone and a BERT text encoder (DVSE's setting), both
    named by path in the config: one epoch trains both, and the checkpoint evaluates again."""
    from fastrank.train import Trainer, load_config
    from fastrank.train.loop import evaluate_checkpoint
    cfg = load_config(None, **{
        "data.path": "demo_pixels", "data.demo_n_train": 32, "data.demo_n_test": 12,
        "model.image_encoder": f"hf_vision:{models['vit']}", "model.image_kw": {"pooling": "mean"},
        "model.text_encoder": f"hf_text:{models['bert']}", "model.text_kw": {"pooling": "cls"},
        "model.embed_dim": E, "relevance.source": "none", "loss.spec": "triplet:1.0",
        "train.batch_size": 16, "train.epochs": 1, "train.progress": False, "train.out_dir": str(tmp_path),
        "eval.cs_k": [5]})
    tr = Trainer(cfg)
    vit_before = {k: v.clone() for k, v in tr.model.image_encoder.model.state_dict().items()}
    bert_before = {k: v.clone() for k, v in tr.model.text_encoder.model.state_dict().items()}
    rec = tr.fit()[0]
    assert "rsum" in rec
    assert any(not torch.equal(v, vit_before[k]) for k, v in tr.model.image_encoder.model.state_dict().items())
    assert any(not torch.equal(v, bert_before[k]) for k, v in tr.model.text_encoder.model.state_dict().items())
    res = evaluate_checkpoint(tmp_path / "best.pt", graded=False)
    assert res["rsum"] == pytest.approx(rec["rsum"])
