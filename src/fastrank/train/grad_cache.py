"""Gradient caching: a loss over a batch larger than the encoders' activations allow.

A listwise loss ranks better with longer lists, but the encoders' activations grow with the
batch. Gradient caching (Gao et al., "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup", 2021) splits one training step in three:

1. embed the batch chunk by chunk **without a graph** (``torch.no_grad``), remembering each
   chunk's RNG state;
2. compute the loss on *all* the embeddings (as leaf tensors) and back-propagate it to them:
   the gradient of the loss with respect to every embedding, cached;
3. embed each chunk again **with** a graph, under its replayed RNG state (dropout draws the
   same masks as in 1, so the cached gradient belongs to the embedding it is applied to), and
   back-propagate the cached gradient of that chunk into the parameters.

Only one chunk's activations are alive at a time; the loss still sees the whole batch, and the
parameter gradient is the full-batch gradient (up to float rounding) for any loss. The price
is one more forward pass of the encoders.

The RNG snapshot and replay is sentence-transformers' ``RandContext`` (the same helper its
cached losses use, built on ``torch.random.fork_rng`` and ``torch.utils.checkpoint``'s
``get_device_states`` / ``set_device_states``).

Caveats:

- **Batch norm** sees the statistics of a chunk, not of the batch (in both passes; the
  full-batch forward of an uncached step would normalise with the batch's statistics), and
  its running statistics take one momentum update per chunk. Pass ``module=`` so that the
  first, graph-free pass leaves the running statistics as it found them (otherwise they
  would be updated twice per chunk). Layer norm, dropout and everything per-item are exact.
- **Data parallel**: with ``no_sync`` (``DistributedDataParallel.no_sync``) every chunk but
  the last back-propagates without the gradient all-reduce; the last chunk's backward
  all-reduces the accumulated gradient once, as one uncached step would.

Used by the reference trainer (``train.cache_chunk``, see ``docs/training-at-scale.md``) and by
the ``scale`` benchmark, which times it on a MiniLM text tower and the demo's image encoder.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import _validation as V

__all__ = ["rand_context", "chunk_slices", "slice_inputs", "embed_without_graph", "replay_backward",
           "cached_step"]


def rand_context(*tensors: Tensor):
    """A snapshot of the CPU RNG (and of the CUDA RNGs of ``tensors``' devices) that replays it
    when entered: sentence-transformers' ``RandContext`` (imported on first use)."""
    try:
        from sentence_transformers.base.losses.gradcache import RandContext
    except ImportError:   # sentence-transformers < 6 kept it beside its cached loss
        from sentence_transformers.losses.CachedMultipleNegativesRankingLoss import RandContext
    return RandContext(*tensors)


def chunk_slices(n: int, chunk_size: int) -> List[slice]:
    """``[slice(0, c), slice(c, 2c), ...]`` covering range(n); the last may be shorter."""
    n = V.check_int(n, "n")
    chunk_size = V.check_int(chunk_size, "chunk_size")
    return [slice(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]


def slice_inputs(inputs: Sequence[Any], sl: slice) -> Tuple:
    """The rows ``sl`` of every batch-first input: tensors and lists are sliced, None stays."""
    return tuple(None if x is None else x[sl] for x in inputs)


def _as_tuple(out) -> Tuple[Tensor, ...]:
    if isinstance(out, Tensor):
        return (out,)
    if isinstance(out, (tuple, list)) and out and all(isinstance(t, Tensor) for t in out):
        return tuple(out)
    raise TypeError(f"embed must return a tensor or a tuple of tensors (batch first), got {type(out).__name__}")


def embed_without_graph(embed: Callable, inputs: Sequence[Any], slices: Sequence[slice],
                        module: Optional[torch.nn.Module] = None) -> Tuple[Tuple[Tensor, ...], list]:
    """Step 1: ``embed(*chunk_inputs)`` for each chunk under ``torch.no_grad``, each chunk's
    RNG state snapshot taken just before it. Returns (the chunks' outputs concatenated on dim 0,
    one tuple entry per output of ``embed``; the list of RNG snapshots). With ``module``, its
    buffers (batch norm's running statistics) are restored afterwards: step 3 updates them."""
    saved = [b.detach().clone() for b in module.buffers()] if module is not None else None
    outs, states = [], []
    with torch.no_grad():
        for sl in slices:
            chunk = slice_inputs(inputs, sl)
            states.append(rand_context(*[x for x in chunk if isinstance(x, Tensor)]))
            outs.append(_as_tuple(embed(*chunk)))
    if saved is not None:
        with torch.no_grad():
            for b, s in zip(module.buffers(), saved):
                b.copy_(s)
    n_out = len(outs[0])
    if any(len(o) != n_out for o in outs):
        raise ValueError("embed returned a different number of outputs for different chunks")
    return tuple(torch.cat([o[k] for o in outs]) for k in range(n_out)), states


def replay_backward(embed: Callable, inputs: Sequence[Any], slices: Sequence[slice], states: list,
                    grads: Sequence[Optional[Tensor]], no_sync: Optional[Callable] = None) -> None:
    """Step 3: for each chunk, ``embed(*chunk_inputs)`` again with a graph under its replayed
    RNG state, then back-propagate the chunk's rows of the cached ``grads`` (one per output of
    ``embed``; None = no gradient reaches that output) into the parameters. ``no_sync``: a
    context-manager factory (``DistributedDataParallel.no_sync``) entered for every chunk but the
    last, so the gradient all-reduce runs once, in the last chunk's backward."""
    last = len(slices) - 1
    for i, (sl, state) in enumerate(zip(slices, states)):
        chunk = slice_inputs(inputs, sl)
        with (no_sync() if no_sync is not None and i < last else nullcontext()):
            with state:
                outs = _as_tuple(embed(*chunk))
            pairs = [(o, g[sl]) for o, g in zip(outs, grads) if g is not None]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g.to(o.dtype) for o, g in pairs])


def cached_step(embed: Callable, inputs: Sequence[Any], chunk_size: int, loss_fn: Callable,
                replay_embed: Optional[Callable] = None, no_sync: Optional[Callable] = None,
                module: Optional[torch.nn.Module] = None):
    """One gradient-cached backward pass over a batch (steps 1-3 of the module docstring).

    Args:
        embed: ``embed(*chunk_inputs) -> Tensor | tuple of Tensors``, batch first (the chunk's
            embeddings; e.g. ``lambda x: model(x)``).
        inputs: the batch: a sequence of batch-first tensors or lists (None entries are passed
            through), sliced together into chunks of ``chunk_size`` rows.
        chunk_size: rows per chunk (>= 1); activations of one chunk are alive at a time.
        loss_fn: ``loss_fn(*embeddings)`` on the whole batch's embeddings (leaf tensors that
            require grad) -> the scalar to back-propagate (or a tuple whose first entry it is;
            the rest is returned untouched).
        replay_embed: what runs in step 3 (default ``embed``): e.g. the DDP wrapper of the model
            whose raw module ``embed`` calls.
        no_sync: ``ddp.no_sync`` under data parallelism (see :func:`replay_backward`).
        module: the model, to leave its buffers untouched by step 1 (batch norm).

    Returns ``(loss_fn's output, embeddings)``: the embeddings detached, as step 1 computed them.
    Parameter gradients are accumulated into ``.grad`` as ``loss.backward()`` would.
    """
    if not callable(embed) or not callable(loss_fn):
        raise TypeError("cached_step: embed and loss_fn must be callables")
    chunk_size = V.check_int(chunk_size, "chunk_size")
    n = next((x.shape[0] if isinstance(x, Tensor) else len(x) for x in inputs if x is not None), None)
    if n is None:
        raise ValueError("cached_step: inputs holds no batch (every entry is None)")
    for x in inputs:
        if x is not None and (x.shape[0] if isinstance(x, Tensor) else len(x)) != n:
            raise ValueError(f"cached_step: every input must have the same batch size ({n} rows), got "
                             f"{x.shape[0] if isinstance(x, Tensor) else len(x)}")
    slices = chunk_slices(n, chunk_size)
    embs, states = embed_without_graph(embed, inputs, slices, module)
    leaves = [e.detach().requires_grad_(e.is_floating_point()) for e in embs]
    out = loss_fn(*leaves)
    loss = out[0] if isinstance(out, tuple) else out
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        raise ValueError("cached_step: loss_fn must return a scalar tensor (or a tuple starting with one)")
    loss.backward()
    grads = [leaf.grad for leaf in leaves]
    replay_backward(replay_embed or embed, inputs, slices, states, grads, no_sync)
    return out, tuple(e.detach() for e in embs)
