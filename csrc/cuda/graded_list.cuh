// A graded loss's list gathered into its block's scratch (smooth-NDCG version 2, smooth_ndcg.cu;
// Kendall, kendall.cu): its scores and its relevance made contiguous, whatever the strides of
// sim and whether the relevance is a matrix or lists (docs/spec.md §2.1b, params.h's ListsIn:
// the (n, m) matrix is never made), and its items of nonzero relevance compacted, so that the
// kernels' sparse passes (an item of relevance 0 in no pair of its own) walk them alone.
//
// One block of kThreads threads a list. Three passes over the list: the gather (one strided
// read of its row or column of sim and of the relevance matrix), then, from lists, the list's
// entries (O(k): zeros first, an entry outside [0, len) or on a masked item is no entry, an item
// listed twice takes the later entry, as on the CPU: an integer max a listed entry, the only
// atomics, so the result is the same run to run even for that bad input), then the count and
// the compaction (a ballot a warp and the warps' counts in order: list order, deterministic).
#pragma once

#include <cuda_runtime.h>

#include <limits>

#include "fastrank/common.h"
#include "fastrank/launch.h"
#include "fastrank/params.h"

namespace fastrank {
namespace cuda {

// One list of a call: item c of list q is element (q, c) of sim (a row) or (c, q) (a column),
// through the strides of sim (s_), of the relevance matrix (r_) and of the mask (m_).
struct ListRef {
  int64_t q, s_q, s_c, r_q, r_c, m_q, m_c, len;
};

// List q of a direction (a row for i2t; for t2i a column, read through the swapped strides).
template <class P> __device__ __forceinline__ ListRef list_ref(const P& p, bool t2i, int64_t q) {
  return t2i ? ListRef{q, p.sim.s1, p.sim.s0, p.rel.s1, p.rel.s0, p.mask.s1, p.mask.s0, p.lists.n}
             : ListRef{q, p.sim.s0, p.sim.s1, p.rel.s0, p.rel.s1, p.mask.s0, p.mask.s1, p.lists.m};
}

__device__ __forceinline__ bool in_list(const ListRef& L, const uint8_t* mask, int64_t c) {
  return c < L.len && (mask == nullptr || mask[L.q * L.m_q + c * L.m_c] != 0);
}

template <typename A> struct ListCounts {
  A nv;    // the valid items (in the list: not masked)
  A nans;  // the valid items of NaN relevance
  A pois;  // the sum of poison(s) + poison(r) over the valid items (NaN iff one is non-finite)
  int np;  // the rows: the valid items of nonzero relevance (a NaN counts)
};

// Gathers list L into s, r (span values each, span >= len): for a valid item c, s[c] = its score
// and r[c] = its relevance in the accumulation type; s_out and r_out elsewhere. rows[0, np) gets
// the rows' items, in list order, and row_rel[0, np) their relevance (row_rel may be null);
// rows has room for span ints. red: kThreads values, warp_count: kThreads / 32 ints, of shared
// memory. Every thread returns the same counts; ends with a barrier.
template <int kThreads, typename T, typename R, typename A>
__device__ ListCounts<A> gather_list(const ListRef& L, const T* sim, const R* rel, const ListsIn& lists,
                                     const uint8_t* mask, int64_t span, A s_out, A r_out, A* s, A* r, int* rows,
                                     A* row_rel, A* red, int* warp_count) {
  constexpr int kWarps = kThreads / 32;
  const bool from_lists = lists.offsets != nullptr;
  A count = 0;
  for (int64_t c = threadIdx.x; c < span; c += kThreads) {
    const bool ok = in_list(L, mask, c);
    s[c] = ok ? load(sim[L.q * L.s_q + c * L.s_c]) : s_out;
    r[c] = !ok ? r_out : from_lists ? A(0) : A(load(rel[L.q * L.r_q + c * L.r_c]));
    if (from_lists) rows[c] = -1;  // the entry that sets item c (below)
    count += ok ? A(1) : A(0);
  }
  if (from_lists) {
    const int64_t e0 = lists.offsets[L.q], e1 = lists.offsets[L.q + 1];
    auto item = [&](int64_t e) {
      const int64_t c = lists.index[e];
      return c >= 0 && in_list(L, mask, c) ? c : int64_t(-1);
    };
    __syncthreads();
    for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
      const int64_t c = item(e);
      if (c >= 0) atomicMax(&rows[c], static_cast<int>(e - e0));
    }
    __syncthreads();
    const R* value = static_cast<const R*>(lists.value);
    for (int64_t e = e0 + threadIdx.x; e < e1; e += kThreads) {
      const int64_t c = item(e);
      if (c >= 0 && rows[c] == static_cast<int>(e - e0)) r[c] = load(value[e]);
    }
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int found = 0;  // the rows before this group of kThreads items (the same in every thread)
  A nans = 0, pois = 0;
  for (int64_t c0 = 0; c0 < L.len; c0 += kThreads) {
    const int64_t c = c0 + threadIdx.x;
    const bool ok = in_list(L, mask, c);
    const A rv = ok ? r[c] : A(0);
    nans += rv != rv ? A(1) : A(0);
    pois += ok ? poison(s[c]) + poison(rv) : A(0);
    const bool row = rv != A(0);
    const unsigned bal = __ballot_sync(0xffffffffu, row);
    if (lane == 0) warp_count[warp] = __popc(bal);
    __syncthreads();
    int before = 0, total = 0;
    for (int v = 0; v < kWarps; ++v) {
      before += v < warp ? warp_count[v] : 0;
      total += warp_count[v];
    }
    if (row) {
      const int slot = found + before + __popc(bal & ((1u << lane) - 1u));
      rows[slot] = static_cast<int>(c);
      if (row_rel != nullptr) row_rel[slot] = rv;
    }
    found += total;
    __syncthreads();  // warp_count is rewritten by the next group
  }
  return ListCounts<A>{block_sum(count, red), block_sum(nans, red), block_sum(pois, red), found};
}

// Sums v[0, kN) of every thread over the block (kThreads threads) into out[0, kN) (shared
// memory; every thread sees it on return): a butterfly over each warp, then the warps' sums in
// warp order, a fixed order. red: (kThreads / 32) * kN values of shared memory, apart from out.
template <int kThreads, int kN, typename V>
__device__ __forceinline__ void block_sums(const V (&v)[kN], V* red, V* out) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  FASTRANK_UNROLL
  for (int i = 0; i < kN; ++i) {
    const V x = warp_sum(v[i]);
    if (lane == 0) red[warp * kN + i] = x;
  }
  __syncthreads();
  if (threadIdx.x < kN) {
    V x = 0;
    for (int u = 0; u < kWarps; ++u) x += red[u * kN + threadIdx.x];
    out[threadIdx.x] = x;
  }
  __syncthreads();
}

}  // namespace cuda
}  // namespace fastrank
