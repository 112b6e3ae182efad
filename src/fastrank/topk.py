"""Relevance as each query's k best candidates: :class:`TopKRelevance` (docs/spec.md §2.1b).

A graded relevance matrix (N, M) in which each row holds at most k nonzero entries (a
teacher's top k per query, the matching captions of an image, the documents of a
sentence-transformers batch) is given as two (N, k) tensors: ``indices`` (the column of each
entry, -1 for none) and ``values`` (its relevance). It is never expanded to (N, M) on the
native path: the kernels read each query's list, and a list whose items are mostly of gain 0
takes the sparse path (docs/spec.md §2.1b), O(M * k) per query instead of O(M^2).

The t2i direction ranks the columns, as with a dense relevance (the transpose, never the
rows again): :meth:`TopKRelevance.column_lists` gives each column's entries, computed on the
tensors' device without reading them on the host (no CUDA synchronisation).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor


class Lists(NamedTuple):
    """A sparse matrix by rows, as the kernels read it: row q's entries are positions
    ``offsets[q] .. offsets[q + 1] - 1`` of ``index`` (their column; one outside [0, columns):
    no entry) and ``values``. ``offsets`` may be a slice of a longer one (a block of rows): the
    positions are absolute."""
    offsets: Tensor   # (rows + 1,) int64
    index: Tensor     # (nnz,) int64
    values: Tensor    # (nnz,) float

    def rows(self, start: int, stop: int) -> "Lists":
        """Rows ``start .. stop - 1`` (a view: no copy, no host read)."""
        return Lists(self.offsets[start:stop + 1], self.index, self.values)

    def row_of_entries(self) -> Tensor:
        """The row of each entry of ``index`` (-1 or ``rows`` for an entry of no row here)."""
        positions = torch.arange(self.index.numel(), device=self.index.device)
        return torch.searchsorted(self.offsets, positions, right=True) - 1

    def dense(self, start: int, stop: int, columns: int, dtype: torch.dtype, row_of: Optional[Tensor] = None) -> Tensor:
        """Rows ``start .. stop - 1`` as a (stop - start, columns) matrix (zeros but the listed
        entries; a bool matrix: the entries of nonzero value), made on the device without a host
        read. ``row_of``: :meth:`row_of_entries`, when the caller keeps it for several blocks."""
        row_of = self.row_of_entries() if row_of is None else row_of
        rows = stop - start
        keep = (row_of >= start) & (row_of < stop) & (self.index >= 0) & (self.index < columns)
        dump = rows * columns
        pos = torch.where(keep, (row_of - start) * columns + self.index, torch.full_like(self.index, dump))
        values = self.values if dtype != torch.bool else self.values != 0
        out = torch.zeros(dump + 1, dtype=dtype, device=self.index.device)
        out.scatter_(0, pos, values.to(dtype))
        return out[:dump].view(rows, columns)


@dataclass(frozen=True)
class TopKRelevance:
    """A relevance matrix of shape (N, ``num_columns``) given by each row's k best entries.

    indices: (N, k) int64, the column of each entry, -1 for an unused slot (a row with fewer
        than k entries); no column twice in a row.
    values: (N, k) float, the relevance of each entry (>= 0 for smooth-NDCG's gains); an
        entry with index -1 is ignored whatever its value.
    num_columns: M, the number of candidates of a row (sim's second dimension).

    Every entry not listed has relevance 0. Build one with :meth:`from_dense` (a row's k
    largest values) or from caption or teacher embeddings, in blocks, with
    :func:`fastrank.relevance.relevance_topk` and :func:`fastrank.relevance.teacher_relevance_topk`.
    """
    indices: Tensor
    values: Tensor
    num_columns: int

    @property
    def shape(self):
        return (self.indices.shape[0], self.num_columns)

    @property
    def k(self) -> int:
        return self.indices.shape[1]

    @property
    def device(self) -> torch.device:
        return self.indices.device

    @classmethod
    def from_dense(cls, relevance: Tensor, k: int) -> "TopKRelevance":
        """Each row's k largest entries of a dense (N, M) relevance (ties: the lower column
        first); entries of value 0 are listed as unused (-1)."""
        k = min(int(k), relevance.shape[1])
        values, indices = torch.sort(relevance, dim=1, descending=True, stable=True)
        values, indices = values[:, :k], indices[:, :k]
        indices = torch.where(values != 0, indices, torch.full_like(indices, -1))
        return cls(indices.to(torch.int64), values, relevance.shape[1])

    def to_dense(self, dtype: Optional[torch.dtype] = None) -> Tensor:
        """The (N, M) relevance matrix (for the reference path and tests: O(N * M) memory). A
        column listed twice in a row (refused where the value check is on) takes the later
        entry's value, as the kernels do (docs/spec.md §2.1b)."""
        n, m = self.shape
        out = torch.zeros(n, m + 1, dtype=dtype or self.values.dtype, device=self.device)
        col = torch.where(self.indices >= 0, self.indices, torch.full_like(self.indices, m))
        if self.k > 1:  # an entry with a later twin in its row writes nothing (scatter_ picks no winner)
            srt, order = torch.sort(col, dim=1, stable=True)
            twin = torch.zeros_like(col, dtype=torch.bool)
            twin.scatter_(1, order[:, :-1], srt[:, :-1] == srt[:, 1:])
            col = torch.where(twin, torch.full_like(col, m), col)
        out.scatter_(1, col, self.values.to(out.dtype))
        return out[:, :m]

    def column_lists(self) -> Lists:
        """The columns as :class:`Lists` (the t2i direction's lists, for the CUDA kernels; the
        CPU kernels make them from the rows' by a counting pass; the rows' are views of
        ``indices`` and ``values``, ``fastrank.ops._launch.relevance_lists``): entries sorted by column, then row, then slot; no host read (static
        shapes: every slot is kept, the unused ones after the last column's)."""
        n, k = self.indices.shape
        m = self.num_columns
        flat = self.indices.reshape(-1)
        rows = torch.arange(n, dtype=torch.int64, device=self.device).repeat_interleave(k)
        col = torch.where((flat >= 0) & (flat < m), flat, torch.full_like(flat, m))
        order = torch.argsort(col * max(n, 1) + rows, stable=True)  # a row's twin entries keep their order
        counts = torch.zeros(m + 1, dtype=torch.int64, device=self.device)
        counts.scatter_add_(0, col, torch.ones_like(col))
        offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts[:m], 0)])
        return Lists(offsets, rows[order], self.values.reshape(-1)[order])

    def rows_of(self, start: int, stop: int) -> "TopKRelevance":
        """Rows ``start .. stop - 1`` (views)."""
        return TopKRelevance(self.indices[start:stop], self.values[start:stop], self.num_columns)

    def columns_of(self, start: int, stop: int) -> "TopKRelevance":
        """Columns ``start .. stop - 1``: the (N, stop - start) relevance of those columns, each
        row's other entries unused (-1); ``self`` when that is every column."""
        if start == 0 and stop == self.num_columns:
            return self
        inside = (self.indices >= start) & (self.indices < stop)
        return TopKRelevance(torch.where(inside, self.indices - start, torch.full_like(self.indices, -1)),
                             self.values, stop - start)

    def to(self, *args, **kwargs) -> "TopKRelevance":
        """``values.to(...)`` (a dtype, a device or both); the indices follow a device change."""
        values = self.values.to(*args, **kwargs)
        return TopKRelevance(self.indices.to(values.device), values, self.num_columns)

    def detach(self) -> "TopKRelevance":
        return TopKRelevance(self.indices, self.values.detach(), self.num_columns)


def accepts_topk(fn: Callable) -> bool:
    """Whether ``fn`` (a loss function) takes its ``relevance`` as a :class:`TopKRelevance`:
    what that argument is annotated with (``smooth_ndcg_loss``, ``kendall_loss``)."""
    hint = typing.get_type_hints(fn).get("relevance")
    return TopKRelevance in typing.get_args(hint)
