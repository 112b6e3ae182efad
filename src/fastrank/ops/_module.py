"""The module form of a functional op, made from the functional itself.

``class SmoothNDCGLoss(ModuleForm, functional=smooth_ndcg_loss, inputs=("sim", "relevance",
"mask"), check=_check_hyper)`` is the whole module: its constructor takes the functional's
other parameters with the functional's defaults (``impl`` among them), checks them with the
op's own ``check`` (the one its functional calls, so an error names the argument the same
way), and ``forward(*inputs)`` calls the functional with them. ``extra_repr`` lists them
(``impl`` aside).
"""
from __future__ import annotations

import inspect
from typing import Callable, Sequence

import torch

from .. import _validation as V


class ModuleForm(torch.nn.Module):
    """Base of the module forms (module docstring)."""

    def __init_subclass__(cls, functional: Callable = None, inputs: Sequence[str] = (), check: Callable = None,
                          **kw):
        super().__init_subclass__(**kw)
        params = inspect.signature(functional).parameters
        hyper = tuple(p for p in params if p not in inputs)
        checked = tuple(p for p in hyper if p != "impl")
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        init_sig = inspect.Signature([self_param] + [params[p] for p in hyper])
        forward_sig = inspect.Signature([self_param] + [params[p] for p in inputs],
                                        return_annotation=inspect.signature(functional).return_annotation)
        inputs = tuple(inputs)

        def __init__(self, *args, **kwargs):
            torch.nn.Module.__init__(self)
            bound = init_sig.bind(self, *args, **kwargs)
            bound.apply_defaults()
            values = {p: bound.arguments[p] for p in hyper}
            for name, value in zip(checked, check(*[values[p] for p in checked])):
                setattr(self, name, value)
            impl = values.get("impl", "auto")
            self.impl = impl if impl == "auto" else V.check_impl(impl)

        def forward(self, *args, **kwargs):
            if len(args) > len(inputs):
                raise TypeError(f"{cls.__name__}.forward takes at most {len(inputs)} inputs {inputs}, "
                                f"got {len(args)}")
            kwargs.update(zip(inputs, args))
            return functional(**kwargs, **{p: getattr(self, p) for p in hyper})

        __init__.__signature__ = init_sig
        forward.__signature__ = forward_sig
        forward.__doc__ = f"``{functional.__name__}({', '.join(inputs)})`` with this module's hyper-parameters."
        cls.__init__ = __init__
        cls.forward = forward
        cls._hyper_names = checked

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in self._hyper_names)
