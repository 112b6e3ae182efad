// Fused Kendall ranking loss on the CPU (docs/spec.md §2.2, 2.1a; BCLS, Eq. 17).
//
// One call: every requested direction (i2t over the rows, t2i over the columns through
// the swapped strides) and the reduction. Per query:
//  1. gather: the query's valid entries (all, or those with mask = 1) are copied
//     contiguous: s, r and the column index (masked entries take part in no pair);
//     poison = sum of poison(s) + poison(r) (NaN iff some value read is NaN/inf: docs/spec.md §1). A
//     poisoned query skips the pair pass: its loss and gradient entries are NaN.
//  2. sort the entries by relevance, descending (stable LSD radix sort on order-preserving
//     integer keys, branch-free: ~3 us at 512 entries, against ~10 us for std::sort;
//     insertion sort up to 32 entries).
//     Then for j < k only "j above k" (r_j > r_k + a) can hold, and it holds for a
//     suffix k >= t_j; t_j is non-decreasing in j (two pointers, O(n)). The pair count is
//     sum_j (v - t_j), exact.
//  3. pair pass: for each j, the whole-vector loop over k in [t_j, v) adds
//     [s_k - s_j]+ to the loss and, where s_k > s_j, +1 to g[k] and -1 to g[j]: a
//     subtract, max, compare, two adds and a load/add/store of g[k] per pair, no
//     masking (the first vector block is peeled with an index mask; padding has
//     s = -inf, so it never counts). The gradient entries are small integers (exact in
//     float) until the division by max(1, cnt).
//  4. scatter g / max(1, cnt) (+ poison) to the query's row (or column) of dsim.
// Memory plan: O(n_c) scratch per thread (s, r, r + a, g, the index as float, the
// column index, radix keys), and for the t2i queries of a row-major sim a tile of 64 columns'
// s, r (a relevance matrix) and gradient (3 x 64 n_c values); outputs dsim (n_dir, n, m),
// aux, loss. Never (n, m, m).
// Parallelism: OpenMP over the queries of a direction when the work is large enough;
// each query is summed by one thread in a fixed order, the reduction runs serially in
// query order (double): bit-identical run to run.
// r + a is materialised in its own loop so the comparison r_j > (r_k + a) uses the same
// rounded value as the reference (the compiler cannot rewrite it as r_j - r_k > a).
#include "fastrank/kendall.h"

#include "column_tile.h"
#include "relevance_lists.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace fastrank {
namespace cpu {
namespace {

constexpr int64_t kPad = 16;  // a multiple of the float and double vector widths

template <typename T> struct KeyOf;
template <> struct KeyOf<float> { using type = uint32_t; };
template <> struct KeyOf<double> { using type = uint64_t; };

// Order-preserving key for descending order of x (finite x; -0 and +0 may differ but
// they compare equal, which is all the pair test needs).
template <typename T> inline typename KeyOf<T>::type desc_key(T x) {
  using K = typename KeyOf<T>::type;
  K b;
  std::memcpy(&b, &x, sizeof(T));
  constexpr K sign = K(1) << (8 * sizeof(K) - 1);
  const K asc = (b & sign) ? ~b : (b | sign);
  return ~asc;
}

// Stable LSD radix sort of (key, value) by key, 8-bit digits; digits that are equal in
// every key (e.g. the exponent bits of relevance in [0, 1]) cost one histogram only.
// Returns the number of scatter passes made: when odd, the result is in the *_tmp buffers.
template <typename K>
int radix_sort(K* key, int32_t* val, K* key_tmp, int32_t* val_tmp, int64_t n) {
  constexpr int kDigits = sizeof(K);
  int32_t hist[kDigits][256] = {};
  for (int64_t i = 0; i < n; ++i)
    for (int d = 0; d < kDigits; ++d) ++hist[d][(key[i] >> (8 * d)) & 255];
  int passes = 0;
  for (int d = 0; d < kDigits; ++d) {
    int32_t* h = hist[d];
    if (h[(key[0] >> (8 * d)) & 255] == n) continue;  // one value of this digit: order unchanged
    int32_t sum = 0;
    for (int b = 0; b < 256; ++b) { const int32_t c = h[b]; h[b] = sum; sum += c; }
    for (int64_t i = 0; i < n; ++i) {
      const int32_t p = h[(key[i] >> (8 * d)) & 255]++;
      key_tmp[p] = key[i];
      val_tmp[p] = val[i];
    }
    std::swap(key, key_tmp);
    std::swap(val, val_tmp);
    ++passes;
  }
  return passes;
}

// Per-thread scratch: three allocations (not one per array: at N = 4 the mallocs were
// a visible part of the call).
template <typename T> struct Scratch {
  using K = typename KeyOf<T>::type;
  std::vector<T> t_buf;
  std::vector<int32_t> i_buf;
  std::vector<K> k_buf;
  T *s0, *r0, *s, *r, *ra, *g, *kf, *rel_row;
  int32_t *c0, *c, *c_tmp;
  K *key, *key_tmp;
  // rel_row: a query's relevance row built from lists (relevance_lists.h), when given
  Scratch(int64_t n_pad, bool lists) : t_buf((lists ? 8 : 7) * n_pad), i_buf(3 * n_pad), k_buf(2 * n_pad) {
    T* t = t_buf.data();
    s0 = t; r0 = t + n_pad; s = t + 2 * n_pad; r = t + 3 * n_pad; ra = t + 4 * n_pad; g = t + 5 * n_pad;
    kf = t + 6 * n_pad;
    rel_row = lists ? t + 7 * n_pad : nullptr;
    c0 = i_buf.data(); c = c0 + n_pad; c_tmp = c0 + 2 * n_pad;
    key = k_buf.data(); key_tmp = key + n_pad;
    for (int64_t k = 0; k < n_pad; ++k) kf[k] = static_cast<T>(k);
  }
};

// Loss of one query (returned) and its gradient row, scattered to out[c * out_s] for the
// v gathered entries (the caller zeroed the row when some entries are masked).
template <typename T>
T one_query(Scratch<T>& w, int64_t v, T alpha, T* out, int64_t out_s) {
  const T inf = std::numeric_limits<T>::infinity();
  T* __restrict s0 = w.s0;
  T* __restrict r0 = w.r0;
  // 1. poison of every value read
  T poison = 0;
#pragma omp simd reduction(+ : poison)
  for (int64_t k = 0; k < v; ++k) poison += fastrank::poison(s0[k]) + fastrank::poison(r0[k]);
  if (poison != T(0) || v == 0) {  // NaN/inf in the query (or an empty list: loss 0)
    for (int64_t k = 0; k < v; ++k) out[w.c0[k] * out_s] = poison;
    return poison;
  }
  // 2. sort by relevance, descending (stable: ties keep the index order)
  auto* key = w.key;
  int32_t* idx = w.c;
  int32_t* idx_tmp = w.c_tmp;
  for (int64_t k = 0; k < v; ++k) {
    key[k] = desc_key(r0[k]);
    idx[k] = static_cast<int32_t>(k);
  }
  int passes = 0;
  if (v <= 32) {  // short lists: stable insertion sort (the radix histograms cost more)
    for (int64_t a = 1; a < v; ++a) {
      const auto ka = key[a];
      const int32_t ia = idx[a];
      int64_t b = a;
      for (; b > 0 && key[b - 1] > ka; --b) { key[b] = key[b - 1]; idx[b] = idx[b - 1]; }
      key[b] = ka;
      idx[b] = ia;
    }
  } else {
    passes = radix_sort(key, idx, w.key_tmp, idx_tmp, v);
  }
  const int32_t* order = (passes & 1) ? idx_tmp : idx;
  int32_t* __restrict col = (passes & 1) ? idx : idx_tmp;  // the free buffer
  const int64_t v_pad = (v + kPad - 1) / kPad * kPad;
  T* __restrict s = w.s;
  T* __restrict r = w.r;
  T* __restrict ra = w.ra;
  T* __restrict g = w.g;
  const T* __restrict kf = w.kf;
  for (int64_t k = 0; k < v; ++k) {
    const int32_t o = order[k];
    s[k] = s0[o];
    r[k] = r0[o];
    col[k] = w.c0[o];
  }
  for (int64_t k = 0; k < v; ++k) ra[k] = r[k] + alpha;
  for (int64_t k = v; k < v_pad; ++k) { s[k] = -inf; r[k] = -inf; ra[k] = inf; }
  std::fill(g, g + v_pad, T(0));
  // 3. pairs (j, k > j) with r_j > r_k + a: k in [t_j, v)
  double total = 0;
  int64_t cnt = 0;
  int64_t t = 0;
  for (int64_t j = 0; j < v; ++j) {
    const T rj = r[j], sj = s[j];
    if (t < j + 1) t = j + 1;
    while (t < v && !(rj > ra[t])) ++t;
    if (t >= v) break;  // t_j is non-decreasing: no later j has an active pair either
    cnt += v - t;
    const int64_t k0 = t / kPad * kPad;
    const T tf = kf[t];
    T l_acc = 0, g_acc = 0;
#pragma omp simd reduction(+ : l_acc, g_acc)
    for (int64_t k = k0; k < k0 + kPad; ++k) {  // first block: lanes k < t_j masked out
      const T x = s[k] - sj;
      const bool on = (kf[k] >= tf) & (x > T(0));
      const T act = on ? T(1) : T(0);
      l_acc += on ? x : T(0);
      g_acc += act;
      g[k] += act;
    }
#pragma omp simd reduction(+ : l_acc, g_acc)
    for (int64_t k = k0 + kPad; k < v_pad; ++k) {  // whole vectors, no mask
      const T x = s[k] - sj;
      const T act = x > T(0) ? T(1) : T(0);
      l_acc += std::max(x, T(0));
      g_acc += act;
      g[k] += act;
    }
    g[j] -= g_acc;
    total += static_cast<double>(l_acc);
  }
  // 4. scatter the gradient row
  const T denom = static_cast<T>(std::max<int64_t>(cnt, 1));
  for (int64_t k = 0; k < v; ++k) out[col[k] * out_s] = g[k] / denom;
  return static_cast<T>(total) / denom;
}

// The column queries (t2i) of a row-major sim without a mask go kColumnTile (column_tile.h) at
// a time: the tile's columns of sim (and of a relevance matrix) are gathered together
// (gather_rows: whole lines of each row for the tile, where a column alone reads a line per
// value), its queries' gradient rows written to a tile buffer and transposed into dsim after the
// last (a row segment per candidate), as smooth_ndcg.cpp's column queries are.

// One direction: n_q queries of n_c candidates; dsim slab written at out + q * o_q + c * o_c.
template <typename T>
void direction_pass(const T* sim, int64_t s_q, int64_t s_c, const T* rel, int64_t r_q, int64_t r_c,
                    const ListsIn& lists, const uint8_t* mask, int64_t m_q, int64_t m_c, int64_t n_q, int64_t n_c,
                    T alpha, T* out, int64_t o_q, int64_t o_c, T* qloss, T* qvalid) {
  const int64_t n_pad = (n_c + kPad - 1) / kPad * kPad;
  // below ~50 us of work a parallel region costs more than it saves (and on a busy
  // machine it can wait a whole time slice for its second thread)
  const bool parallel = n_q > 1 && n_q * n_pad * n_pad / 2 >= (int64_t(1) << 18);
  const bool listed = lists.offsets != nullptr;
  const bool tiles = mask == nullptr && s_q == 1 && s_c != 1 && o_q == 1 && (listed || r_q == 1);
  auto query = [&](Scratch<T>& w, int64_t q) {
      const T* srow = sim + q * s_q;
      const RowView<T> rv = relevance_row(lists, rel, r_q, r_c, q, n_c, w.rel_row);
      const T* rrow = rv.row;
      const int64_t rc = rv.stride;
      T* orow = out + q * o_q;
      int64_t v = 0;
      if (mask == nullptr) {
        gather_row(srow, s_c, n_c, w.s0);
        gather_row(rrow, rc, n_c, w.r0);
        for (int64_t c = 0; c < n_c; ++c) w.c0[c] = static_cast<int32_t>(c);
        v = n_c;
      } else {
        const uint8_t* mrow = mask + q * m_q;
        for (int64_t c = 0; c < n_c; ++c) {
          if (mrow[c * m_c]) {
            w.s0[v] = srow[c * s_c];
            w.r0[v] = rrow[c * rc];
            w.c0[v] = static_cast<int32_t>(c);
            ++v;
          }
        }
        if (v < n_c)
          for (int64_t c = 0; c < n_c; ++c) orow[c * o_c] = T(0);
      }
      qloss[q] = one_query(w, v, alpha, orow, o_c);
      qvalid[q] = v > 0 ? T(1) : T(0);
  };
  // one tile of column queries q0 .. q0 + nt - 1 (tiles above), every candidate in each list
  // (w.c0 = 0 .. n_c - 1, set once a thread: one_query reads it, never writes it)
  auto tile = [&](Scratch<T>& w, std::vector<T>& ts, std::vector<T>& tr, std::vector<T>& tg, int64_t q0) {
      const int64_t nt = std::min(kColumnTile, n_q - q0);
      gather_rows(sim, s_q, s_c, q0, nt, n_c, ts.data());
      if (!listed) gather_rows(rel, r_q, r_c, q0, nt, n_c, tr.data());
      for (int64_t t = 0; t < nt; ++t) {
        const int64_t q = q0 + t;
        std::copy(ts.data() + t * n_c, ts.data() + (t + 1) * n_c, w.s0);
        const T* rrow = listed ? relevance_row(lists, rel, r_q, r_c, q, n_c, w.rel_row).row : tr.data() + t * n_c;
        std::copy(rrow, rrow + n_c, w.r0);
        qloss[q] = one_query(w, n_c, alpha, tg.data() + t * n_c, int64_t(1));
        qvalid[q] = n_c > 0 ? T(1) : T(0);
      }
      transpose_block(tg.data(), n_c, out + q0, o_c, n_c, nt);
  };
  if (tiles) {
    const int64_t n_tiles = (n_q + kColumnTile - 1) / kColumnTile;
    const size_t tile_size = static_cast<size_t>(std::min(kColumnTile, n_q) * n_c);
    auto tiles_of_a_thread = [&](bool shared) {
      Scratch<T> w(n_pad, listed);
      for (int64_t c = 0; c < n_c; ++c) w.c0[c] = static_cast<int32_t>(c);
      std::vector<T> ts(tile_size), tr(listed ? 0 : tile_size), tg(tile_size);
      if (!shared) {
        for (int64_t i = 0; i < n_tiles; ++i) tile(w, ts, tr, tg, i * kColumnTile);
        return;
      }
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n_tiles; ++i) tile(w, ts, tr, tg, i * kColumnTile);
    };
    if (!parallel) {  // as below: no OpenMP region for small problems
      tiles_of_a_thread(false);
      return;
    }
#pragma omp parallel
    tiles_of_a_thread(true);
    return;
  }
  if (!parallel) {  // no OpenMP region at all for small problems (its entry costs ~1 us)
    Scratch<T> w(n_pad, listed);
    for (int64_t q = 0; q < n_q; ++q) query(w, q);
    return;
  }
#pragma omp parallel
  {
    Scratch<T> w(n_pad, listed);
#pragma omp for schedule(static)
    for (int64_t q = 0; q < n_q; ++q) query(w, q);
  }
}

template <typename T>
void forward_impl(const KendallForward& p) {
  const T* sim = static_cast<const T*>(p.sim.data);
  const T* rel = static_cast<const T*>(p.rel.data);
  const uint8_t* mask = p.mask.data;
  const int64_t s0 = p.sim.s0, s1 = p.sim.s1, r0 = p.rel.s0, r1 = p.rel.s1, m0 = p.mask.s0, m1 = p.mask.s1;
  const int64_t n = p.lists.n, m = p.lists.m;
  const int direction = p.lists.direction, reduction = p.lists.reduction;
  const T alpha = static_cast<T>(p.alpha);
  T* loss = static_cast<T*>(p.loss);
  T* dsim = static_cast<T*>(p.dsim);
  T* aux = static_cast<T*>(p.aux);
  const bool i2t = direction & kI2T, t2i = direction & kT2I;
  const int64_t n_total = (i2t ? n : 0) + (t2i ? m : 0);
  T* qloss = aux;
  T* qvalid = aux + n_total;
  int64_t off = 0, slab = 0;
  int64_t offs[2] = {0, 0}, counts[2] = {0, 0};
  if (i2t) {
    direction_pass(sim, s0, s1, rel, r0, r1, p.rel_i2t, mask, m0, m1, n, m, alpha, dsim, m, int64_t(1), qloss,
                   qvalid);
    offs[slab] = off; counts[slab] = n; off += n; ++slab;
  }
  if (t2i) {
    OwnedLists<T> cols;  // the t2i lists, from the rows' (the CPU reads no rel_t2i)
    if (p.rel_i2t.offsets != nullptr) cols = column_lists<T>(p.rel_i2t, n, m);
    direction_pass(sim, s1, s0, rel, r1, r0, cols.view(), mask, m1, m0, m, n, alpha, dsim + slab * n * m, int64_t(1),
                   m, qloss + off, qvalid + off);
    offs[slab] = off; counts[slab] = m; off += m; ++slab;
  }
  reduce_queries(aux, n_total, static_cast<int>(slab), offs, counts, reduction, loss);
}

template <typename T>
void backward_impl(const T* dsim, const T* aux, const T* go, int64_t n, int64_t m, int direction, int reduction,
                   T* grad) {
  const bool i2t = direction & kI2T, t2i = direction & kT2I;
  const int64_t n_total = (i2t ? n : 0) + (t2i ? m : 0);
  const T* coef = aux + 2 * n_total;
  const bool none = reduction == kNone;
  const T* d0 = dsim;
  const T* d1 = (i2t && t2i) ? dsim + n * m : dsim;
  const T* go_t = go + (i2t ? n : 0);  // t2i block of grad_out ("none")
  const bool parallel = n * m >= (int64_t(1) << 16);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < n; ++i) {
    T* out = grad + i * m;
    if (i2t && t2i) {
      const T wi = none ? go[i] : go[0] * coef[0];
      const T* a = d0 + i * m;
      const T* b = d1 + i * m;
      if (none) {
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) out[j] = wi * a[j] + go_t[j] * b[j];
      } else {
        const T wj = go[0] * coef[1];
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) out[j] = wi * a[j] + wj * b[j];
      }
    } else if (i2t) {
      const T wi = none ? go[i] : go[0] * coef[0];
      const T* a = d0 + i * m;
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) out[j] = wi * a[j];
    } else {
      const T* b = d0 + i * m;
      if (none) {
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) out[j] = go[j] * b[j];
      } else {
        const T wj = go[0] * coef[0];
#pragma omp simd
        for (int64_t j = 0; j < m; ++j) out[j] = wj * b[j];
      }
    }
  }
}

}  // namespace

void kendall_forward(const KendallForward& p) {
  if (p.rel_dt != p.lists.dt) throw std::invalid_argument("fastrank: CPU kendall needs relevance in sim's dtype");
  FASTRANK_DISPATCH_CPU(p.lists.dt, T,
      forward_impl<T>(p));
}

void kendall_backward(const KendallBackward& p) {
  FASTRANK_DISPATCH_CPU(p.lists.dt, T,
      backward_impl<T>(static_cast<const T*>(p.dsim), static_cast<const T*>(p.aux),
                       static_cast<const T*>(p.grad_out), p.lists.n, p.lists.m, p.lists.direction,
                       p.lists.reduction, static_cast<T*>(p.grad)));
}

}  // namespace cpu
}  // namespace fastrank
