"""One glue for every native op: a declaration in, the eager and compiled paths out.

An op declares (src/fastrank/ops/<op>.py) its forward and backward *fill* functions (the
kernel wrappers: tensors in, the kernel's outputs allocated and filled), the names of the
forward's outputs, how many of them the caller gets, and a fake of the forward. From that
:class:`NativeOp` makes, the same way for every op:

- the custom op ``fastrank::<name>`` (schema read from the fill's annotations) with its
  ``register_fake`` and ``register_autograd``, which torch.compile traces;
- the backward custom op (:class:`Backward`, ``fastrank::<name>_backward`` or one shared by
  several ops) whose fake is a tensor like ``sim``;
- the eager ``torch.autograd.Function`` (the cheapest path) over the same fill functions;
- the call ``op(sim, *args)``: sim as its kernels read it (half precision upcast for the
  CPU kernels; autograd casts the gradient back), then the Function eagerly or the custom
  op under torch.compile, and the caller's outputs;
- the contract's calls of each custom op on an example (:meth:`NativeOp.samples`).

The fill functions stay reachable as ``op.forward`` and ``op.backward.fill``: the kernels alone,
for a caller that runs them on pieces of its own and makes its own autograd (the losses from
the embeddings run a row loss's fills on a block of similarities at a time, ops/_blockwise.py).

The backward fill's parameters are matched by name: ``grad*`` ones take the upstream
gradients of the caller's outputs (in order), the names of forward arguments and outputs
take those, ``sim_dtype`` takes sim's dtype (for a backward that reads nothing else of
sim: sim is then not saved), the rest of the forward's non-tensor arguments come from the
context. Tensor arguments are saved with ``save_for_backward`` on both paths (an in-place change of sim
after the forward is an error, not a wrong gradient); the outputs the backward reads are
saved with it on the custom-op path (they are outputs there) and kept on the eager
Function's context (the caller never sees them, and saving costs about a microsecond a
tensor per call). Only the first argument (``sim``) gets a gradient.
"""
from __future__ import annotations

import inspect
import operator
import typing
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._launch import kernel_input


def _picker(indices: Sequence[int]) -> Callable[[tuple], tuple]:
    """``values -> tuple(values[i] for i in indices)``, as one C call (the per-call path)."""
    if not indices:
        return lambda values: ()
    if len(indices) == 1:
        i = indices[0]
        return lambda values: (values[i],)
    return operator.itemgetter(*indices)


def _schema(fill: Callable, params: Sequence[str], returns) -> str:
    """The custom-op schema of ``fill`` restricted to ``params``, returning ``returns``."""
    hints = typing.get_type_hints(fill)
    sig = inspect.signature(fill)
    proto_params = [sig.parameters[p].replace(annotation=hints[p]) for p in params]

    def proto(*args):  # pragma: no cover - only its signature is read
        raise NotImplementedError

    proto.__signature__ = inspect.Signature(proto_params, return_annotation=returns)
    return torch.library.infer_schema(proto, mutates_args=())


class Backward:
    """A backward fill and its custom op ``qualname`` (d loss / d sim, like sim). ``fake``:
    its register_fake, needed only where the fill takes no ``sim`` (the default makes a
    tensor like sim)."""

    def __init__(self, qualname: str, fill: Callable, fake: Optional[Callable] = None):
        self.name = qualname
        self.fill = fill
        self.params = tuple(inspect.signature(fill).parameters)
        if fake is None:
            like = self.params.index("sim")
            fake = lambda *args: args[like].new_empty(args[like].shape)  # noqa: E731
        self.op = torch.library.custom_op(qualname, fill, mutates_args=(), schema=_schema(fill, self.params, Tensor))
        self.op.register_fake(fake)


class NativeOp:
    """The declaration of a native op and everything made from it (module docstring).

    name: the custom op is ``fastrank::<name>``.
    forward: the forward fill, ``(sim, <tensors>, <hyper-parameters>[, with_grad]) ->
        (outputs..., [host-side extras])``; annotated (the custom op's schema). A
        ``with_grad`` parameter is told, eagerly, whether sim needs a gradient.
    outputs: the names of the forward's tensor outputs; the first ``public`` go to the caller.
    fake: the forward's register_fake (the outputs' shapes and dtypes, no kernel).
    backward: a :class:`Backward`, or a backward fill (its op is ``fastrank::<name>_backward``;
        one that takes ``sim_dtype`` rather than ``sim`` needs a :class:`Backward` with a fake).
    after: eagerly, called with the forward's whole result (fast_rerank's finite check).
    in_sim_dtype: the caller's outputs are in sim's dtype (scores, not losses): where sim
        was upcast for its kernels they are cast back.
    """

    def __init__(self, name: str, forward: Callable, outputs: Tuple[str, ...], fake: Callable,
                 backward, public: int = 1, after: Optional[Callable] = None, in_sim_dtype: bool = False):
        self.name = f"fastrank::{name}"
        self.forward = forward
        sig = tuple(inspect.signature(forward).parameters)
        self.with_grad = "with_grad" in sig
        self.params = tuple(p for p in sig if p != "with_grad")
        self.outputs = outputs
        self.public = public
        self.after = after
        self.in_sim_dtype = in_sim_dtype
        self.backward = backward if isinstance(backward, Backward) else Backward(f"{self.name}_backward", backward)
        n = len(outputs)
        returns = Tensor if n == 1 else Tuple[(Tensor,) * n]

        def run(*args):
            out = forward(*args)
            return out if len(out) == n else out[:n]

        self.op = torch.library.custom_op(self.name, run, mutates_args=(), schema=_schema(forward, self.params, returns))
        self.op.register_fake(fake)
        # what the backward fill reads, by name: upstream gradients, the forward's tensor
        # arguments (saved), its outputs (kept), its other arguments and sim's dtype (hyper)
        hints = typing.get_type_hints(forward)
        tensor_params = [p for p in self.params if "Tensor" in str(hints[p])]
        self._tensor_lists = frozenset(i for i, p in enumerate(self.params) if "List[torch.Tensor]" in str(hints[p]))
        back = self.backward.params
        grads = [p for p in back if p.startswith("grad")]
        saved = [self.params.index(p) for p in back if p in tensor_params]
        kept = [outputs.index(p) for p in back if p in outputs]
        rest = [p for p in back if p not in grads and p not in tensor_params and p not in outputs]
        self._sim_dtype = "sim_dtype" in rest
        hyper = [self.params.index(p) for p in rest if p != "sim_dtype"]
        self._saved, self._kept, self._hyper = _picker(saved), _picker(kept), _picker(hyper)
        self._saves = bool(saved)  # whether the backward reads any forward argument
        # the backward fill's arguments, picked from grads + saved + kept + hyper (+ sim's dtype)
        order = grads + [p for p in back if p in tensor_params] + [p for p in back if p in outputs] + \
            [p for p in rest if p != "sim_dtype"] + (["sim_dtype"] if self._sim_dtype else [])
        self._plan = _picker([order.index(p) for p in back])
        self._n_grads = len(grads)
        self._residual = tuple(range(public, n))
        self.function = _eager_function(self)
        torch.library.register_autograd(self.name, self._op_backward, setup_context=self._setup_context)

    # ------------------------------------------------------------ the call
    def __call__(self, sim: Tensor, *args):
        """The caller's outputs (one tensor, or a tuple of ``public``) of the op on sim as
        its kernels read it: eagerly the autograd.Function, under torch.compile the custom op."""
        # half on the CPU: upcast (autograd casts the gradient back)
        x = kernel_input(sim)
        if torch.compiler.is_compiling():
            out = self.op(x, *args)
            out = out[0] if self.public == 1 else out[:self.public]
        else:
            out = self.function.apply(x, *args)
        if x is sim or not self.in_sim_dtype:
            return out
        return out.to(sim.dtype) if self.public == 1 else tuple(o.to(sim.dtype) for o in out)

    def backward_args(self, grads: tuple, saved: tuple, hyper: tuple) -> tuple:
        """The backward fill's arguments from the upstream gradients, the tensors saved (the
        forward's tensor arguments, then its outputs) and its non-tensor arguments."""
        return self._plan(tuple(grads[:self._n_grads]) + tuple(saved) + tuple(hyper))

    # ------------------------------------------------------------ torch.compile: register_autograd
    def hyper(self, args: tuple) -> tuple:
        """The backward's non-tensor arguments from the forward's arguments."""
        return self._hyper(args) + (args[0].dtype,) if self._sim_dtype else self._hyper(args)

    def _setup_context(self, ctx, inputs, output):
        ctx.save_for_backward(*self._saved(inputs), *self._kept(output))
        ctx.hyper = self.hyper(inputs)
        ctx.mark_non_differentiable(*[output[i] for i in self._residual])
        # a Tensor[] argument's gradient is a list of its length (of None)
        ctx.no_grads = tuple([None] * len(inputs[i]) if i in self._tensor_lists else None
                             for i in range(1, len(inputs)))

    def _op_backward(self, ctx, *grads):
        grad = self.backward.op(*self.backward_args(grads[:self.public], ctx.saved_tensors, ctx.hyper))
        return (grad,) + ctx.no_grads

    # ------------------------------------------------------------ the contract's samples
    def samples(self, args: tuple, upstream: Callable[[Tensor], Tensor]) -> list:
        """(qualified name, arguments) of the forward custom op on ``args`` (sim requiring
        grad: its autograd is checked) and of the backward op on that forward's outputs,
        with gradients ``upstream(output)``."""
        sim = kernel_input(args[0]).detach().clone().requires_grad_(True)
        args = (sim,) + tuple(args[1:])
        plain = (sim.detach(),) + args[1:]
        out = self.op(*plain)
        out = (out,) if isinstance(out, Tensor) else tuple(out)
        grads = tuple(upstream(o) for o in out[:self.public])
        back = self.backward_args(grads, self._saved(plain) + self._kept(out), self.hyper(plain))
        return [(self.name, args), (self.backward.name, tuple(back))]


def _eager_function(op: NativeOp) -> type:
    """The eager path of ``op``: an autograd.Function ``(sim, *args) -> op's outputs``, one
    class per op (profiles name it: _KendallFunction), its pieces bound once here."""
    fill, after, with_grad, public = op.forward, op.after, op.with_grad, op.public
    saved, kept, plan, back = op._saved, op._kept, op._plan, op.backward.fill
    hyper = op.hyper if op._sim_dtype else op._hyper  # the picker itself where it is all
    saves = op._saves
    nones = (None,) * (len(op.params) - 1)

    def forward(ctx, *args):
        res = fill(*args, ctx.needs_input_grad[0]) if with_grad else fill(*args)
        if after is not None:
            after(res)
        if public > 1:  # an unused output's gradient stays None (its backward fill takes None)
            ctx.set_materialize_grads(False)
        # the arguments with save_for_backward (their versions are checked); the outputs the
        # caller never sees (workspaces) as they are: saving them would cost more than they risk
        if saves:
            ctx.save_for_backward(*saved(args))
        ctx.kept = kept(res)
        ctx.hyper = hyper(args)
        return res[0] if public == 1 else tuple(res[:public])

    def backward(ctx, *grads):
        if not ctx.needs_input_grad[0]:
            return (None,) + nones
        held = grads + ctx.saved_tensors + ctx.kept + ctx.hyper if saves else grads + ctx.kept + ctx.hyper
        return (back(*plan(held)),) + nones

    name = "_" + "".join(w.capitalize() for w in op.name.split("::")[1].split("_")) + "Function"
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                    "backward": staticmethod(backward),
                                                    "__doc__": f"The eager path of {op.name}."})
