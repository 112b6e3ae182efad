"""The vectorised PyTorch losses (SPEC 2.4-2.6), for comparison with the native ops.

    python benchmarks/bench_losses.py

triplet_loss (hardest / soft / all negatives), ladder_loss (hard rungs) and topk_loss
are plain PyTorch (no kernels): O(N*M) memory, a few passes over sim. They are timed
eager and under torch.compile, forward+backward and forward, so their cost can be read
next to the native ranking losses of the same N (a triplet step is the price a
listwise loss is compared against).
"""
if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    import pathlib
    import sys
    _here = pathlib.Path(__file__).resolve()
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _here.parent]
    sys.path.append(str(_here.parents[1]))  # after site-packages: an installed fastrank wins

import functools

import torch

import fastrank
from benchmarks import baselines
from benchmarks.harness import OpBench
from benchmarks.pairwise import make_inputs


def _spec(name, call):
    """call(sim, relevance) -> loss, with the loss's defaults."""
    def compiled():
        baselines._raise_recompile_limit()
        return torch.compile(call, dynamic=True)
    return OpBench(
        name=name,
        impls={"eager": lambda: call, "compiled": compiled},
        sizes={
            "cpu": [{"n": n, "m": n} for n in (128, 512, 2048)],
            "cuda": [{"n": n, "m": n} for n in (512, 2048, 8192)],
            "quick": [{"n": 32, "m": 32}],
        },
        make_inputs=make_inputs,
        work=lambda s: s["n"] * s["m"],
        est_bytes=lambda impl, mode, s, itemsize: 16 * s["n"] * s["m"] * max(itemsize, 4),
        floor_counts=None,
        modes=("forward+backward", "forward"),
        baseline="eager",
        group="losses",
        notes="pure PyTorch; default hyper-parameters, direction=both, reduction=mean",
    )


def _triplet(mining):
    return functools.partial(lambda sim, relevance, mining: fastrank.triplet_loss(sim, mining=mining),
                             mining=mining)


LOSSES = [
    _spec("triplet_hardest", _triplet("hardest")),
    _spec("triplet_soft", _triplet("soft")),
    _spec("triplet_all", _triplet("all")),
    _spec("ladder", lambda sim, relevance: fastrank.ladder_loss(sim, relevance)),
    _spec("topk", lambda sim, relevance: fastrank.topk_loss(sim)),
]


if __name__ == "__main__":
    from benchmarks.runner import main
    raise SystemExit(main(default_ops=["losses"], default_modes=["forward+backward", "forward"],
                          name_suffix="-losses", description=__doc__.splitlines()[0]))
