"""open_clip's ``ClipLoss``, plus an optional fastrank listwise term.

open_clip (https://github.com/mlfoundations/open_clip, ``src/open_clip/loss.py``) trains
CLIP with the symmetric InfoNCE loss of a batch of N image-text pairs:

    logits = logit_scale * image_features @ text_features.T (+ logit_bias)
    loss   = (CE(logits, arange(N)) + CE(logits.T, arange(N))) / 2

:class:`ClipLoss` has the same constructor and call (``loss(image_features,
text_features, logit_scale, logit_bias=None, output_dict=False)``, which is how
open_clip's training loop calls it: ``loss(**model_out, output_dict=True)``) and returns
the same value. On top of it, ``listwise_weight > 0`` adds a graded ranking term of
fastrank (smooth-NDCG, Listwise ITR, or Kendall, BCLS) on the similarity matrix
``image_features @ text_features.T``, with the (N, N) relevance of the batch either
passed in (``relevance=``) or computed from the batch's captions (``captions=``) with a
:class:`fastrank.relevance.CaptionEncoder` (RSC, Listwise ITR Eq. 8). With
``from_embeddings=True`` the InfoNCE loss and smooth-NDCG on a :class:`fastrank.TopKRelevance`
are computed together from the features, block by block
(:func:`fastrank.contrastive_smooth_ndcg_loss_from_embeddings`): no (N, N) logits, similarity
or relevance at all.
"""
from __future__ import annotations

import inspect
import math
import numbers
from collections import abc
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _validation as V
from ..ops.contrastive_smooth_ndcg import both_terms, contrastive_smooth_ndcg_loss_from_embeddings
from ..ops.from_embeddings import smooth_ndcg_loss_from_embeddings
from ..ops.registry import compat_losses
from ..topk import TopKRelevance

__all__ = ["ClipLoss", "LISTWISE_LOSSES"]

#: the listwise terms (graded relevance, with a mask): the table's rows marked "open_clip"
LISTWISE_LOSSES = {name: row.functional for name, row in compat_losses("open_clip").items()}
_DATA_ARGS = ("sim", "relevance", "mask")


def original_loss_module():
    """open_clip's own ``loss.py`` (its ClipLoss, SigLipLoss) as a module when open_clip_torch is
    installed, else None: what the parity tests and the benchmarks compare against. The file
    needs only torch, so it is loaded alone: open_clip's ``__init__`` imports torchvision, which
    fails beside a torch it was not built for (install open_clip_torch with ``--no-deps``)."""
    import importlib.util
    import pathlib
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "loss.py"
    if not path.exists():
        return None
    mod_spec = importlib.util.spec_from_file_location("_open_clip_loss_original", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def _listwise_params(name: str) -> set:
    sig = inspect.signature(LISTWISE_LOSSES[name])
    return {p for p in sig.parameters if p not in _DATA_ARGS}


class ClipLoss(torch.nn.Module):
    """Drop-in for ``open_clip.loss.ClipLoss`` with an optional fastrank listwise term.

    Args (open_clip's):
        local_loss, gather_with_grad, use_horovod, rank: multi-process options, kept for
            the signature; only ``world_size=1`` is supported (for data-parallel
            training of fastrank's losses see :class:`fastrank.distributed.LocalLoss`).
        cache_labels: cache the ``arange`` labels per device, as open_clip does.
        world_size: must be 1.
    Args (fastrank's, keyword only):
        listwise_weight: weight of the listwise term (>= 0; 0 = exactly open_clip's loss).
        listwise: ``"smooth_ndcg"`` (default) or ``"kendall"``.
        caption_encoder: object with ``encode(captions) -> (N, D) tensor`` used for
            ``captions=`` (default: a :class:`fastrank.relevance.CaptionEncoder`, the bundled
            all-MiniLM-L6-v2, created on first use).
        **listwise_kwargs: passed to the listwise loss (``tau=`` for smooth-NDCG,
            ``alpha=`` for Kendall, ``direction=``, ``reduction=``, ``impl=``).
        from_embeddings: compute InfoNCE and smooth-NDCG together from the features, a block
            of queries at a time, never the (N, N) matrix
            (:func:`fastrank.contrastive_smooth_ndcg_loss_from_embeddings`): needs
            ``listwise="smooth_ndcg"`` and ``relevance=`` a :class:`fastrank.TopKRelevance` in
            the call; listwise_kwargs ``tau=``, ``block=``, ``impl=``. Same value and gradients.

    ``forward(image_features, text_features, logit_scale, logit_bias=None,
    output_dict=False, *, relevance=None, captions=None)``:
    image_features and text_features are (N, D) (pair i = image i, text i); logit_scale
    a number or a scalar tensor (already exponentiated, as open_clip's model returns it).
    With the listwise term on, pass ``relevance`` ((N, N), relevance[i, j] of text j to
    image i, e.g. from :class:`fastrank.relevance.BatchRelevance`) or ``captions`` (the N
    caption strings of the batch: r = (1 + cos) / 2 of their sentence embeddings, 1 on the
    diagonal). Returns ``contrastive + listwise_weight * listwise``, or with
    ``output_dict=True`` ``{"contrastive_loss": ..., "listwise_loss": weighted term}``
    (the second key only when the term is on), which open_clip's loop sums.
    """

    def __init__(self, local_loss: bool = False, gather_with_grad: bool = False,
                 cache_labels: bool = False, rank: int = 0, world_size: int = 1,
                 use_horovod: bool = False, *, listwise_weight: float = 0.0,
                 listwise: str = "smooth_ndcg", caption_encoder=None, from_embeddings: bool = False,
                 **listwise_kwargs):
        super().__init__()
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size != 1:
            raise ValueError(
                f"world_size must be 1: fastrank.compat.ClipLoss is the single-process loss, got "
                f"{world_size!r}; for data-parallel training see fastrank.distributed.LocalLoss")
        if use_horovod:
            raise ValueError("use_horovod=True is not supported (world_size must be 1)")
        self.local_loss = bool(local_loss)
        self.gather_with_grad = bool(gather_with_grad)
        self.cache_labels = bool(cache_labels)
        self.rank = rank
        self.world_size = world_size
        self.use_horovod = bool(use_horovod)
        self.prev_num_logits = 0
        self.labels = {}

        self.listwise_weight = V.check_nonnegative(listwise_weight, "listwise_weight")
        self.listwise = V.check_choice(listwise, "listwise", tuple(LISTWISE_LOSSES))
        if not isinstance(from_embeddings, bool):
            raise TypeError(f"from_embeddings must be True or False, got {from_embeddings!r}")
        if from_embeddings and self.listwise != "smooth_ndcg":
            raise ValueError(f"from_embeddings=True computes smooth-NDCG with InfoNCE from the features: it "
                             f"needs listwise='smooth_ndcg', got {self.listwise!r}")
        self.from_embeddings = from_embeddings
        allowed = {"tau", "block", "impl"} if from_embeddings else _listwise_params(self.listwise)
        unknown = sorted(set(listwise_kwargs) - allowed)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {unknown} for listwise={self.listwise!r}; "
                            f"it takes {sorted(allowed)}")
        self.listwise_kwargs = dict(listwise_kwargs)
        if caption_encoder is not None and (isinstance(caption_encoder, (str, bytes))
                                            or not callable(getattr(caption_encoder, "encode", None))):
            raise TypeError("caption_encoder must be an object with an encode(captions) method, e.g. "
                            "fastrank.relevance.CaptionEncoder('all-MiniLM-L6-v2'), got "
                            f"{type(caption_encoder).__name__}")
        self.caption_encoder = caption_encoder

    # ------------------------------------------------------------------ open_clip's parts
    def get_ground_truth(self, device, num_logits: int) -> Tensor:
        if self.prev_num_logits != num_logits or device not in self.labels:
            labels = torch.arange(num_logits, device=device, dtype=torch.long)
            if self.cache_labels:
                self.labels[device] = labels
                self.prev_num_logits = num_logits
        else:
            labels = self.labels[device]
        return labels

    def get_logits(self, image_features: Tensor, text_features: Tensor, logit_scale,
                   logit_bias=None):
        logits_per_image = logit_scale * image_features @ text_features.T
        logits_per_text = logit_scale * text_features @ image_features.T
        if logit_bias is not None:
            logits_per_image = logits_per_image + logit_bias
            logits_per_text = logits_per_text + logit_bias
        return logits_per_image, logits_per_text

    # ------------------------------------------------------------------ fastrank's part
    def batch_relevance(self, captions: Sequence[str], device, dtype) -> Tensor:
        """(N, N) RSC relevance of a batch's captions (Listwise ITR Eq. 8), on ``device``."""
        from ..relevance import CaptionEncoder, relevance_matrix

        if self.caption_encoder is None:
            self.caption_encoder = CaptionEncoder()
        emb = self.caption_encoder.encode(captions)
        if not isinstance(emb, Tensor):
            emb = torch.as_tensor(emb)
        emb = emb.to(device)
        return relevance_matrix(emb, emb).to(dtype)

    # ------------------------------------------------------------------ validation
    # Structure of every argument first (types, shapes, devices), then the values: the
    # errors name the caller's arguments (image_features, text_features, logit_scale,
    # relevance, captions), never the internal sim = image_features @ text_features.T.
    @staticmethod
    def _check_features(image_features, text_features) -> None:
        V.check_tensor(image_features, "image_features", 2, finite=False)
        V.check_tensor(text_features, "text_features", 2, finite=False)
        if text_features.device != image_features.device:
            raise ValueError(f"text_features is on {text_features.device} but image_features is on "
                             f"{image_features.device}")
        if text_features.shape != image_features.shape:
            raise ValueError(f"image_features and text_features must be (N, D) features of N image-text "
                             f"pairs with the same shape, got {tuple(image_features.shape)} and "
                             f"{tuple(text_features.shape)}")

    @staticmethod
    def _check_scalar(value, name: str, features: Tensor) -> None:
        """logit_scale / logit_bias: a number, or a one-element real tensor that torch can
        combine with the features (on their device, or a 0-d CPU tensor)."""
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise ValueError(f"{name} must be a number or a one-element tensor, got shape "
                                 f"{tuple(value.shape)}")
            if value.dtype == torch.bool or value.dtype.is_complex:
                raise TypeError(f"{name} must be a real tensor, got {value.dtype}")
            if value.device != features.device and not (value.device.type == "cpu" and value.dim() == 0):
                raise ValueError(f"{name} is on {value.device} but image_features is on {features.device}")
        elif isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")

    def _check_listwise_args(self, image_features: Tensor, relevance, captions) -> None:
        n = image_features.shape[0]
        if self.from_embeddings:
            if not isinstance(relevance, TopKRelevance):
                raise TypeError(f"relevance must be a fastrank.TopKRelevance of the batch (from_embeddings=True "
                                f"never makes an (N, N) matrix), got {type(relevance).__name__}")
            if captions is not None:
                raise ValueError("captions: from_embeddings=True takes relevance= (a fastrank.TopKRelevance), "
                                 "not captions")
            return
        if relevance is None:
            if captions is None:
                raise ValueError("listwise_weight > 0 needs relevance= (an (N, N) tensor) or captions= "
                                 "(the batch's N caption strings) in the call")
            if isinstance(captions, (str, bytes)) or not isinstance(captions, abc.Sequence):
                raise ValueError(f"captions must be a list of the batch's {n} caption strings, got "
                                 f"{type(captions).__name__}")
            if len(captions) != n:
                raise ValueError(f"captions must be a list of the batch's {n} caption strings, "
                                 f"got {type(captions).__name__} of length {len(captions)}")
            for i, c in enumerate(captions):
                if not isinstance(c, str):
                    raise TypeError(f"captions[{i}] must be a str, got {type(c).__name__}")
            return
        if captions is not None:
            raise ValueError("pass relevance= or captions=, not both")
        V.check_tensor(relevance, "relevance", 2, finite=False)
        if tuple(relevance.shape) != (n, n):
            raise ValueError(f"relevance must have shape (N, N) = {(n, n)} (row i: image i, column j: "
                             f"text j of the batch), got {tuple(relevance.shape)}")
        if relevance.device != image_features.device:
            raise ValueError(f"relevance is on {relevance.device} but image_features is on "
                             f"{image_features.device}")

    @staticmethod
    def _check_values(image_features: Tensor, text_features: Tensor, logit_scale=None) -> None:
        """NaN/inf where the value check is on (docs/spec.md §1: CPU by default, CUDA only when
        switched on); relevance's values (NaN/inf, range) are checked by the listwise loss,
        under its own name."""
        if not V.check_finite_enabled(image_features.device):
            return
        V.check_finite(image_features, "image_features")
        V.check_finite(text_features, "text_features")
        if logit_scale is not None and not math.isfinite(float(logit_scale.detach() if isinstance(logit_scale, Tensor)
                                                                 else logit_scale)):
            raise ValueError(f"logit_scale must be finite, got {float(logit_scale)}")

    def listwise_loss(self, image_features: Tensor, text_features: Tensor,
                      relevance: Optional[Tensor] = None,
                      captions: Optional[Sequence[str]] = None) -> Tensor:
        """The unweighted listwise term on ``image_features @ text_features.T``."""
        self._check_features(image_features, text_features)
        self._check_listwise_args(image_features, relevance, captions)
        self._check_values(image_features, text_features)
        return self._listwise(image_features, text_features, relevance, captions)

    def _listwise(self, image_features: Tensor, text_features: Tensor, relevance: Optional[Tensor],
                  captions: Optional[Sequence[str]]) -> Tensor:
        if self.from_embeddings:
            return smooth_ndcg_loss_from_embeddings(image_features, text_features, relevance, **self.listwise_kwargs)
        sim = image_features @ text_features.T
        if relevance is None:
            relevance = self.batch_relevance(captions, sim.device, sim.dtype)
        return LISTWISE_LOSSES[self.listwise](sim, relevance, **self.listwise_kwargs)

    # ------------------------------------------------------------------ the call
    def forward(self, image_features: Tensor, text_features: Tensor, logit_scale,
                logit_bias=None, output_dict: bool = False, *, relevance: Optional[Tensor] = None,
                captions: Optional[Sequence[str]] = None):
        self._check_features(image_features, text_features)
        self._check_scalar(logit_scale, "logit_scale", image_features)
        if logit_bias is not None:
            self._check_scalar(logit_bias, "logit_bias", image_features)
        listwise_on = self.listwise_weight != 0
        if listwise_on:
            self._check_listwise_args(image_features, relevance, captions)
            # with the term off the adapter is open_clip's loss, which reads no value
            self._check_values(image_features, text_features, logit_scale)

        if listwise_on and self.from_embeddings:
            # the logit bias shifts every logit of a row alike: InfoNCE does not see it
            if not output_dict:   # one scalar: its gradients made in the forward (fused)
                return contrastive_smooth_ndcg_loss_from_embeddings(
                    image_features, text_features, relevance, logit_scale, weight=self.listwise_weight,
                    **self.listwise_kwargs)
            contrastive, ranked = both_terms(image_features, text_features, relevance, logit_scale,
                                             **self.listwise_kwargs)
            return {"contrastive_loss": contrastive, "listwise_loss": self.listwise_weight * ranked}
        logits_per_image, logits_per_text = self.get_logits(image_features, text_features, logit_scale,
                                                            logit_bias)
        labels = self.get_ground_truth(image_features.device, logits_per_image.shape[0])
        contrastive = (F.cross_entropy(logits_per_image, labels)
                       + F.cross_entropy(logits_per_text, labels)) / 2
        if not listwise_on:
            return {"contrastive_loss": contrastive} if output_dict else contrastive
        listwise = self.listwise_weight * self._listwise(image_features, text_features, relevance, captions)
        if output_dict:
            return {"contrastive_loss": contrastive, "listwise_loss": listwise}
        return contrastive + listwise

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.listwise_kwargs.items())
        return (f"cache_labels={self.cache_labels}, listwise_weight={self.listwise_weight}, "
                f"listwise={self.listwise!r}{', from_embeddings=True' if self.from_embeddings else ''}{extra}")
