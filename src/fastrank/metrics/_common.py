"""Helpers shared by the metrics: input checks, query blocks, sorting on the tensor's device.

Every metric works on the (queries, candidates) view of ``sim``: rows for "i2t" (image
queries ranking captions), columns for "t2i" (caption queries ranking images). The view
is processed in blocks of whole queries (about ``BLOCK_ELEMS`` entries each) on the
tensor's own device, so a 5K x 25K gallery never needs more than a few blocks' worth of
extra memory.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .. import _validation as V

BLOCK_ELEMS = 1 << 22  # entries of (queries x candidates) processed at once
NUMPY_ON_CPU = True    # CPU tensors: sort / count with NumPy (False: the torch path used on GPUs)


def use_numpy(x: Tensor) -> bool:
    return NUMPY_ON_CPU and x.device.type == "cpu"


class MetricResult(dict):
    """A plain ``dict`` of metric values with one extra attribute, ``skipped``.

    ``skipped`` maps a metric key (``"i2t"``, ``"t2i"``, or an :func:`evaluate` key such as
    ``"i2t_tau"``) to the number of queries left out of that mean because the metric is
    undefined for them (a constant score or relevance list for Kendall tau and CS@K, no
    positive for mAP@R and R-Precision). Keys with nothing skipped hold 0.
    """

    def __init__(self, values=(), skipped: Optional[Dict[str, int]] = None):
        super().__init__(values)
        self.skipped: Dict[str, int] = dict(skipped or {})

    def __repr__(self) -> str:
        return f"MetricResult({dict.__repr__(self)}, skipped={self.skipped})"


# Order (as everywhere in fastrank, _validation.py): the structure of every argument
# first (types, shapes, dtypes, devices, then ks / k), the values last (check_values and
# caption_to_image_values), so a wrong shape or device is reported as such and never as
# an error from inside a value check.

def check_scores(sim, *, values: bool = True) -> Tensor:
    """sim: float (N, M) tensor (finite, with ``values``); returned detached, half types
    as float32."""
    V.check_sim(sim, values=values)
    sim = sim.detach()
    if sim.dtype in (torch.float16, torch.bfloat16):
        sim = sim.float()
    return sim


def check_graded(relevance, sim: Tensor, *, values: bool = True) -> Tensor:
    """relevance: float tensor of sim's shape and device (finite, with ``values``);
    returned detached, half types as float32 (blocks are promoted to float64 where gains
    are summed)."""
    V.check_relevance(relevance, sim, values=values)
    relevance = relevance.detach()
    if relevance.dtype in (torch.float16, torch.bfloat16):
        relevance = relevance.float()
    return relevance


def check_values(sim: Tensor, relevance: Optional[Tensor] = None, *,
                 relevance_min: Optional[float] = None, metric: str = "") -> None:
    """The value checks of a metric call, after every structure check: NaN/inf in sim and
    relevance (and relevance >= relevance_min), one pass per tensor, where the value check
    is on (docs/spec.md §1). With the check off, a minimum on relevance is still enforced (one
    comparison pass): a metric's definition needs it."""
    if V.check_finite_enabled(sim.device):
        V.check_data(sim, relevance, relevance_min=relevance_min, loss=metric)
    elif relevance is not None and relevance_min is not None and bool((relevance < relevance_min).any()):
        V.check_relevance_values(relevance, minimum=relevance_min, loss=metric)


def check_caption_to_image(caption_to_image, sim: Tensor, *, every_image: bool = False,
                           values: bool = True) -> Tensor:
    """caption_to_image: integer (n_captions,) tensor on sim's device, values in
    [0, n_images) (with ``values``; else call :func:`caption_to_image_values` once every
    other argument's structure is checked). With every_image, each image must own at least
    one caption. Returned as int64."""
    n_img, n_cap = sim.shape
    x = caption_to_image
    if not isinstance(x, Tensor):
        raise TypeError(f"caption_to_image must be an integer torch.Tensor, got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"caption_to_image must have an integer dtype, got {x.dtype}")
    if x.dim() != 1 or x.shape[0] != n_cap:
        raise ValueError(
            f"caption_to_image must have shape (n_captions,) = ({n_cap},) to match sim of shape "
            f"{tuple(sim.shape)}, got {tuple(x.shape)}")
    if x.device != sim.device:
        raise ValueError(f"caption_to_image is on {x.device} but sim is on {sim.device}")
    x = x.long()
    if values:
        caption_to_image_values(x, sim, every_image=every_image)
    return x


def caption_to_image_values(x: Tensor, sim: Tensor, *, every_image: bool = False) -> Tensor:
    """The value part of :func:`check_caption_to_image` (x already int64 of the right
    shape and device): ids in [0, n_images), and with every_image no image left without a
    caption. Always read (the metrics need valid ids to index with)."""
    n_img = sim.shape[0]
    lo, hi = (int(v) for v in torch.aminmax(x))
    if lo < 0 or hi >= n_img:
        raise ValueError(
            f"caption_to_image values must be image indices in [0, {n_img}), got values in [{lo}, {hi}]")
    if every_image:
        counts = torch.bincount(x, minlength=n_img)
        if bool((counts == 0).any()):
            missing = int((counts == 0).nonzero()[0])
            raise ValueError(
                f"caption_to_image gives image {missing} no caption: every image (row of sim) "
                f"needs at least one ground-truth caption")
    return x


def check_positives_any(positives, sim: Tensor, *, values: bool = True) -> Tuple[str, Tensor]:
    """positives: a bool (N, M) mask, or caption_to_image (n_captions,) integer ids.
    Returns ("mask", mask) or ("c2i", caption_to_image); without ``values`` the ids'
    range is left to :func:`caption_to_image_values`."""
    if isinstance(positives, Tensor) and positives.dtype == torch.bool:
        return "mask", V.check_positives(positives, sim)
    if isinstance(positives, Tensor) and positives.dim() == 2:
        raise TypeError(f"positives given as an (N, M) mask must have dtype torch.bool, got {positives.dtype}")
    try:
        return "c2i", check_caption_to_image(positives, sim, values=values)
    except TypeError:
        raise TypeError(
            "positives must be a bool (N, M) tensor or caption_to_image, an integer (n_captions,) "
            f"tensor; got {type(positives).__name__}"
            + (f" of dtype {positives.dtype}" if isinstance(positives, Tensor) else "")) from None


def check_ks(ks, name: str) -> Tuple[int, ...]:
    """One integer >= 1 or a non-empty sequence of them."""
    if isinstance(ks, (tuple, list)) and len(ks) == 0:
        raise ValueError(f"{name} must be a non-empty tuple of integers >= 1, got {ks!r}")
    return V.check_sequence(ks, name, V.check_int, scalar=True)


def orient(x: Tensor, direction: str) -> Tensor:
    """The (queries, candidates) view for a direction."""
    return x if direction == "i2t" else x.t()


def blocks(n_queries: int, n_candidates: int) -> Iterator[Tuple[int, int]]:
    """[start, stop) ranges of whole queries with about ``BLOCK_ELEMS`` entries each."""
    step = max(1, BLOCK_ELEMS // max(1, n_candidates))
    for a in range(0, n_queries, step):
        yield a, min(n_queries, a + step)


def caption_lists(caption_to_image: Tensor, n_images: int) -> Tuple[Tensor, Tensor]:
    """Each image's caption ids: (n_images, max captions per image) int64, ascending,
    padded by repeating the image's first caption, and the counts (n_images,).
    Images without captions get count 0 (and the id 0 as padding)."""
    c2i = caption_to_image
    counts = torch.bincount(c2i, minlength=n_images)
    order = torch.sort(c2i, stable=True).indices               # caption ids grouped by image
    width = max(1, int(counts.max()) if counts.numel() else 1)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(width, device=c2i.device)
    valid = slot.unsqueeze(0) < counts.unsqueeze(1)
    pos = torch.where(valid, starts.unsqueeze(1) + slot.unsqueeze(0), starts.unsqueeze(1))
    return order[pos.clamp_max(max(0, c2i.numel() - 1))], counts


_POOL: Optional[ThreadPoolExecutor] = None
_POOL_SIZE = 0


def cpu_threads() -> int:
    """Threads for the NumPy / SciPy row loops (which release the GIL): torch's intra-op
    thread count, capped by the CPU count."""
    return max(1, min(torch.get_num_threads(), os.cpu_count() or 1))


def parallel_rows(fn, rows: int, min_rows: int = 2) -> None:
    """Run fn(lo, hi) over row ranges covering [0, rows), on cpu_threads() threads."""
    global _POOL, _POOL_SIZE
    k = min(cpu_threads(), rows // max(1, min_rows))
    if k <= 1:
        fn(0, rows)
        return
    if _POOL is None or _POOL_SIZE < k:
        _POOL, _POOL_SIZE = ThreadPoolExecutor(k, thread_name_prefix="fastrank-metrics"), k
    cuts = np.linspace(0, rows, k + 1).astype(int)
    for f in [_POOL.submit(fn, lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:])]:
        f.result()


def _np_rows(x: Tensor, op, dtype) -> Tensor:
    a = x.contiguous().numpy()
    out = np.empty(a.shape, dtype=dtype)

    def work(lo, hi):
        out[lo:hi] = op(a[lo:hi], axis=1)

    parallel_rows(work, a.shape[0])
    return torch.from_numpy(out)


def count_at_least(x: Tensor, thr: Tensor) -> Tensor:
    """(R, k) int64: out[r, j] = #{c : x[r, c] >= thr[r, j]} for x (R, n), thr (R, k).
    NumPy on CPU (several times faster than torch's bool reductions there)."""
    rows, n = x.shape
    k = thr.shape[1]
    if use_numpy(x):
        a = x.contiguous().numpy()
        t = thr.to(x.dtype).contiguous().numpy()
        out = np.empty((rows, k), dtype=np.int64)

        def work(lo, hi):
            for j in range(k):
                out[lo:hi, j] = np.count_nonzero(a[lo:hi] >= t[lo:hi, j:j + 1], axis=1)

        parallel_rows(work, rows, min_rows=64)
        return torch.from_numpy(out)
    out = torch.empty(rows, k, dtype=torch.int64, device=x.device)
    step = max(1, BLOCK_ELEMS // max(1, rows * n))
    for j in range(0, k, step):
        out[:, j:j + step] = (x.unsqueeze(1) >= thr[:, j:j + step].unsqueeze(2)).sum(dim=2)
    return out


def argsort_rows(x: Tensor) -> Tensor:
    """Ascending argsort of each row of a 2-D tensor (int64 indices, any tie order).

    CPU tensors use NumPy's SIMD (AVX-512/AVX2) quicksort on a few threads, several times
    faster than torch.sort on CPU; other devices use torch.argsort on the device.
    """
    if use_numpy(x):
        return _np_rows(x, np.argsort, np.int64)
    return torch.argsort(x, dim=1)


def sort_rows(x: Tensor) -> Tensor:
    """Ascending sorted values of each row (see argsort_rows)."""
    if use_numpy(x):
        return _np_rows(x, np.sort, x.numpy().dtype)
    return torch.sort(x, dim=1).values


class TieRuns:
    """The runs of equal values (length >= 2) of sorted rows, kept sparse: ties are rare
    in real scores, so everything tie-related works on the runs' members only.

    Attributes (one entry per run): ``row``, ``start`` (column of the run's first element),
    ``length``; per continuation (each member after the first): ``cont_flat`` (flat index
    row * n + column) and ``cont_run`` (its run). ``None`` stands for "no ties at all".
    """

    def __init__(self, row, start, length, cont_flat, cont_run, shape):
        self.row, self.start, self.length = row, start, length
        self.cont_flat, self.cont_run, self.shape = cont_flat, cont_run, shape

    @staticmethod
    def of(sorted_x: Tensor) -> Optional["TieRuns"]:
        R, n = sorted_x.shape
        if n < 2:
            return None
        cont = (sorted_x[:, 1:] == sorted_x[:, :-1]).flatten().nonzero()[:, 0]
        if cont.numel() == 0:
            return None
        row = cont // (n - 1)
        col = cont % (n - 1) + 1                      # column >= 1: runs never cross rows
        flat = row * n + col
        first = torch.ones_like(flat, dtype=torch.bool)
        first[1:] = flat[1:] != flat[:-1] + 1
        run = torch.cumsum(first.long(), 0) - 1
        length = torch.ones(int(run[-1]) + 1, dtype=torch.int64, device=flat.device).scatter_add_(
            0, run, torch.ones_like(flat))
        return TieRuns(row[first], col[first] - 1, length, flat, run, (R, n))

    def tied_pairs(self) -> Tensor:
        """Pairs tied inside the runs, per row: sum of c (c - 1) / 2. (R,) int64."""
        out = torch.zeros(self.shape[0], dtype=torch.int64, device=self.row.device)
        return out.scatter_add_(0, self.row, self.length * (self.length - 1) // 2)

    def labels(self) -> Tensor:
        """(R, n) int64 labels, nondecreasing along each sorted row and equal inside a
        run: 1-based column, a run's members taking its first column (competition rank)."""
        R, n = self.shape
        lab = torch.arange(1, n + 1, device=self.row.device).repeat(R, 1)
        lab.view(-1)[self.cont_flat] = self.start[self.cont_run] + 1
        return lab

    def members(self) -> Tuple[Tensor, Tensor]:
        """(flat index, run) of every member of every run (starts and continuations)."""
        R, n = self.shape
        start_flat = self.row * n + self.start
        runs = torch.arange(self.row.numel(), device=self.row.device)
        return torch.cat((start_flat, self.cont_flat)), torch.cat((runs, self.cont_run))


def arange_labels(R: int, n: int, device) -> Tensor:
    """Labels of tie-free sorted rows: 1..n on every row."""
    return torch.arange(1, n + 1, device=device).expand(R, n)


def no_ties(R: int, device) -> Tensor:
    return torch.zeros(R, dtype=torch.int64, device=device)


def both_directions(fn, *args, **kwargs) -> MetricResult:
    """MetricResult {"i2t": ..., "t2i": ...} from fn(direction, ...) -> (mean, skipped)."""
    out = MetricResult()
    for d in ("i2t", "t2i"):
        out[d], out.skipped[d] = fn(d, *args, **kwargs)
    return out

