"""CombinedLoss: a weighted sum of fastrank losses, with per-term values for logging.

    loss_fn = CombinedLoss("triplet:1.0,smooth_ndcg:0.5", options={"smooth_ndcg": {"tau": 0.05}})
    total, parts = loss_fn(sim, relevance=relevance)   # parts = {"triplet": ..., "smooth_ndcg": ...}

or, with modules built by hand (any ``nn.Module`` whose forward takes ``sim`` first):

    CombinedLoss([(fastrank.nn.TripletLoss(margin=0.1), 1.0), (fastrank.nn.KendallLoss(), 2.0)])
"""
from __future__ import annotations

import inspect
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .. import _validation as V
from ..ops.registry import LOSSES

#: spec name -> class name in fastrank.nn: the table's losses that are CombinedLoss terms
LOSS_NAMES = {name: row.module.__name__ for name, row in LOSSES.items() if row.combined}


def _accepts(module: torch.nn.Module, arg: str) -> bool:
    try:
        return arg in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def _parse_spec(spec: str) -> list:
    terms = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"spec has an empty term: {spec!r} (expected 'name:weight,name:weight')")
        name, sep, weight = item.partition(":")
        name = name.strip()
        if name not in LOSS_NAMES:
            raise ValueError(f"spec: unknown loss {name!r}; known: {tuple(LOSS_NAMES)}")
        if sep:
            try:
                w = float(weight)
            except ValueError:
                raise ValueError(f"spec: weight of {name!r} must be a number, got {weight.strip()!r}") from None
        else:
            w = 1.0
        terms.append((name, w))
    return terms


class CombinedLoss(torch.nn.Module):
    """Weighted sum of fastrank losses: total = sum_name weight_name * loss_name(sim, ...).

    Args:
        spec: either a string ``"name:weight,name:weight"`` (``":weight"`` may be omitted,
            meaning 1.0) with names among ``triplet``, ``smooth_ndcg``, ``smooth_ap``,
            ``recall_at_k``, ``kendall``, ``kendall_sw``, ``ladder``, ``topk``; or a list of
            ``(module, weight)`` pairs (terms named by their spec name when the module is a
            fastrank class, else by the lower-cased class name; repeated names get a suffix
            ``_2``, ``_3``, ...).
        options: for a string spec, ``{name: {kwarg: value}}`` passed to the constructor of
            that term's module (e.g. ``{"triplet": {"margin": 0.1, "mining": "soft"}}``).

    Weights are finite numbers >= 0; a name may appear once in a string spec.

    ``forward(sim, relevance=None, positives=None)`` returns ``(total, parts)``: ``total``
    is the weighted sum (differentiable), ``parts`` maps each term's name to its
    *unweighted* value, detached, for logging. ``relevance`` goes to the terms whose
    forward takes it (a ValueError if one needs it and it is None), ``positives`` only to
    the terms whose forward takes it. Each term uses its own direction and reduction; with
    ``reduction="none"`` terms the per-query vectors are added elementwise.
    """

    def __init__(self, spec: Union[str, Sequence[Tuple[torch.nn.Module, float]]],
                 options: Optional[Mapping[str, Mapping]] = None):
        super().__init__()
        if isinstance(spec, str):
            terms = _parse_spec(spec)
            names = [n for n, _ in terms]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"spec names each loss once, got {dup} more than once: {spec!r}")
            options = dict(options or {})
            unknown = [n for n in options if n not in names]
            if unknown:
                raise ValueError(f"options has entries {unknown} that are not in spec {spec!r}")
            from .. import nn as fnn  # lazy: the classes live in modules written in parallel
            modules = []
            for name, w in terms:
                kw = options.get(name, {})
                if not isinstance(kw, Mapping):
                    raise ValueError(f"options[{name!r}] must be a dict of keyword arguments, got {kw!r}")
                modules.append((name, getattr(fnn, LOSS_NAMES[name])(**kw), w))
        else:
            if options is not None:
                raise ValueError("options applies to a string spec only; configure the modules directly")
            if not isinstance(spec, (list, tuple)) or not spec:
                raise ValueError("spec must be a string 'name:weight,...' or a non-empty list of "
                                 f"(module, weight) pairs, got {spec!r}")
            by_class = {cls: name for name, cls in LOSS_NAMES.items()}
            modules, seen = [], {}
            for i, pair in enumerate(spec):
                if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], torch.nn.Module):
                    raise ValueError(f"spec[{i}] must be a (nn.Module, weight) pair, got {pair!r}")
                module, w = pair
                base = by_class.get(type(module).__name__, type(module).__name__.lower())
                seen[base] = seen.get(base, 0) + 1
                name = base if seen[base] == 1 else f"{base}_{seen[base]}"
                modules.append((name, module, w))
        self.losses = torch.nn.ModuleDict({name: m for name, m, _ in modules})
        self.weights: Dict[str, float] = {
            name: V.check_nonnegative(w, f"weight of {name!r}") for name, _, w in modules}
        self._needs_relevance = {name: _accepts(m, "relevance") for name, m, _ in modules}
        self._takes_positives = {name: _accepts(m, "positives") for name, m, _ in modules}

    @property
    def needs_relevance(self) -> bool:
        """Whether a term takes ``relevance`` (forward raises without it)."""
        return any(self._needs_relevance.values())

    def forward(self, sim: Tensor, relevance: Optional[Tensor] = None,
                positives: Optional[Tensor] = None) -> Tuple[Tensor, Dict[str, Tensor]]:
        total = None
        parts: Dict[str, Tensor] = {}
        for name, module in self.losses.items():
            args = [sim]
            if self._needs_relevance[name]:
                if relevance is None:
                    raise ValueError(f"CombinedLoss: the {name!r} term needs relevance; "
                                     "pass relevance= (an (N, M) tensor like sim)")
                args.append(relevance)
            kwargs = {"positives": positives} if self._takes_positives[name] else {}
            value = module(*args, **kwargs)
            parts[name] = value.detach()
            weighted = self.weights[name] * value
            total = weighted if total is None else total + weighted
        return total, parts

    def extra_repr(self) -> str:
        return ", ".join(f"{n}:{w}" for n, w in self.weights.items())
