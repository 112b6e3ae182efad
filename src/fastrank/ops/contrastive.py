"""The contrastive losses straight from the embeddings (docs/spec.md §2.12): CLIP's symmetric
InfoNCE with a learnable logit scale and the SigLIP loss with a learnable scale and bias, equal
(value and every gradient) to open_clip's ClipLoss and SigLipLoss on ``img @ txt.T`` and never
holding that (n, m) matrix or its gradient.

Python -> two pairs of custom ops (src/fastrank/ops/_contrastive_blocks.py): per block of
queries a matmul and the block's logsumexp / log-sigmoid terms, recomputed in the backward.
Pure PyTorch: the matmuls are the work. The reduction is done here, on the per-query losses.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from .. import _validation as V
from .._native import acc_dtype
from .._reduce import reduce
from ..reference import contrastive as R
from . import _contract as C
from ._contrastive_blocks import info_nce_from_embeddings, siglip_from_embeddings
from ._module import ModuleForm
from ._row import Loss

Scalar = Union[float, Tensor]


# ---------------------------------------------------------------- checks
def _check_block(block) -> Optional[int]:
    """block: None (as many queries as keep a block near 4M logits) or an int >= 1."""
    return None if block is None else V.check_int(block, "block")


def _check_info_nce_hyper(direction, reduction, block):
    return V.check_direction(direction), V.check_reduction(reduction), _check_block(block)


def _check_siglip_hyper(reduction, block):
    return V.check_reduction(reduction), _check_block(block)


def _scalar(value, name: str, img: Tensor) -> Tensor:
    """A learnable scalar (logit_scale, logit_bias): a tensor of one element on img's device
    (its gradient flows back), or a real number (a constant)."""
    if isinstance(value, Tensor):
        if not value.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating tensor of one element or a real number, got {value.dtype}")
        if value.numel() != 1:
            raise ValueError(f"{name} must hold one element (a scalar), got shape {tuple(value.shape)}")
        if value.device != img.device:
            raise ValueError(f"{name} is on {value.device} but img is on {img.device}")
        return value
    return torch.tensor(V.as_real(value, name), dtype=acc_dtype(img.dtype), device=img.device)


def _positives(positives, img: Tensor, txt: Tensor) -> Tensor:
    """The positives as an int64 (n,) tensor of document indices: None = the diagonal (needs
    as many queries as documents)."""
    n, m = img.shape[0], txt.shape[0]
    if positives is None:
        if n != m:
            raise ValueError(f"positives=None means the diagonal, which needs as many queries as documents; got "
                             f"img of {n} rows and txt of {m}: pass positives as an int64 ({n},) tensor of indices")
        return torch.arange(n, device=img.device)
    if not isinstance(positives, Tensor) or positives.dtype != torch.int64:
        raise TypeError(f"positives must be None or an int64 torch.Tensor of shape (n,) (each query's positive "
                        f"document), got "
                        f"{positives.dtype if isinstance(positives, Tensor) else type(positives).__name__}")
    if positives.shape != (n,):
        raise ValueError(f"positives must have shape ({n},), one document index per query, got "
                         f"{tuple(positives.shape)}")
    if positives.device != img.device:
        raise ValueError(f"positives is on {positives.device} but img is on {img.device}")
    return positives


def _check_inputs(img, txt, positives, scalars):
    """Structure first (img, txt, the scalars, positives), then the values where the check is
    on (docs/spec.md §1: CPU by default)."""
    V.check_embedding_pair(img, "img", txt, "txt", same_dtype=True)
    scalars = [_scalar(v, name, img) for name, v in scalars]
    pos = _positives(positives, img, txt)
    if V.check_finite_enabled(img.device):
        V.check_finite(img, "img")
        V.check_finite(txt, "txt")
        for name, v in zip(("logit_scale", "logit_bias"), scalars):
            V.check_finite(v.detach(), name)
        if positives is not None:
            lo, hi = V.value_range(pos)
            if lo < 0 or hi >= txt.shape[0]:
                raise ValueError(f"positives must hold document indices in [0, {txt.shape[0]}), got values in "
                                 f"[{lo:g}, {hi:g}]")
    return scalars, pos


# ---------------------------------------------------------------- InfoNCE
def info_nce_loss_from_embeddings(img: Tensor, txt: Tensor, logit_scale: Scalar, positives: Optional[Tensor] = None,
                                  direction: str = "both", reduction: str = "mean", block: Optional[int] = None,
                                  impl: str = "auto") -> Tensor:
    """CLIP's symmetric InfoNCE (docs/spec.md §2.12; Radford et al., 2021) on the logits
    ``logit_scale * img @ txt.T``, computed block by block from the embeddings: the (n, m)
    logits and their gradient are never held (as Inf-CL, Cheng et al., 2024).

    With the defaults it equals open_clip's ``ClipLoss()(img, txt, logit_scale)``, value and
    the gradients of img, txt and logit_scale.

    Args:
        img: (n, dim) query embeddings (images; the queries of a retrieval batch).
        txt: (m, dim) document embeddings, same dtype and device.
        logit_scale: the multiplier of the similarities (open_clip passes its model's
            ``logit_scale.exp()``): a one-element tensor (learnable: its gradient flows) or a
            number.
        positives: None (query i's positive is document i: needs n == m) or an int64 (n,)
            tensor, query i's positive document.
        direction: "both" (CLIP: the i2t and t2i cross-entropies), "i2t" (each query's row,
            target its positive: MultipleNegativesRankingLoss) or "t2i" (each positive
            document's column over the n queries, target its query).
        reduction: "mean" (default: the mean of the per-query cross-entropies, so "both" is
            the mean of the two directions' means, CLIP's loss), "sum" or "none" (the
            cross-entropies, i2t first: (n,) a direction).
        block: queries per block (None: as many as keep a block's logits near 4M values).
        impl: "auto" or "native" (the blocks) or "reference" (the (n, m) logits in plain
            PyTorch: O(n * m) memory).

    Memory: O((n + m) * dim + block * m); work O(n * m * dim) in matmuls, as the dense path
    (one matmul a block in the forward, three in the backward). float16 / bfloat16 embeddings
    are computed in float32.
    """
    return _info_nce_loss_from_embeddings(_check_info_nce_hyper, img, txt, logit_scale, positives, direction,
                                          reduction, block, impl)


def _info_nce_loss_from_embeddings(check_hyper, img, txt, logit_scale, positives, direction, reduction, block, impl):
    """info_nce_loss_from_embeddings with its hyper-parameters checked by ``check_hyper``: the op's
    own, or, for its module form, none (the module checked them when they were set)."""
    direction, reduction, block = check_hyper(direction, reduction, block)
    impl = V.check_impl(impl)
    (scale,), pos = _check_inputs(img, txt, positives, [("logit_scale", logit_scale)])
    if impl == "reference":
        acc = acc_dtype(img.dtype)
        parts = R.info_nce_per_query(img.to(acc), txt.to(acc), scale.to(acc).reshape(()), pos, direction)
        return reduce([torch.cat(parts)], reduction)
    per_query, _, _ = info_nce_from_embeddings(img, txt, scale, pos, direction, block or 0)
    return reduce([per_query], reduction)


class InfoNCELossFromEmbeddings(ModuleForm, functional=info_nce_loss_from_embeddings,
                                inputs=("img", "txt", "logit_scale", "positives"), check=_check_info_nce_hyper,
                                checked=_info_nce_loss_from_embeddings):
    """Module form of :func:`fastrank.info_nce_loss_from_embeddings`:
    ``loss = InfoNCELossFromEmbeddings()(img, txt, logit_scale)`` or ``(img, txt, logit_scale, positives)``."""


# ---------------------------------------------------------------- SigLIP
def siglip_loss_from_embeddings(img: Tensor, txt: Tensor, logit_scale: Scalar, logit_bias: Scalar,
                                positives: Optional[Tensor] = None, reduction: str = "mean",
                                block: Optional[int] = None, impl: str = "auto") -> Tensor:
    """The SigLIP loss (docs/spec.md §2.12; Zhai et al., ICCV 2023) on the logits
    ``logit_scale * img @ txt.T + logit_bias``, computed block by block from the embeddings:
    the (n, m) logits and their gradient are never held.

    With the defaults it equals open_clip's ``SigLipLoss()(img, txt, logit_scale, logit_bias)``
    (one process), value and the gradients of img, txt, logit_scale and logit_bias.

    Args:
        img, txt: (n, dim) and (m, dim) embeddings, same dtype and device.
        logit_scale, logit_bias: the multiplier and the offset of the similarities, each a
            one-element tensor (learnable) or a number (open_clip passes ``logit_scale.exp()``
            and ``logit_bias``).
        positives: None (the diagonal: needs n == m) or an int64 (n,) tensor, query i's
            positive document; every other pair is a negative.
        reduction: "mean" (default: the mean over the n queries of each query's
            ``-sum_j log sigma(z_ij L_ij)``, SigLIP's 1 / |B|), "sum" or "none" ((n,)).
        block, impl: as :func:`fastrank.info_nce_loss_from_embeddings`.

    Memory: O((n + m) * dim + block * m); work O(n * m * dim) in matmuls.
    """
    return _siglip_loss_from_embeddings(_check_siglip_hyper, img, txt, logit_scale, logit_bias, positives, reduction,
                                        block, impl)


def _siglip_loss_from_embeddings(check_hyper, img, txt, logit_scale, logit_bias, positives, reduction, block, impl):
    """siglip_loss_from_embeddings with its hyper-parameters checked by ``check_hyper``: the op's
    own, or, for its module form, none (the module checked them when they were set)."""
    reduction, block = check_hyper(reduction, block)
    impl = V.check_impl(impl)
    (scale, bias), pos = _check_inputs(img, txt, positives, [("logit_scale", logit_scale), ("logit_bias", logit_bias)])
    if impl == "reference":
        acc = acc_dtype(img.dtype)
        per_query = R.siglip_per_query(img.to(acc), txt.to(acc), scale.to(acc).reshape(()),
                                       bias.to(acc).reshape(()), pos)
        return reduce([per_query], reduction)
    return reduce([siglip_from_embeddings(img, txt, scale, bias, pos, block or 0)], reduction)


class SigLIPLossFromEmbeddings(ModuleForm, functional=siglip_loss_from_embeddings,
                               inputs=("img", "txt", "logit_scale", "logit_bias", "positives"),
                               check=_check_siglip_hyper, checked=_siglip_loss_from_embeddings):
    """Module form of :func:`fastrank.siglip_loss_from_embeddings`:
    ``loss = SigLIPLossFromEmbeddings()(img, txt, logit_scale, logit_bias)``."""


# ---------------------------------------------------------------- the contract (tests/test_contract.py)
def _inputs(dtype, seed, size, bias: bool):
    g = C.gen(seed)
    n, m = size
    img = torch.nn.functional.normalize(torch.randn(n, 6, generator=g, dtype=torch.float64), dim=1).to(dtype)
    txt = torch.nn.functional.normalize(torch.randn(m, 6, generator=g, dtype=torch.float64), dim=1).to(dtype)
    out = {"img": img, "txt": txt, "logit_scale": torch.tensor(4.0, dtype=dtype)}
    if bias:
        out["logit_bias"] = torch.tensor(-1.5, dtype=dtype)
    out["positives"] = torch.randint(0, m, (n,), generator=g)
    return out


def _info_nce_examples(dtype, seed=0, size=(5, 7)):
    x = _inputs(dtype, seed, size, bias=False)
    grad = ("img", "txt", "logit_scale")
    return [C.Example("both, mean, block 2", x, {"direction": "both", "reduction": "mean", "block": 2,
                                                 "impl": "native"}, grad),
            C.Example("t2i, none", x, {"direction": "t2i", "reduction": "none", "impl": "native"}, grad)]


def _siglip_examples(dtype, seed=0, size=(5, 7)):
    x = _inputs(dtype, seed, size, bias=True)
    grad = ("img", "txt", "logit_scale", "logit_bias")
    return [C.Example("mean, block 2", x, {"reduction": "mean", "block": 2, "impl": "native"}, grad),
            C.Example("none", x, {"reduction": "none", "impl": "native"}, grad)]


def _leaves(ex, names):
    return [ex.inputs[n].detach().clone().requires_grad_(True) for n in names]


def _info_nce_samples(ex):
    img, txt, scale = _leaves(ex, ("img", "txt", "logit_scale"))
    direction, block = ex.hyper.get("direction", "both"), ex.hyper.get("block") or 0
    args = (img, txt, scale, ex.inputs["positives"], direction, block)
    per_query, row_lse, col_lse = info_nce_from_embeddings(*(a.detach() if isinstance(a, Tensor) else a for a in args))
    return [("fastrank::info_nce_from_embeddings", args),
            ("fastrank::info_nce_from_embeddings_backward",
             (C.upstream(per_query), img.detach(), txt.detach(), scale.detach(), ex.inputs["positives"], row_lse,
              col_lse, direction, block))]


def _siglip_samples(ex):
    img, txt, scale, bias = _leaves(ex, ("img", "txt", "logit_scale", "logit_bias"))
    block = ex.hyper.get("block") or 0
    args = (img, txt, scale, bias, ex.inputs["positives"], block)
    per_query = siglip_from_embeddings(*(a.detach() if isinstance(a, Tensor) else a for a in args))
    return [("fastrank::siglip_from_embeddings", args),
            ("fastrank::siglip_from_embeddings_backward",
             (C.upstream(per_query), img.detach(), txt.detach(), scale.detach(), bias.detach(),
              ex.inputs["positives"], block))]


_BAD = (
    C.BadInput("img is a list", TypeError, "img", inputs=lambda x: {"img": x["img"].tolist()}),
    C.BadInput("img is 1-D", ValueError, "img", inputs=lambda x: {"img": x["img"][0]}),
    C.BadInput("txt of another dimension", ValueError, "txt", inputs=lambda x: {"txt": x["txt"][:, 1:]}),
    C.BadInput("txt of another dtype", TypeError, "txt", inputs=lambda x: {"txt": x["txt"].double()}),
    C.BadInput("img holds NaN", ValueError, "img", inputs=lambda x: {"img": torch.full_like(x["img"], float("nan"))}),
    C.BadInput("logit_scale of two elements", ValueError, "logit_scale",
               inputs=lambda x: {"logit_scale": x["logit_scale"].repeat(2)}),
    C.BadInput("logit_scale is a string", ValueError, "logit_scale", inputs=lambda x: {"logit_scale": "4"}),
    C.BadInput("logit_scale is NaN", ValueError, "logit_scale",
               inputs=lambda x: {"logit_scale": torch.tensor(float("nan"))}),
    C.BadInput("positives of floats", TypeError, "positives", inputs=lambda x: {"positives": x["positives"].float()}),
    C.BadInput("positives of other rows", ValueError, "positives", inputs=lambda x: {"positives": x["positives"][1:]}),
    C.BadInput("no positives for n != m", ValueError, "positives", inputs=lambda x: {"positives": None}),
    C.BadInput("a positive out of range", ValueError, "positives", inputs=lambda x: {"positives": x["positives"] + 100}),
    C.BadInput("block = 0", ValueError, "block", hyper={"block": 0}),
    C.BadInput("reduction is not a reduction", ValueError, "reduction", hyper={"reduction": "avg"}),
    C.BadInput("impl is not an implementation", ValueError, "impl", hyper={"impl": "gpu"}),
)

# ---------------------------------------------------------------- their rows of the table of losses (registry.py)
ROWS = (
    Loss("info_nce_from_embeddings", info_nce_loss_from_embeddings, InfoNCELossFromEmbeddings,
         C.Contract(("fastrank::info_nce_from_embeddings", "fastrank::info_nce_from_embeddings_backward"),
                    _info_nce_examples, _info_nce_samples,
                    _BAD + (C.BadInput("direction is not a direction", ValueError, "direction",
                                       hyper={"direction": "up"}),)),
         combined=False, cuda_matrix="test_contrastive.py"),
    Loss("siglip_from_embeddings", siglip_loss_from_embeddings, SigLIPLossFromEmbeddings,
         C.Contract(("fastrank::siglip_from_embeddings", "fastrank::siglip_from_embeddings_backward"),
                    _siglip_examples, _siglip_samples,
                    _BAD + (C.BadInput("logit_bias is a list", ValueError, "logit_bias",
                                       inputs=lambda x: {"logit_bias": [0.0]}),)),
         combined=False, cuda_matrix="test_contrastive.py"),
)
