// The smooth-rank engine on the CPU: what smooth-NDCG, Smooth-AP and the Recall@k
// surrogate share (docs/spec.md §2.1, 2.8, 2.9). Each of them is a *head* over the same pieces:
//
//   1. a pair pass that gives every *row* item j of a query's list its smooth rank
//        R(j) = 1 + sum_{k in list, k != j} sigma((s_k - s_j) / tau)
//      (and, for Smooth-AP, its rank among the positives), with the pairs' sigma'
//      values kept for step 3 while they fit in kSigmaCacheBytes;
//   2. the head: the list's loss from the ranks, and the coefficient of each rank in
//      the loss's derivative;
//   3. the backward pair pass: each pair's sigma' times the coefficients, summed into the
//      query's row of G = d loss_q / d s, while the list is still in cache;
//   4. the backward proper, elementwise: grad = sum over directions of (the query's
//      upstream weight x a per-query factor) x G.
//
// Two pair passes, chosen by the head:
//  - all items are rows (smooth-NDCG): each unordered pair once, one exp serving both
//    ends (sigma(-x) = 1 - sigma(x)): smooth_ranks / rank_grad, O(C^2 / 2) exps;
//  - a subset of rows (the positives of Smooth-AP and Recall@k): rows x all items,
//    subset_ranks / subset_grad, O(|P| C): linear in the candidates, so a query can rank
//    against a large candidate set (a batch plus a memory bank); the query loop of the
//    heads that use it alone (Smooth-AP, Recall@k) is subset_heads.h.
// Memory plan: per thread, O(C) scratch rows (the query's valid items gathered contiguous
// through any strides, the t2i queries being columns), padded to whole vectors of kLanes;
// per call, G (n, m) per direction in the workspace (params.h, SmoothRankLayout).
// Parallelism: OpenMP over the queries of a direction, one query per thread at a time,
// every sum in a fixed order: bit-identical results run to run; one thread below
// kParallelWork pairs.
#pragma once

#include <algorithm>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "fastrank/params.h"

namespace fastrank {
namespace cpu {
namespace rank {
// internal linkage: each kernel file holds its own copy, so GCC inlines the pair passes into
// the head's per-query function
namespace {

// The pair loops run over whole vectors: rows are padded to a multiple of kLanes with
// finite zeros and each inner loop starts at the vector boundary below k = j + 1. Only
// the first vector (pairs with k <= j) and the last (k >= n) need a 0/1 factor; the
// vectors between run unmasked. Without this, the scalar remainder of the triangular
// loop dominates at n ~ 100 (2-3x slower at 128), and a mask on every vector costs
// integer compares of the index in every lane.
constexpr int64_t kLanes = 16;
constexpr int64_t kParallelWork = int64_t(1) << 18;  // below: one thread (no fork/join)
constexpr int64_t kSigmaCacheBytes = int64_t(4) << 20;  // per thread: lists up to ~1000 items (float)
constexpr int64_t kCountRanksMax = 512;  // IDCG: rank counting up to here, std::sort above
inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }
inline int64_t aligned_start(int64_t k) { return k / kLanes * kLanes; }

// The three ranges of the inner loop over k for row j of n items (see above):
// head [k0, k1) masked (k > j, k < n), bulk [k1, k2) unmasked, tail [k2, pad) masked (k < n).
struct Ranges {
  int64_t k0, k1, k2, pad;
};
inline Ranges ranges_of(int64_t j, int64_t n) {
  Ranges r;
  r.pad = padded(n);
  r.k0 = aligned_start(j + 1);
  r.k1 = std::min(r.k0 + kLanes, r.pad);
  r.k2 = std::max(r.k1, aligned_start(n));
  return r;
}

// Length of row j's stored sigma' values: [aligned_start(j + 1), padded(n)).
inline int64_t tri_row(int64_t j, int64_t n) { return padded(n) - aligned_start(j + 1); }
inline int64_t tri_size(int64_t n) {
  int64_t t = 0;
  for (int64_t j = 0; j < n; ++j) t += tri_row(j, n);
  return t;
}

// One direction's (queries, candidates) view of the (n, m) inputs: i2t = rows, t2i =
// columns (swapped strides). a and grad use the contiguous (n, m) layout of both.
struct View {
  int64_t nq, nc;
  int64_t sq, sc, rq, rc, mq, mc;  // sim, rel, mask strides
  int64_t aq, ac;                  // a / grad strides
};

inline View view_of(bool t2i, int64_t n, int64_t m, int64_t ss0, int64_t ss1, int64_t rs0, int64_t rs1,
             int64_t ms0, int64_t ms1) {
  if (!t2i) return View{n, m, ss0, ss1, rs0, rs1, ms0, ms1, m, 1};
  return View{m, n, ss1, ss0, rs1, rs0, ms1, ms0, 1, m};
}

// A forward's call, unpacked once for every head: the (n, m) lists, the workspace layout,
// each direction's view of (sim, labels, mask) with labels relevance or positives, 1 / tau,
// the longest list, the pair work (C^2 per query, for the threading decision), the output
// and the workspace with G's rows of each direction in it.
template <typename T> struct ForwardCall {
  int64_t n, m;
  SmoothRankLayout L;
  View v[2];
  T inv_tau;
  int64_t c_max, work;
  T* out;
  T* ws;
  T* G[2];
};

template <typename T, typename Labels>
ForwardCall<T> forward_call(const Lists& lists, const MatIn& sim, const Labels& labels, const MaskIn& mask,
                            double tau, void* out, void* ws) {
  ForwardCall<T> c;
  c.n = lists.n;
  c.m = lists.m;
  c.L = smooth_rank_layout(c.n, c.m, lists.direction);
  for (int d = 0; d < 2; ++d)
    c.v[d] = view_of(d == 1, c.n, c.m, sim.s0, sim.s1, labels.s0, labels.s1, mask.s0, mask.s1);
  c.inv_tau = T(1) / static_cast<T>(tau);
  c.c_max = std::max(c.L.d1 ? c.m : 0, c.L.d2 ? c.n : 0);
  c.work = (c.L.d1 ? c.n * c.m * c.m : 0) + (c.L.d2 ? c.m * c.n * c.n : 0);
  c.out = static_cast<T*>(out);
  c.ws = static_cast<T*>(ws);
  c.G[0] = c.ws + c.L.a1;
  c.G[1] = c.ws + c.L.a2;
  return c;
}

// A thread's scratch rows for the all-items pass (sized for the longest list of the call).
template <typename T> struct Scratch {
  std::vector<T> s, y, p, g, a;
  std::vector<int64_t> idx;
  std::vector<T> d;  // sigma' of the rank pass, kept for the gradient pass (empty: recompute)
  explicit Scratch(int64_t c) : s(padded(c)), y(padded(c)), p(padded(c)), g(padded(c)), a(padded(c)), idx(c) {}
  // The sigma' cache for a list of nv items, made on first use (a call whose lists all take
  // the sparse path never makes it); null where it would not fit kSigmaCacheBytes.
  T* sigma_cache(int64_t nv) {
    const int64_t need = tri_size(nv);
    if (need * int64_t(sizeof(T)) > kSigmaCacheBytes) return nullptr;
    if (d.size() < size_t(need)) d.resize(need);
    return d.data();
  }
};

// Gathers the valid items of one query (x = sim, y = its labels: relevance, or 0/1 positive
// flags read from bytes) into contiguous rows of T; returns their count. With a mask,
// idx[j] = the candidate index of item j.
template <typename T, typename Y>
int64_t gather_valid(const T* x, int64_t xc, const Y* y, int64_t yc, const uint8_t* mrow, int64_t mc,
                     int64_t nc, T* xs, T* ys, int64_t* idx) {
  if (mrow == nullptr) {
    gather_row(x, xc, nc, xs);
    if constexpr (std::is_same<T, Y>::value) {
      gather_row(y, yc, nc, ys);
    } else {
      for (int64_t c = 0; c < nc; ++c) ys[c] = y[c * yc] != 0 ? T(1) : T(0);
    }
    return nc;
  }
  int64_t nv = 0;
  for (int64_t c = 0; c < nc; ++c) {
    if (mrow[c * mc]) {
      idx[nv] = c;
      xs[nv] = x[c * xc];
      if constexpr (std::is_same<T, Y>::value) ys[nv] = y[c * yc];
      else ys[nv] = y[c * yc] != 0 ? T(1) : T(0);
      ++nv;
    }
  }
  return nv;
}

// Calls block(masked, k0, off) for the kLanes-wide blocks of a row (Ranges): the masked
// head vector, the unmasked bulk, the masked tail vector. masked is std::true_type or
// std::false_type (a compile-time flag); off is the block's offset into the row's stored
// sigma' values (tri_row of them, from r.k0).
template <typename F>
inline void for_row_blocks(const Ranges& r, F&& block) {
  int64_t off = 0;
  if (r.k0 < r.k1) {
    block(std::true_type{}, r.k0, off);
    off += kLanes;
  }
  for (int64_t k = r.k1; k < r.k2; k += kLanes, off += kLanes) block(std::false_type{}, k, off);
  if (r.k2 < r.pad) block(std::true_type{}, r.k2, off);
}

// The sum of a row's per-lane partial sums, in a fixed order.
template <typename T>
inline T lane_sum(const T* acc) {
  T t = 0;
  for (int64_t l = 0; l < kLanes; ++l) t += acc[l];
  return t;
}

// Eq. 16 over the kLanes items k0 .. k0 + kLanes - 1: adds sigma((s_k - s_j) / tau) to
// lane k - k0 of acc (-> p_j) and sigma((s_j - s_k) / tau) to p_k: one exp per pair.
// kMasked: only pairs with j < k < n. kStore: also d[k - k0] = sigma'((s_k - s_j) / tau),
// for the gradient pass. A fixed trip count: one straight vector body, no remainder loop.
template <bool kMasked, bool kStore, typename T>
inline void rank_block(const T* __restrict s, T sj, T inv_tau, T* __restrict p, T* __restrict d,
                       T* __restrict acc, int64_t k0, int64_t j, int64_t n) {
#pragma omp simd
  for (int64_t l = 0; l < kLanes; ++l) {
    const int64_t k = k0 + l;
    const T x = (s[k] - sj) * inv_tau;
    const T e = exp_nonpos(x >= T(0) ? -x : x);  // one exp: sigma(|x|) = a, sigma(-|x|) = e * a
    const T a = T(1) / (T(1) + e);
    const T b = e * a;
    T pos = x >= T(0) ? a : b, neg = x >= T(0) ? b : a;
    if constexpr (kMasked) {
      const T keep = static_cast<T>((k > j) & (k < n));
      pos *= keep;
      neg *= keep;
    }
    acc[l] += pos;
    p[k] += neg;
    if constexpr (kStore) d[l] = a * b;
  }
}

// Row j of the rank pass: the masked head vector, the unmasked bulk, the masked tail
// vector (Ranges); returns sum_{k > j} sigma((s_k - s_j) / tau). With kStore, row j's
// sigma' values go to d[0 .. r.pad - r.k0).
template <bool kStore, typename T>
inline T rank_row(const T* __restrict s, T sj, T inv_tau, T* __restrict p, T* __restrict d, const Ranges& r,
                  int64_t j, int64_t n) {
  alignas(64) T acc[kLanes] = {};
  for_row_blocks(r, [&](auto masked, int64_t k0, int64_t off) {
    rank_block<decltype(masked)::value, kStore>(s, sj, inv_tau, p, kStore ? d + off : d, acc, k0, j, n);
  });
  return lane_sum(acc);
}

// p_j = 1 + sum_{k != j} sigma((s_k - s_j) / tau) over the nv items of s (s padded with
// finite values up to padded(nv)); pairs (j, k > j) once. With d != null, the pairs'
// sigma' values are kept, row after row (tri_row(j, nv) values for row j).
template <typename T>
void smooth_ranks(const T* __restrict s, int64_t nv, T inv_tau, T* __restrict p, T* __restrict d) {
  std::fill(p, p + padded(nv), T(1));
  for (int64_t j = 0; j < nv; ++j) {
    const Ranges r = ranges_of(j, nv);
    if (d != nullptr) {
      p[j] += rank_row<true>(s, s[j], inv_tau, p, d, r, j, nv);
      d += r.pad - r.k0;
    } else {
      p[j] += rank_row<false>(s, s[j], inv_tau, p, d, r, j, nv);
    }
  }
}

// Over the kLanes items k0 .. k0 + kLanes - 1: t = sigma'((s_k - s_m) / tau) (a_k - a_m)
// added to lane k - k0 of acc (-> g_m) and subtracted from g_k. kMasked: only pairs with
// m < k < n. kCached: sigma' is read from d[k - k0] (stored by smooth_ranks) instead of
// computed.
template <bool kMasked, bool kCached, typename T>
inline void grad_block(const T* __restrict s, const T* __restrict d, const T* __restrict a, T sm, T am,
                       T inv_tau, T* __restrict g, T* __restrict acc, int64_t k0, int64_t m, int64_t n) {
#pragma omp simd
  for (int64_t l = 0; l < kLanes; ++l) {
    const int64_t k = k0 + l;
    T sd;
    if constexpr (kCached) sd = d[l];
    else sd = logistic_deriv((s[k] - sm) * inv_tau);
    T t = sd * (a[k] - am);
    if constexpr (kMasked) t *= static_cast<T>((k > m) & (k < n));
    acc[l] += t;
    g[k] -= t;
  }
}

// Row m of the gradient pass (head, bulk, tail as in rank_row); returns
// sum_{k > m} sigma'((s_k - s_m) / tau) (a_k - a_m). With kCached, row m's sigma' values
// are read from d[0 .. r.pad - r.k0).
template <bool kCached, typename T>
inline T grad_row(const T* __restrict s, const T* __restrict d, const T* __restrict a, T inv_tau,
                  T* __restrict g, const Ranges& r, int64_t m, int64_t n) {
  alignas(64) T acc[kLanes] = {};
  const T sm = s[m], am = a[m];
  for_row_blocks(r, [&](auto masked, int64_t k0, int64_t off) {
    grad_block<decltype(masked)::value, kCached>(s, kCached ? d + off : d, a, sm, am, inv_tau, g, acc, k0, m, n);
  });
  return lane_sum(acc);
}

// g_m = sum_{k != m} sigma'((s_k - s_m) / tau) (a_k - a_m); pairs (m, k > m) once
// (s and a padded with finite values up to padded(nv)); sigma' from d when not null.
template <typename T>
void rank_grad(const T* __restrict s, const T* __restrict d, const T* __restrict a, int64_t nv, T inv_tau,
               T* __restrict g) {
  std::fill(g, g + padded(nv), T(0));
  for (int64_t m = 0; m < nv; ++m) {
    const Ranges r = ranges_of(m, nv);
    if (d != nullptr) {
      g[m] += grad_row<true>(s, d, a, inv_tau, g, r, m, nv);
      d += r.pad - r.k0;
    } else {
      g[m] += grad_row<false>(s, d, a, inv_tau, g, r, m, nv);
    }
  }
}


// ---- the subset pass: rows x all items -------------------------------------------------------
// Sums over all nv items (s padded with -inf and f with 0 up to padded(nv): a padding lane
// adds exactly 0) for row item j: sum sigma(x), sum f sigma(x), sum sigma'(x), sum f sigma'(x),
// x = (s_k - s_j) / tau, self included (sigma(0) = 1/2 and sigma'(0) = 1/4 exactly: the callers
// take the self terms out, or let them cancel), or, kSelfOut, the self lane (k = jself) left out
// of every sum and of d: a head whose rows' own gradient entries can be small next to their
// coefficient (smooth-NDCG's sparse path) then never adds and subtracts the 1/4 (float32
// would keep eps / 4 of it). kFlagged: also the f-weighted sums. kStore: d[k] = sigma'(x) for
// the gradient pass.
template <bool kFlagged, bool kStore, bool kSelfOut, typename T>
inline void subset_row(const T* __restrict s, const T* __restrict f, T sj, int64_t jself, T inv_tau, int64_t pad,
                       T* __restrict d, T* sums) {
  T a = 0, b = 0, c = 0, e2 = 0;
#pragma omp simd reduction(+ : a, b, c, e2)
  for (int64_t k = 0; k < pad; ++k) {
    const T x = (s[k] - sj) * inv_tau;
    const T e = exp_nonpos(x >= T(0) ? -x : x);
    const T av = T(1) / (T(1) + e);
    const T bv = e * av;
    T pos = x >= T(0) ? av : bv;
    T der = av * bv;
    if constexpr (kSelfOut) {
      const bool self = k == jself;
      pos = self ? T(0) : pos;
      der = self ? T(0) : der;
    }
    a += pos;
    c += der;
    if constexpr (kFlagged) {
      b += pos * f[k];
      e2 += der * f[k];
    }
    if constexpr (kStore) d[k] = der;
  }
  sums[0] = a;
  sums[1] = b;
  sums[2] = c;
  sums[3] = e2;
}

// For the rows r (items rows[r]): A_r = 1 + sum_{k != j} sigma(x_jk) and, kFlagged,
// B_r = 1 + sum_{k != j} f_k sigma(x_jk) (j is flagged itself: a positive), and
// S1_r = sum_k sigma'(x_jk), S2_r = sum_k f_k sigma'(x_jk), self-inclusive (kSelfOut: k != j).
// With d (np x padded(nv)), row r's sigma' values go to d + r * padded(nv) (kSelfOut: 0 at j).
template <bool kFlagged, bool kSelfOut = false, typename T>
void subset_ranks(const T* s, const T* f, int64_t nv, const int64_t* rows, int64_t np, T inv_tau, T* A, T* B,
                  T* S1, T* S2, T* d) {
  const int64_t pad = padded(nv);
  for (int64_t r = 0; r < np; ++r) {
    T sums[4];
    const int64_t j = rows[r];
    const T sj = s[j];
    if (d != nullptr) subset_row<kFlagged, true, kSelfOut>(s, f, sj, j, inv_tau, pad, d + r * pad, sums);
    else subset_row<kFlagged, false, kSelfOut>(s, f, sj, j, inv_tau, pad, d, sums);
    A[r] = sums[0] + (kSelfOut ? T(1) : T(0.5));  // 1 + (sum - sigma(0)) when self-inclusive
    S1[r] = sums[2];
    if constexpr (kFlagged) {  // B and S2 may be null otherwise
      B[r] = sums[1] + (kSelfOut ? T(1) : T(0.5));
      S2[r] = sums[3];
    }
  }
}

// g_k = sum_r sigma'(x_{j_r k}) (u_r + v_r f_k) - [k = j_r] (u_r S1_r + v_r S2_r): the
// derivative of sum_r (u_r A_r + v_r B_r) by s_k, times tau (the self pairs of the two
// parts cancel; kSelfOut: there are none, as in subset_ranks). g has padded(nv) entries;
// sigma' from d when not null.
template <bool kFlagged, bool kSelfOut = false, typename T>
void subset_grad(const T* __restrict s, const T* __restrict f, int64_t nv, const int64_t* rows, int64_t np,
                 T inv_tau, const T* u, const T* v, const T* S1, const T* S2, const T* d, T* __restrict g) {
  const int64_t pad = padded(nv);
  std::fill(g, g + pad, T(0));
  for (int64_t r = 0; r < np; ++r) {
    const T ur = u[r], vr = kFlagged ? v[r] : T(0), sj = s[rows[r]];
    const int64_t j = rows[r];
    if (d != nullptr) {  // two loops: a select inside one would compute the exp either way
      const T* __restrict dr = d + r * pad;
#pragma omp simd
      for (int64_t k = 0; k < pad; ++k) g[k] += dr[k] * (kFlagged ? ur + vr * f[k] : ur);
    } else {
#pragma omp simd
      for (int64_t k = 0; k < pad; ++k) {
        T der = logistic_deriv((s[k] - sj) * inv_tau);
        if constexpr (kSelfOut) der = k == j ? T(0) : der;
        g[k] += der * (kFlagged ? ur + vr * f[k] : ur);
      }
    }
  }
  for (int64_t r = 0; r < np; ++r) g[rows[r]] -= u[r] * S1[r] + (kFlagged ? v[r] * S2[r] : T(0));
}

// A thread's scratch for the subset heads (sized for the longest list of the call), with a
// tile of kTile queries for the column queries (t2i) of a row-major matrix: read and written
// kTile neighbouring values at a time (gather_rows), one cache line for kTile queries.
constexpr int64_t kTile = 16;
template <typename T> struct SubsetScratch {
  std::vector<T> s, f, g, A, B, S1, S2, u, v, d;
  std::vector<int64_t> idx, rows;
  std::vector<T> tile_s, tile_g;  // kTile rows of scores / gradient entries
  std::vector<uint8_t> tile_p;    // kTile rows of positive flags
  explicit SubsetScratch(int64_t c)
      : s(padded(c)), f(padded(c)), g(padded(c)), A(c), B(c), S1(c), S2(c), u(c), v(c), idx(c), rows(c) {}
};

// ---- the query loop and the reduction ---------------------------------------------------------
// Runs query(scratch, d, q, &counted) -> loss for the queries of the requested directions
// (d = 0: the n rows, d = 1: the m columns), in parallel, then the reduction into out and
// the per-direction counts into ws (SmoothRankLayout): "mean" = the sum over directions of
// the mean over the queries that count (0 if none), "sum", or the losses ("none").
template <typename T, typename MakeScratch, typename Query>
void run_queries(const SmoothRankLayout& L, int64_t n, int64_t m, int64_t work, int reduction, T* out, T* ws,
                 MakeScratch&& make_scratch, Query&& query, int64_t t2i_chunk = 1) {
  std::vector<int64_t> counted(L.q);
  T* qloss = ws + L.qloss;
#pragma omp parallel if (work >= kParallelWork)
  {
    auto w = make_scratch();
    if (L.d1) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t q = 0; q < n; ++q) qloss[q] = query(w, 0, q, &counted[q]);
    }
    if (L.d2) {  // t2i_chunk: a thread takes whole aligned tiles of column queries, in order
#pragma omp for schedule(dynamic, t2i_chunk)
      for (int64_t q = 0; q < m; ++q) qloss[L.nq1 + q] = query(w, 1, q, &counted[L.nq1 + q]);
    }
  }
  // in a fixed order: per direction the sum and the count of the queries that count
  T total = 0;
  const int64_t off[2] = {0, L.nq1}, len[2] = {L.nq1, L.nq2};
  for (int d = 0; d < 2; ++d) {
    T sum = 0;
    int64_t count = 0;
    for (int64_t q = off[d]; q < off[d] + len[d]; ++q) {
      sum += qloss[q];
      count += counted[q] > 0;
      if (reduction == kNone) out[q] = qloss[q];
    }
    ws[L.counts + d] = static_cast<T>(count);
    if (reduction == kMean) total += count > 0 ? sum / static_cast<T>(count) : T(0);
    if (reduction == kSum) total += sum;
  }
  if (reduction != kNone) out[0] = total;
}

// The backward, elementwise: grad[i, j] = c_i2t[i] * G_i2t[i, j] + c_t2i[j] * G_t2i[i, j],
// c = w * factor(d, qi) (w = d out / d query loss, factor: the head's per-query factor of
// G); a zero coefficient still passes a non-finite G on. Masked entries get exactly 0.
template <typename T, typename Factor>
void backward_elementwise(const SmoothRankLayout& L, const uint8_t* mask, int64_t ms0, int64_t ms1, int64_t n,
                          int64_t m, int reduction, const T* grad_out, int64_t gs, const T* ws, T* grad,
                          Factor&& factor) {
  T scale[2];
  for (int d = 0; d < 2; ++d) {
    const T count = ws[L.counts + d];
    scale[d] = reduction == kMean ? (count > T(0) ? T(1) / count : T(0)) : T(1);
  }
  auto coef = [&](int d, int64_t qi) {
    const T wq = reduction == kNone ? grad_out[qi * gs] : grad_out[0] * scale[d];
    return wq * factor(d, qi);
  };
  auto term = [](T c, T g) { return c == T(0) ? poison(g) : c * g; };
  std::vector<T> c2(L.d2 ? m : 0);
  for (int64_t j = 0; j < static_cast<int64_t>(c2.size()); ++j) c2[j] = coef(1, L.nq1 + j);
  const T* G1 = ws + L.a1;
  const T* G2 = ws + L.a2;
#pragma omp parallel for schedule(static) if (n * m >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T c1 = L.d1 ? coef(0, i) : T(0);
    T* out = grad + i * m;
    for (int64_t j = 0; j < m; ++j) {
      T v = 0;
      if (L.d1) v += term(c1, G1[i * m + j]);
      if (L.d2) v += term(c2[j], G2[i * m + j]);
      out[j] = (mask == nullptr || mask[i * ms0 + j * ms1]) ? v : T(0);
    }
  }
}

}  // namespace
}  // namespace rank
}  // namespace cpu
}  // namespace fastrank
