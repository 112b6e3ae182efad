"""The module form of a functional op, made from the functional itself.

``class SmoothNDCGLoss(ModuleForm, functional=smooth_ndcg_loss, inputs=("sim", "relevance",
"mask"), check=_check_hyper, checked=_smooth_ndcg_loss)`` is the whole module: its constructor
takes the functional's other parameters with the functional's defaults (``impl`` among them)
and checks them with the op's own ``check`` (the one its functional calls, so an error names
the argument the same way), as does every later assignment of one (``module.tau = 0.5``);
``forward(*inputs)`` calls the functional's body with them. They are checked when they are
set, not at every call: ``checked`` (the functional's body, which takes the hyper-parameter
check as its first argument and then the functional's parameters) is called with no check of
them. ``extra_repr`` lists them (``impl`` aside).
"""
from __future__ import annotations

import inspect
from typing import Callable, Sequence

import torch

from .. import _validation as V


def _as_checked(*hyper):
    """The hyper-parameter check of a module's call: none (they were checked when set)."""
    return hyper


class ModuleForm(torch.nn.Module):
    """Base of the module forms (module docstring)."""

    def __init_subclass__(cls, functional: Callable = None, inputs: Sequence[str] = (), check: Callable = None,
                          checked: Callable = None, **kw):
        super().__init_subclass__(**kw)
        if check is None or checked is None:
            raise TypeError(f"{cls.__name__}: a module form takes check= and checked= (its functional's check "
                            "of the hyper-parameters and its body)")
        body = checked
        params = inspect.signature(functional).parameters
        hyper = tuple(p for p in params if p not in inputs)
        checked = tuple(p for p in hyper if p != "impl")
        input_defaults = {p: params[p].default for p in inputs if params[p].default is not inspect.Parameter.empty}
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
            if "impl" in values:
                impl = values["impl"]
                self.impl = impl if impl == "auto" else V.check_impl(impl)

        def forward(self, *args, **kwargs):
            if len(args) > len(inputs):
                raise TypeError(f"{cls.__name__}.forward takes at most {len(inputs)} inputs {inputs}, "
                                f"got {len(args)}")
            kwargs.update(zip(inputs, args))
            return body(_as_checked, **{**input_defaults, **kwargs}, **{p: getattr(self, p) for p in hyper})

        __init__.__signature__ = init_sig
        forward.__signature__ = forward_sig
        forward.__doc__ = f"``{functional.__name__}({', '.join(inputs)})`` with this module's hyper-parameters."
        cls.__init__ = __init__
        cls.forward = forward
        cls._hyper_names = checked
        cls._check_hyper = staticmethod(check)

    def __setattr__(self, name, value):
        if name in self.__dict__:  # a reassignment: a hyper-parameter is checked as at construction
            if name in self._hyper_names:
                values = [value if p == name else getattr(self, p) for p in self._hyper_names]
                value = self._check_hyper(*values)[self._hyper_names.index(name)]
            elif name == "impl" and value != "auto":
                value = V.check_impl(value)
        super().__setattr__(name, value)

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in self._hyper_names)
