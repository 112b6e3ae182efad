"""A loss value with the model's parameter gradients, and two of them compared: the checks
that a sentence-transformers loss (bi-encoder or cross-encoder) equals fastrank's functional
loss on the same scores."""
from __future__ import annotations

import torch


def grads(model):
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def loss_and_grads(model, fn):
    model.zero_grad(set_to_none=True)
    value = fn()
    value.backward()
    return value.detach(), grads(model)


def assert_same(a, b, rtol=1e-9, atol=1e-12):
    (va, ga), (vb, gb) = a, b
    torch.testing.assert_close(va, vb, rtol=rtol, atol=atol)
    assert ga.keys() == gb.keys() and ga
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=rtol, atol=atol, msg=k)
    assert any(float(g.abs().max()) > 0 for g in ga.values())
