// A query's relevance as the kernels read it, whether the call gave a matrix or lists
// (docs/spec.md §2.1b, params.h's ListsIn): one row of nc values through a stride. From
// lists the row is built in the caller's buffer (zeros, then the listed values: O(nc + k)),
// so a kernel that gathers a dense row reads the same thing either way and the (n, m)
// relevance is never made.
#pragma once

#include <algorithm>
#include <cstdint>

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

}  // namespace cpu
}  // namespace fastrank
