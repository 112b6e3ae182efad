// The smooth-rank engine on CUDA for the heads whose rows are a list's positives (Smooth-AP,
// Recall@k; smooth-NDCG, whose rows are every item, keeps its thread-per-element tiles in
// smooth_ndcg.cu). Contract and workspace: csrc/include/fastrank/smooth_ap.h, params.h.
//
// Launches: forward = 1 kernel (+ 1 tiled transpose of the t2i lists when t2i is asked
// for, + 1 one-block reduction for mean/sum), backward = 1 tiled elementwise kernel, for
// every N and direction; no host sync, no host-device copy.
// Column lists: a t2i query's list is a column of sim (and of positives, mask and G), which
// read in place is one 32-byte sector per 4- or 1-byte element on each of the ~10 passes
// below (8-32x the bytes, whatever the element size: measured on an H100, the engine ran
// 50-180x its floor, bfloat16 no faster than float32). So the forward first transposes sim,
// positives and mask into the scratch (32 x 32 tiles through shared memory, coalesced on both
// sides), every query then walks a contiguous list, and a column query's G row is written
// contiguously into w_t2i, which is therefore (m, n); the backward transposes it back tile by
// tile as it sums the directions.
// Forward tiling: one block of kThreads threads per query, grid-strided over the queries
// (the i2t rows, then the t2i columns as rows of the transposes), in three phases:
//  1. ranks: warp w takes the positives whose order in the list is w mod 8. A warp finds the
//     positives 32 candidates at a time (__ballot_sync), and for each of its own walks the
//     whole list with its 32 lanes, summing sigma(x), f sigma(x), sigma'(x), f sigma'(x)
//     (x = (s_k - s_j) / tau, f = positive; the self pair included, as on the CPU) in a
//     fixed order, reduced by butterfly shuffles. No block barrier in this phase. The four
//     sums go to the positive's slot of four `partials` arrays;
//  2. the head, block-wide: each thread reads its own candidates' ranks (strided), the
//     block sums the head's statistics (fixed-tree block_sum), and each thread writes its
//     positives' coefficients u, v and T = u S1 + v S2 back into the partials;
//  3. the gradient row: the positives are staged in shared memory 256 at a time (their
//     order in the list: a warp ballot and a prefix of the 8 warps' counts), and each
//     thread adds sum_j sigma'(x_jk) (u_j + v_j f_k) to its own candidates' entries of G,
//     then subtracts T_k for a positive k and scales by 1 / tau. Each entry of G is owned by
//     one thread of one block: no atomics; bit-identical run to run.
// Memory: G (n, m) per direction (saved for the backward); during the forward, four (n, m)
// partials per direction and, with t2i, the transposed lists (smooth_ap.h); ~7 KiB of
// shared memory. Pair work O(|P| * C) per query.
// NaN propagation (docs/spec.md §1): poison(s) of every valid item is added to the query's loss
// and to the item's own gradient entry; masked values are never read.
#pragma once

#include <cuda_runtime.h>

#include "fastrank/common.h"
#include "fastrank/launch.h"
#include "fastrank/smooth_ap.h"
#include "fastrank/params.h"

namespace fastrank {
namespace cuda {
namespace rank {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One direction's view of a query's list: candidate c of query q is sim[q * s_q + c * s_c]
// (likewise positives and mask), its slot in G and the partials q * o_q + c * o_c. A t2i
// query reads the transposed lists (contiguous rows of length n) and writes G^T.
struct ListView {
  int64_t s_q, s_c, p_q, p_c, m_q, m_c, o_q, o_c, n_c;
};

__device__ __forceinline__ ListView list_view(bool t2i, int64_t n, int64_t m, int64_t ss0, int64_t ss1, int64_t ps0,
                                              int64_t ps1, int64_t ms0, int64_t ms1) {
  if (!t2i) return ListView{ss0, ss1, ps0, ps1, ms0, ms1, m, 1, m};
  return ListView{n, 1, n, 1, n, 1, n, 1, n};
}

// Query qg of a subset forward (both versions; the i2t rows first, then the t2i columns, read
// as rows of the lists subset_transpose_kernel wrote into the partials, smooth_ap.h): its view,
// its index q in its direction, its slab of the partials (1: a t2i query after i2t ones), its
// rows of sim, the positives and the mask (null: every item valid), and its row of G.
template <typename T> struct SubsetQuery : ListView {
  int64_t q;
  int slab;
  const T* srow;
  const uint8_t* prow;
  const uint8_t* mrow;
  acc_t<T>* G;
};
template <typename T>
__device__ __forceinline__ SubsetQuery<T> subset_query(int64_t qg, int64_t n_i2t, int64_t n, int64_t m,
                                                       int direction, const T* sim, int64_t ss0, int64_t ss1,
                                                       const uint8_t* pos, int64_t ps0, int64_t ps1,
                                                       const uint8_t* mask, int64_t ms0, int64_t ms1,
                                                       const SmoothRankLayout& L, acc_t<T>* ws,
                                                       const acc_t<T>* partials) {
  const int64_t nm = n * m;
  const acc_t<T>* lists_t = partials + smooth_rank_transposed_offset(n, m, direction);  // simT, posT, maskT
  const uint8_t* posT = reinterpret_cast<const uint8_t*>(lists_t + nm);
  const bool t2i = qg >= n_i2t;
  SubsetQuery<T> r;
  static_cast<ListView&>(r) = list_view(t2i, n, m, ss0, ss1, ps0, ps1, ms0, ms1);
  r.q = t2i ? qg - n_i2t : qg;
  r.slab = t2i && n_i2t > 0 ? 1 : 0;
  r.srow = (t2i ? reinterpret_cast<const T*>(lists_t) : sim) + r.q * r.s_q;
  r.prow = (t2i ? posT : pos) + r.q * r.p_q;
  r.mrow = mask == nullptr ? nullptr : (t2i ? posT + nm : mask) + r.q * r.m_q;
  r.G = ws + (r.slab == 0 ? L.a1 : L.a2) + r.q * r.o_q;
  return r;
}

// Sizes of the tiles of the transposes (the t2i lists in the forward, G^T in the backward).
constexpr int kTile = 32;

// The tiles along an edge of x elements (both kernels' grids: tiles_along(n) * tiles_along(m)).
FR_HD int64_t tiles_along(int64_t x) { return (x + kTile - 1) / kTile; }

// The t2i lists transposed into the scratch: simT (m, n) = sim^T (bit copies of sim's
// elements, B of their size), posT and maskT (m, n) bytes (maskT untouched when mask is
// null). Tiles of 32 x 32 through shared memory, grid-strided: each warp reads 32
// consecutive columns of one row, then writes 32 consecutive rows of one column of the
// transpose, i.e. 32 consecutive elements of a row of it.
template <typename B>
__global__ void __launch_bounds__(kThreads)
subset_transpose_kernel(const B* __restrict__ sim, int64_t ss0, int64_t ss1, const uint8_t* __restrict__ pos,
                        int64_t ps0, int64_t ps1, const uint8_t* __restrict__ mask, int64_t ms0, int64_t ms1,
                        int64_t n, int64_t m, B* __restrict__ simT, uint8_t* __restrict__ posT,
                        uint8_t* __restrict__ maskT) {
  __shared__ B t_s[kTile][kTile + 1];
  __shared__ uint8_t t_p[kTile][kTile + 1], t_m[kTile][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t tiles_m = tiles_along(m), tiles = tiles_along(n) * tiles_m;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t i0 = (tile / tiles_m) * kTile, j0 = (tile % tiles_m) * kTile;
    for (int r = ty; r < kTile; r += kWarps) {  // rows i0 + r of sim, columns j0 + tx
      const int64_t i = i0 + r, j = j0 + tx;
      if (i < n && j < m) {
        t_s[r][tx] = sim[i * ss0 + j * ss1];
        t_p[r][tx] = pos[i * ps0 + j * ps1];
        if (mask != nullptr) t_m[r][tx] = mask[i * ms0 + j * ms1];
      }
    }
    __syncthreads();
    for (int r = ty; r < kTile; r += kWarps) {  // rows j0 + r of the transposes, columns i0 + tx
      const int64_t j = j0 + r, i = i0 + tx;
      if (i < n && j < m) {
        simT[j * n + i] = t_s[tx][r];
        posT[j * n + i] = t_p[tx][r];
        if (mask != nullptr) maskT[j * n + i] = t_m[tx][r];
      }
    }
    __syncthreads();  // the next tile rewrites the shared tiles
  }
}

// A positive's sums over its list, walked by one warp (lane-strided, coalesced) and reduced by
// butterfly warp sums (every lane gets them, in a fixed order): sigma(x), sigma'(x) and, for a
// head that needs the ranks among the positives (kFlagged), f sigma(x), f sigma'(x)
// (x = (s_k - s_j) / tau, f = k is a positive; the self pair included, as on the CPU).
template <typename A> struct RankSums {
  A a, b, s1, s2;
};
template <class Head, typename T, typename A>
__device__ __forceinline__ RankSums<A> rank_positive(const T* srow, const uint8_t* prow, const uint8_t* mrow,
                                                     const ListView& v, A sj, A inv_tau, int lane) {
  RankSums<A> r{A(0), A(0), A(0), A(0)};
  // pair loop: engine ranks
  for (int64_t k = lane; k < v.n_c; k += 32) {
    if (mrow != nullptr && mrow[k * v.m_c] == 0) continue;
    const Logistic<A> lg = logistic((load(srow[k * v.s_c]) - sj) * inv_tau);
    const A f = prow[k * v.p_c] != 0 ? A(1) : A(0);
    r.a += lg.pos;
    r.s1 += lg.deriv;
    if (Head::kFlagged) {
      r.b += f * lg.pos;
      r.s2 += f * lg.deriv;
    }
  }
  r.a = warp_sum(r.a);
  r.s1 = warp_sum(r.s1);
  if (Head::kFlagged) {
    r.b = warp_sum(r.b);
    r.s2 = warp_sum(r.s2);
  }
  return r;
}

// Head: kFlagged (the ranks among the positives, B, and its sums are needed), kStats (the
// per-query statistics the loss needs), n_stats() (how many of them this call uses),
// stat(i, A, B) (statistic i of one positive), loss(totals, np) and coef(A, B, totals, np,
// &u, &v). The totals live in shared memory, summed one statistic at a time: a per-thread
// array of kStats values, indexed by a loop bound known only at run time, would live in
// local memory (docs/cuda-resources.md).
template <typename T, class Head>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(4, 2))
subset_forward_kernel(const T* __restrict__ sim, int64_t ss0, int64_t ss1, const uint8_t* __restrict__ pos,
                      int64_t ps0, int64_t ps1, const uint8_t* __restrict__ mask, int64_t ms0, int64_t ms1, int64_t n,
                      int64_t m, int direction, int64_t n_i2t, int64_t n_total, acc_t<T> inv_tau, Head head,
                      int with_grad,
                      acc_t<T>* __restrict__ ws, acc_t<T>* __restrict__ partials, acc_t<T>* __restrict__ loss_none) {
  using A = acc_t<T>;
  __shared__ A scratch[kThreads];
  __shared__ A st_s[kThreads], st_u[kThreads], st_v[kThreads];  // phase 3: the staged positives
  __shared__ int warp_count[kWarps];
  __shared__ A totals[Head::kStats];  // phase 2: the head's statistics, summed over the block
  const SmoothRankLayout L = smooth_rank_layout(n, m, direction);
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t nm = n * m;
  for (int64_t qg = blockIdx.x; qg < n_total; qg += gridDim.x) {
    const SubsetQuery<T> v =
        subset_query(qg, n_i2t, n, m, direction, sim, ss0, ss1, pos, ps0, ps1, mask, ms0, ms1, L, ws, partials);
    A* X0 = partials + (v.slab * 4 + 0) * nm + v.q * v.o_q;  // A, then u
    A* X1 = partials + (v.slab * 4 + 1) * nm + v.q * v.o_q;  // B, then v
    A* X2 = partials + (v.slab * 4 + 2) * nm + v.q * v.o_q;  // S1, then T = u S1 + v S2
    A* X3 = partials + (v.slab * 4 + 3) * nm + v.q * v.o_q;  // S2
    auto valid = [&](int64_t c) { return v.mrow == nullptr || v.mrow[c * v.m_c] != 0; };
    auto positive = [&](int64_t c) { return c < v.n_c && valid(c) && v.prow[c * v.p_c] != 0; };

    // ---- phase 0: the poison of the list, its positives, G = 0
    A p_sum = 0, np_sum = 0;
    for (int64_t c = t; c < v.n_c; c += kThreads) {
      const bool ok = valid(c);
      if (ok) p_sum += poison(load(v.srow[c * v.s_c]));
      np_sum += positive(c) ? A(1) : A(0);
      if (with_grad) v.G[c * v.o_c] = A(0);
    }
    const A pois = block_sum(p_sum, scratch);
    const A np = block_sum(np_sum, scratch);

    // ---- phase 1: each warp ranks its share of the positives over the whole list
    int64_t seen = 0;  // positives before this 32-candidate chunk (the same in every lane)
    for (int64_t c0 = 0; c0 < v.n_c; c0 += 32) {
      const unsigned found = __ballot_sync(0xffffffffu, positive(c0 + lane));
      const int64_t before = seen;
      seen += __popc(found);
      for (unsigned bal = found; bal != 0; bal &= bal - 1) {  // warp-uniform: the chunk's positives in order
        const int b = __ffs(static_cast<int>(bal)) - 1;
        const int64_t order = before + __popc(found & ((1u << b) - 1u));
        if (order % kWarps != warp) continue;
        const int64_t j = c0 + b;
        const RankSums<A> r = rank_positive<Head>(v.srow, v.prow, v.mrow, v, load(v.srow[j * v.s_c]), inv_tau, lane);
        if (lane == 0) {
          X0[j * v.o_c] = r.a + A(0.5);  // 1 + (sum - sigma(0))
          X1[j * v.o_c] = r.b + A(0.5);
          X2[j * v.o_c] = r.s1;
          X3[j * v.o_c] = r.s2;
        }
      }
    }
    __syncthreads();

    // ---- phase 2: the head's statistics, the loss, the coefficients
    for (int i = 0; i < head.n_stats(); ++i) {
      A s = 0;
      for (int64_t c = t; c < v.n_c; c += kThreads) {
        if (positive(c)) s += head.stat(i, X0[c * v.o_c], X1[c * v.o_c]);
      }
      s = block_sum(s, scratch);
      if (t == 0) totals[i] = s;
    }
    __syncthreads();  // the totals are visible to the whole block
    const A qloss = (np > A(0) ? head.loss(totals, np) : A(0)) + pois;
    if (with_grad && np > A(0)) {
      for (int64_t c = t; c < v.n_c; c += kThreads) {
        if (!positive(c)) continue;
        A u, w;
        head.coef(X0[c * v.o_c], X1[c * v.o_c], totals, np, &u, &w);
        X2[c * v.o_c] = u * X2[c * v.o_c] + w * X3[c * v.o_c];
        X0[c * v.o_c] = u;
        X1[c * v.o_c] = w;
      }
    }
    if (t == 0) {
      ws[L.qloss + qg] = qloss;
      ws[L.idcg + qg] = np > A(0) ? A(1) : A(0);  // aux: the query counts in "mean"
      if (loss_none != nullptr) loss_none[qg] = qloss;
    }

    // ---- phase 3: the gradient row
    if (with_grad) {
      __syncthreads();  // the coefficients of phase 2 are visible to the whole block
      for (int64_t c0 = 0; c0 < v.n_c; c0 += kThreads) {
        const int64_t c = c0 + t;
        const bool p = positive(c);
        const unsigned bal = __ballot_sync(0xffffffffu, p);
        if (lane == 0) warp_count[warp] = __popc(bal);
        __syncthreads();
        int slot = __popc(bal & ((1u << lane) - 1u)), cnt = 0;
        for (int w = 0; w < kWarps; ++w) {
          slot += w < warp ? warp_count[w] : 0;
          cnt += warp_count[w];
        }
        if (p) {
          st_s[slot] = load(v.srow[c * v.s_c]);
          st_u[slot] = X0[c * v.o_c];
          st_v[slot] = Head::kFlagged ? X1[c * v.o_c] : A(0);
        }
        __syncthreads();
        if (cnt > 0) {  // block-uniform
          for (int64_t k = t; k < v.n_c; k += kThreads) {
            if (!valid(k)) continue;
            const A sk = load(v.srow[k * v.s_c]);
            const A f = v.prow[k * v.p_c] != 0 ? A(1) : A(0);
            A acc = 0;
            // pair loop: engine v1 gradient row
            for (int r = 0; r < cnt; ++r) acc += logistic_deriv((sk - st_s[r]) * inv_tau) * (st_u[r] + st_v[r] * f);
            v.G[k * v.o_c] += acc;
          }
        }
        __syncthreads();  // the staging arrays are rewritten by the next chunk
      }
      for (int64_t k = t; k < v.n_c; k += kThreads) {
        if (!valid(k)) continue;
        const A own = positive(k) && np > A(0) ? X2[k * v.o_c] : A(0);
        v.G[k * v.o_c] = (v.G[k * v.o_c] - own) * inv_tau + poison(load(v.srow[k * v.s_c]));
      }
    }
    __syncthreads();  // the next query reuses the shared arrays
  }
}

// Version 2 of the forward (the default; the params' version = 1 selects
// subset_forward_kernel above): a warp a query, kWarps queries a block, and no block barrier at
// all. The same four phases as version 1, each over the warp's own query: its 32 lanes walk
// the list (lane-strided, coalesced), the sums are butterfly warp sums (every lane gets the
// same value, in a fixed order), the head's totals sit in the warp's own slice of shared
// memory, and the gradient row stages the positives 32 at a time (one ballot gives their
// order) in the warp's slice, so a warp waits only for its own lanes (__syncwarp). Version 1's
// block a query idled seven warps while one ranked a lone positive, and stopped all eight at a
// dozen block barriers a query (the H100 profile: barrier stalls, 58 % of issue slots busy).
// Same workspace, partials and transposed t2i lists as version 1.
template <typename T, class Head>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(3, 2))
subset_forward_warps(const T* __restrict__ sim, int64_t ss0, int64_t ss1, const uint8_t* __restrict__ pos,
                     int64_t ps0, int64_t ps1, const uint8_t* __restrict__ mask, int64_t ms0, int64_t ms1, int64_t n,
                     int64_t m, int direction, int64_t n_i2t, int64_t n_total, acc_t<T> inv_tau, Head head,
                     int with_grad, acc_t<T>* __restrict__ ws, acc_t<T>* __restrict__ partials,
                     acc_t<T>* __restrict__ loss_none) {
  using A = acc_t<T>;
  __shared__ A st_s[kWarps][32], st_u[kWarps][32], st_v[kWarps][32];  // phase 3: a warp's staged positives
  __shared__ A totals_all[kWarps][Head::kStats];                        // phase 2: a warp's statistics
  const SmoothRankLayout L = smooth_rank_layout(n, m, direction);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  A* totals = totals_all[warp];
  const int64_t nm = n * m;
  for (int64_t qg = int64_t(blockIdx.x) * kWarps + warp; qg < n_total; qg += int64_t(gridDim.x) * kWarps) {
    const SubsetQuery<T> v =
        subset_query(qg, n_i2t, n, m, direction, sim, ss0, ss1, pos, ps0, ps1, mask, ms0, ms1, L, ws, partials);
    // the query's slots of the four partials, X[x * nm + c * o_c]: A then u, B then v, S1 then
    // T = u S1 + v S2, S2 (one base pointer: fewer registers live than four)
    A* X = partials + v.slab * 4 * nm + v.q * v.o_q;
    auto valid = [&](int64_t c) { return v.mrow == nullptr || v.mrow[c * v.m_c] != 0; };
    auto positive = [&](int64_t c) { return c < v.n_c && valid(c) && v.prow[c * v.p_c] != 0; };

    // ---- phase 0: the poison of the list, its positives, G = 0
    A p_sum = 0, np_sum = 0;
    for (int64_t c = lane; c < v.n_c; c += 32) {
      if (valid(c)) p_sum += poison(load(v.srow[c * v.s_c]));
      np_sum += positive(c) ? A(1) : A(0);
      if (with_grad) v.G[c * v.o_c] = A(0);
    }
    const A pois = warp_sum(p_sum);
    const A np = warp_sum(np_sum);

    // ---- phase 1: each positive ranked over the whole list by the warp's lanes
    for (int64_t c0 = 0; c0 < v.n_c; c0 += 32) {
      const unsigned found = __ballot_sync(0xffffffffu, positive(c0 + lane));
      for (unsigned bal = found; bal != 0; bal &= bal - 1) {  // warp-uniform: the chunk's positives in order
        const int64_t j = c0 + __ffs(static_cast<int>(bal)) - 1;
        const RankSums<A> r = rank_positive<Head>(v.srow, v.prow, v.mrow, v, load(v.srow[j * v.s_c]), inv_tau, lane);
        if (lane == 0) {
          X[j * v.o_c] = r.a + A(0.5);  // 1 + (sum - sigma(0))
          X[1 * nm + j * v.o_c] = r.b + A(0.5);
          X[2 * nm + j * v.o_c] = r.s1;
          X[3 * nm + j * v.o_c] = r.s2;
        }
      }
    }
    __syncwarp();  // lane 0's partials are read by every lane below

    // ---- phase 2: the head's statistics, the loss, the coefficients
    for (int i = 0; i < head.n_stats(); ++i) {
      A s = 0;
      for (int64_t c = lane; c < v.n_c; c += 32) {
        if (positive(c)) s += head.stat(i, X[c * v.o_c], X[1 * nm + c * v.o_c]);
      }
      s = warp_sum(s);
      if (lane == 0) totals[i] = s;
    }
    __syncwarp();  // the totals are visible to the warp
    const A qloss = (np > A(0) ? head.loss(totals, np) : A(0)) + pois;
    if (with_grad && np > A(0)) {
      for (int64_t c = lane; c < v.n_c; c += 32) {
        if (!positive(c)) continue;
        A u, w;
        head.coef(X[c * v.o_c], X[1 * nm + c * v.o_c], totals, np, &u, &w);
        X[2 * nm + c * v.o_c] = u * X[2 * nm + c * v.o_c] + w * X[3 * nm + c * v.o_c];
        X[c * v.o_c] = u;
        X[1 * nm + c * v.o_c] = w;
      }
    }
    if (lane == 0) {
      ws[L.qloss + qg] = qloss;
      ws[L.idcg + qg] = np > A(0) ? A(1) : A(0);  // aux: the query counts in "mean"
      if (loss_none != nullptr) loss_none[qg] = qloss;
    }

    // ---- phase 3: the gradient row, the positives staged 32 at a time
    if (with_grad) {
      __syncwarp();  // the coefficients of phase 2 are visible to the warp
      for (int64_t c0 = 0; c0 < v.n_c; c0 += 32) {
        const int64_t c = c0 + lane;
        const bool p = positive(c);
        const unsigned bal = __ballot_sync(0xffffffffu, p);
        const int cnt = __popc(bal);
        if (p) {
          const int slot = __popc(bal & ((1u << lane) - 1u));
          st_s[warp][slot] = load(v.srow[c * v.s_c]);
          st_u[warp][slot] = X[c * v.o_c];
          st_v[warp][slot] = Head::kFlagged ? X[1 * nm + c * v.o_c] : A(0);
        }
        __syncwarp();
        if (cnt > 0) {  // warp-uniform
          for (int64_t k = lane; k < v.n_c; k += 32) {
            if (!valid(k)) continue;
            const A sk = load(v.srow[k * v.s_c]);
            const A f = v.prow[k * v.p_c] != 0 ? A(1) : A(0);
            A acc = 0;
            // pair loop: engine v2 gradient row
            for (int r = 0; r < cnt; ++r)
              acc += logistic_deriv((sk - st_s[warp][r]) * inv_tau) * (st_u[warp][r] + st_v[warp][r] * f);
            v.G[k * v.o_c] += acc;
          }
        }
        __syncwarp();  // the staging slice is rewritten by the next chunk
      }
      for (int64_t k = lane; k < v.n_c; k += 32) {
        if (!valid(k)) continue;
        const A own = positive(k) && np > A(0) ? X[2 * nm + k * v.o_c] : A(0);
        v.G[k * v.o_c] = (v.G[k * v.o_c] - own) * inv_tau + poison(load(v.srow[k * v.s_c]));
      }
    }
    __syncwarp();  // the next query reuses the warp's shared slices
  }
}

// The reduction (one block): per direction the count of the queries that count and, for
// mean / sum, the loss. Fixed summation order.
// The reduction of a smooth-rank forward, run by one block (subset_finalize, and smooth-NDCG's
// finalize_lists): per direction the count of the queries that count (flags[q]: 1 or 0) and,
// for mean / sum, the loss from the per-query losses in ws. Fixed summation order.
template <typename A>
__device__ __forceinline__ void reduce_queries(const SmoothRankLayout& L, int reduction, const A* flags, A* scratch,
                                               A* ws, A* out) {
  A total = 0;
  const int64_t off[2] = {0, L.nq1}, len[2] = {L.nq1, L.nq2};
  for (int d = 0; d < 2; ++d) {
    A sum = 0, cnt = 0;
    for (int64_t q = off[d] + threadIdx.x; q < off[d] + len[d]; q += blockDim.x) {
      sum += ws[L.qloss + q];
      cnt += flags[q];
    }
    add_direction(sum, cnt, reduction, scratch, ws + L.counts + d, total);
  }
  if (threadIdx.x == 0 && reduction != kNone) out[0] = total;
}

template <typename A>
__global__ void __launch_bounds__(kThreads)
subset_finalize(int64_t n, int64_t m, int direction, int reduction, A* __restrict__ ws, A* __restrict__ out) {
  __shared__ A scratch[kThreads];
  const SmoothRankLayout L = smooth_rank_layout(n, m, direction);
  reduce_queries(L, reduction, ws + L.idcg, scratch, ws, out);  // the flags: aux
}

// The backward, elementwise over 32 x 32 tiles of sim (grid-strided): grad = sum over
// directions of c_q * G_d, c_q = grad_out[q] (none) or grad_out[0] * (1 / count_d for mean);
// a zero coefficient still passes a non-finite G on. G_i2t is read in place; G_t2i, stored
// transposed, is staged through shared memory a tile at a time, read along its rows, so that
// both reads and the write of grad are coalesced. Masked entries have G = 0.
template <typename T>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(6, 4))
subset_backward_kernel(int64_t n, int64_t m, int direction, int reduction, const acc_t<T>* __restrict__ grad_out,
                       int64_t gs, const acc_t<T>* __restrict__ ws, T* __restrict__ grad) {
  using A = acc_t<T>;
  __shared__ A t_g[kTile][kTile + 1];  // a tile of G_t2i^T: [column j - j0][row i - i0]
  const SmoothRankLayout L = smooth_rank_layout(n, m, direction);
  auto scale = [&](int d) {
    const A count = ws[L.counts + d];
    return reduction == kMean ? (count > A(0) ? A(1) / count : A(0)) : A(1);
  };
  const A c_all1 = reduction == kNone ? A(0) : grad_out[0] * scale(0);  // the coefficient of mean / sum
  const A c_all2 = reduction == kNone ? A(0) : grad_out[0] * scale(1);
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t tiles_m = tiles_along(m), tiles = tiles_along(n) * tiles_m;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t i0 = (tile / tiles_m) * kTile, j0 = (tile % tiles_m) * kTile;
    if (L.d2) {
      for (int r = ty; r < kTile; r += kWarps) {  // row j0 + r of G_t2i^T, columns i0 + tx
        const int64_t j = j0 + r, i = i0 + tx;
        if (i < n && j < m) t_g[r][tx] = ws[L.a2 + j * n + i];
      }
      __syncthreads();
    }
    for (int r = ty; r < kTile; r += kWarps) {  // row i0 + r of grad, columns j0 + tx
      const int64_t i = i0 + r, j = j0 + tx;
      if (i >= n || j >= m) continue;
      A g = 0;
      if (L.d1) {
        const A c = reduction == kNone ? grad_out[i * gs] : c_all1;
        const A x = ws[L.a1 + i * m + j];
        g += c == A(0) ? poison(x) : c * x;
      }
      if (L.d2) {
        const A c = reduction == kNone ? grad_out[(L.nq1 + j) * gs] : c_all2;
        const A x = t_g[tx][r];
        g += c == A(0) ? poison(x) : c * x;
      }
      grad[i * m + j] = store<T>(g);
    }
    if (L.d2) __syncthreads();  // the next tile rewrites t_g
  }
}

// An unsigned integer of S bytes: the transpose copies elements as bits.
template <size_t S> struct UIntOf;
template <> struct UIntOf<8> { using type = uint64_t; };
template <> struct UIntOf<4> { using type = uint32_t; };
template <> struct UIntOf<2> { using type = uint16_t; };

// The launchers take the entry point's struct (smooth_ap.h); these kernels keep their own
// argument lists: taking the struct whole cost them registers (spills in the half-precision
// forward under its 64-register budget; docs/cuda-resources.md). P: SmoothApForward or
// RecallAtKForward (recall_at_k.h: the same fields and its ks).
template <typename T, class Head, class P>
int subset_forward(const Head& head, const P& p) {
  using A = acc_t<T>;
  const int64_t n = p.lists.n, m = p.lists.m;
  const int direction = p.lists.direction, reduction = p.lists.reduction;
  const int64_t n_i2t = (direction & kI2T) ? n : 0, n_t2i = (direction & kT2I) ? m : 0;
  const int64_t n_total = n_i2t + n_t2i;
  const cudaStream_t st = static_cast<cudaStream_t>(p.stream);
  A* w = static_cast<A*>(p.ws);
  A* part = static_cast<A*>(p.partials);
  if (n_t2i > 0) {  // the column lists, transposed into the scratch (smooth_ap.h)
    using B = typename UIntOf<sizeof(T)>::type;
    const int64_t t_off = smooth_rank_transposed_offset(n, m, direction);
    uint8_t* posT = reinterpret_cast<uint8_t*>(part + t_off + n * m);
    const int e = launch(subset_transpose_kernel<B>, strided_grid(tiles_along(n) * tiles_along(m)), kThreads, 0, st,
                         static_cast<const B*>(p.sim.data), p.sim.s0, p.sim.s1, p.pos.data, p.pos.s0, p.pos.s1,
                         p.mask.data, p.mask.s0, p.mask.s1, n, m, reinterpret_cast<B*>(part + t_off), posT,
                         posT + n * m);
    if (e != 0) return e;
  }
  // version 2 (a warp a query) unless the call asks for version 1 (a block a query)
  const bool v1 = p.version == 1;
  const int e = launch(v1 ? subset_forward_kernel<T, Head> : subset_forward_warps<T, Head>,
                       v1 ? strided_grid(n_total) : strided_grid((n_total + kWarps - 1) / kWarps), kThreads, 0, st,
                       static_cast<const T*>(p.sim.data), p.sim.s0, p.sim.s1, p.pos.data, p.pos.s0, p.pos.s1,
                       p.mask.data, p.mask.s0, p.mask.s1, n, m, direction, n_i2t, n_total,
                       static_cast<A>(1.0 / p.tau), head, int(p.with_grad), w, part,
                       reduction == kNone ? static_cast<A*>(p.out) : nullptr);
  if (e != 0) return e;
  return launch(subset_finalize<A>, 1, kThreads, 0, st, n, m, direction, reduction, w, static_cast<A*>(p.out));
}

template <typename T>
int subset_backward(const SmoothRankBackward& p) {
  using A = acc_t<T>;
  const int64_t n = p.lists.n, m = p.lists.m;
  return launch(subset_backward_kernel<T>, strided_grid(tiles_along(n) * tiles_along(m), 65536), kThreads, 0,
                static_cast<cudaStream_t>(p.stream), n, m, p.lists.direction, p.lists.reduction,
                static_cast<const A*>(p.grad_out.data), p.grad_out.s, static_cast<const A*>(p.ws),
                static_cast<T*>(p.grad));
}

}  // namespace rank
}  // namespace cuda
}  // namespace fastrank
