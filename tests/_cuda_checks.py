"""The CUDA checks every fused loss shares (docs/spec.md §1: no host sync, capturable in a CUDA graph), for a loss ``fn(sim, rel)``:

- ``graph_replay``: one forward+backward captured in a CUDA graph and replayed, returning the
  loss and sim's gradient (the test compares them with an eager call;
  ``assert_graph_replay_equals_eager`` does both; given CPU tensors it checks the same step
  eagerly, twice, so that the step's call is exercised on a machine without a GPU);
- ``reduce_overhead_steps``: a few SGD steps of ``torch.compile(mode="reduce-overhead")``;
- ``device_activity``: the kernels one forward+backward launches and any host-device copy;
  ``call_activity``: the same for any call.
"""
from __future__ import annotations

import torch


def graph_replay(fn, sim, rel):
    s = sim.clone().requires_grad_(True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graphs asks
        for _ in range(2):
            s.grad = None
            fn(s, rel).backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    s.grad = None
    with torch.cuda.graph(graph):
        loss = fn(s, rel)
        loss.backward()
    graph.replay()
    torch.cuda.synchronize()
    return loss.detach(), s.grad


def eager_step(fn, sim, rel):
    """One eager forward+backward of fn: the loss and sim's gradient."""
    s = sim.clone().requires_grad_(True)
    loss = fn(s, rel)
    loss.backward()
    return loss.detach(), s.grad


def assert_graph_replay_equals_eager(fn, sim, rel):
    """graph_replay's loss and gradient equal an eager call's. On the CPU, where there are no
    graphs, a second eager call stands in for the replay (the kernels are deterministic), so a
    step that cannot be called fails there, not only on a GPU."""
    loss, grad = graph_replay(fn, sim, rel) if sim.is_cuda else eager_step(fn, sim, rel)
    eager_loss, eager_grad = eager_step(fn, sim, rel)
    torch.testing.assert_close(loss, eager_loss)
    torch.testing.assert_close(grad, eager_grad)


def reduce_overhead_steps(fn, sim, rel, steps: int = 3):
    """The loss of the last of `steps` SGD steps on fn(sim @ w, rel), compiled with
    mode="reduce-overhead" (CUDA graphs under torch.compile)."""
    n = sim.shape[1]
    w = torch.nn.Parameter(torch.randn(n, n, device="cuda"))
    opt = torch.optim.SGD([w], lr=0.1)

    @torch.compile(mode="reduce-overhead")
    def step(x, r):
        return fn(x @ w, r)

    for _ in range(steps):
        opt.zero_grad()
        loss = step(sim.cuda(), rel.cuda())
        loss.backward()
        opt.step()
    return loss


def device_activity(fn, sim, rel):
    """(kernel names, host-device copy names) of one fn(sim, rel).backward() after a warm-up
    call, from torch.profiler."""
    s = sim.detach().clone().requires_grad_(True)
    fn(s, rel).backward()  # warm-up (first-call allocations, lazy init)
    s.grad = None          # a second backward would add into s.grad: an extra kernel
    return call_activity(lambda: fn(s, rel).backward())


def call_activity(call):
    """(kernel names, host-device copy names) of one call(), from torch.profiler (warm it up
    first)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    kernels = [k for k in names if "memcpy" not in k.lower() and "memset" not in k.lower()]
    copies = [e.name for e in prof.events()
              if any(t in e.name for t in ("DtoH", "HtoD", "Device -> Host", "Device -> Pageable",
                                           "Device -> Pinned", "Pageable -> Device"))]
    return kernels, copies
