// A query's relevance as the kernels read it, whether the call gave a matrix or lists
// (docs/spec.md §2.1b, params.h's ListsIn): one row of nc values through a stride. From
// lists the row is built in the caller's buffer (zeros, then the listed values: O(nc + k)),
// so a kernel that gathers a dense row reads the same thing either way and the (n, m)
// relevance is never made. The t2i direction's lists (the columns) are made here from the
// rows' by one counting pass (column_lists), once per call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "fastrank/params.h"

namespace fastrank {
namespace cpu {

template <typename T> struct RowView {
  const T* row;
  int64_t stride;
};

// Query q's row: of the matrix rel (query stride rq, candidate stride rc), or, when lists
// are given, built into buf (nc values).
template <typename T>
inline RowView<T> relevance_row(const ListsIn& lists, const T* rel, int64_t rq, int64_t rc, int64_t q,
                                   int64_t nc, T* buf) {
  if (lists.offsets == nullptr) return {rel + q * rq, rc};
  std::fill(buf, buf + nc, T(0));
  const T* value = static_cast<const T*>(lists.value);
  for (int64_t e = lists.offsets[q]; e < lists.offsets[q + 1]; ++e) {
    const int64_t c = lists.index[e];
    if (c >= 0 && c < nc) buf[c] = value[e];
  }
  return {buf, 1};
}

// Lists the kernel made itself (column_lists), and their ListsIn.
template <typename T> struct OwnedLists {
  std::vector<int64_t> offsets, index;
  std::vector<T> value;
  ListsIn view() const { return {offsets.data(), index.data(), value.data()}; }
};

// The columns of `rows` (the lists of n rows over m columns) as lists, by one counting pass,
// O(nnz + m): column c's entries are the rows that list c, in row order (deterministic), with
// their values; an entry outside [0, m) (an unused slot, -1) is no entry.
template <typename T>
OwnedLists<T> column_lists(const ListsIn& rows, int64_t n, int64_t m) {
  OwnedLists<T> cols;
  cols.offsets.assign(m + 1, 0);
  const int64_t nnz = rows.offsets[n] - rows.offsets[0];
  for (int64_t e = rows.offsets[0]; e < rows.offsets[n]; ++e) {
    const int64_t c = rows.index[e];
    if (c >= 0 && c < m) ++cols.offsets[c + 1];
  }
  for (int64_t c = 0; c < m; ++c) cols.offsets[c + 1] += cols.offsets[c];
  cols.index.resize(nnz);
  cols.value.resize(nnz);
  std::vector<int64_t> at(cols.offsets.begin(), cols.offsets.end() - 1);
  const T* value = static_cast<const T*>(rows.value);
  for (int64_t q = 0; q < n; ++q) {
    for (int64_t e = rows.offsets[q]; e < rows.offsets[q + 1]; ++e) {
      const int64_t c = rows.index[e];
      if (c < 0 || c >= m) continue;
      const int64_t k = at[c]++;
      cols.index[k] = q;
      cols.value[k] = value[e];
    }
  }
  return cols;
}

}  // namespace cpu
}  // namespace fastrank
