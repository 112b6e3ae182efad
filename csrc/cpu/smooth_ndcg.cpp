// Fused smooth-NDCG on the CPU (SPEC.md 2.1, 2.1a; paper 000, Eq. 16-21).
//
// One call computes every requested direction and the reduction: the forward is one pass
// over the pairs of each query (smooth ranks), then O(C log C) per query for the DCG and
// the IDCG (a sort of the query's gains); the backward is one more pass over the pairs.
// Work: O(n * m^2 + m * n^2) per pass. Never an (n_q, n_c, n_c) tensor.
// Memory plan: per thread, O(C) scratch rows: the query's valid items gathered
// contiguous (whatever the strides; the t2i queries are columns read through the swapped
// strides), padded with finite zeros to whole vectors. With a mask the valid items are
// compacted first, so the pair loops run over the valid items only. Saved for the
// backward: a (n, m) per direction, idcg and counts (the `ws` of smooth_ndcg.h).
// Parallelism: OpenMP over the queries of a direction (one query per thread at a time,
// every sum in a fixed order: bit-identical results run to run); one thread below
// kParallelWork pairs. The backward's t2i queries add into the gradient the i2t queries
// wrote, after the barrier that ends the i2t loop.
// The pair loops visit each unordered pair (j, k > j) once: one exp gives
// sigma(x) for j and sigma(-x) = 1 - sigma(x) for k; `#pragma omp simd` vectorises them
// (the float exp of common.h is plain arithmetic).
#include "fastrank/smooth_ndcg.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

namespace fastrank {
namespace cpu {
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

View view_of(bool t2i, int64_t n, int64_t m, int64_t ss0, int64_t ss1, int64_t rs0, int64_t rs1,
             int64_t ms0, int64_t ms1) {
  if (!t2i) return View{n, m, ss0, ss1, rs0, rs1, ms0, ms1, m, 1};
  return View{m, n, ss1, ss0, rs1, rs0, ms1, ms0, 1, m};
}

// A thread's scratch rows (sized for the longest list of the call).
template <typename T> struct Scratch {
  std::vector<T> s, y, p, g, a;
  std::vector<int64_t> idx;
  std::vector<T> d;  // sigma' of the rank pass, kept for the gradient pass (empty: recompute)
  Scratch(int64_t c, bool with_grad)
      : s(padded(c)), y(padded(c)), p(padded(c)), g(padded(c)), a(padded(c)), idx(c) {
    if (with_grad && tri_size(c) * int64_t(sizeof(T)) <= kSigmaCacheBytes) d.resize(tri_size(c));
  }
};

// Gathers the valid items of one query (x = sim, y = relevance or a) into contiguous
// rows; returns their count. With a mask, idx[j] = the candidate index of item j.
template <typename T>
int64_t gather_valid(const T* x, int64_t xc, const T* y, int64_t yc, const uint8_t* mrow, int64_t mc,
                     int64_t nc, T* xs, T* ys, int64_t* idx) {
  if (mrow == nullptr) {
    gather_row(x, xc, nc, xs);
    gather_row(y, yc, nc, ys);
    return nc;
  }
  int64_t nv = 0;
  for (int64_t c = 0; c < nc; ++c) {
    if (mrow[c * mc]) {
      idx[nv] = c;
      xs[nv] = x[c * xc];
      ys[nv] = y[c * yc];
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

// One query of the forward: returns its loss, writes its IDCG and, with_grad, its row of
// G = d DCG / d s * tau (the gradient up to the per-query factor -w / (tau * IDCG) that
// the backward applies): the gradient pass runs here, while the query's row is in
// cache, on the sigma' values the rank pass kept (when the list is short enough).
// *n_valid = the number of items in its list.
template <typename T>
T forward_query(const View& v, int64_t q, const T* sim, const T* rel, const uint8_t* mask, T inv_tau,
                const T* disc, Scratch<T>& w, bool with_grad, T* G, T* idcg, int64_t* n_valid) {
  const uint8_t* mrow = mask ? mask + q * v.mq : nullptr;
  T* __restrict s = w.s.data();
  T* __restrict r = w.y.data();
  T* __restrict p = w.p.data();
  T* __restrict gs = w.g.data();
  T* __restrict av = w.a.data();
  const int64_t nv = gather_valid(sim + q * v.sq, v.sc, rel + q * v.rq, v.rc, mrow, v.mc, v.nc, s, r,
                                  w.idx.data());
  *n_valid = nv;
  T* grow = G + q * v.aq;
  if (with_grad && mrow != nullptr)
    for (int64_t c = 0; c < v.nc; ++c) grow[c * v.ac] = T(0);  // masked items: gradient 0
  if (nv == 0) {
    idcg[q] = T(0);
    return T(0);
  }
  std::fill(s + nv, s + padded(nv), T(0));
  T* d = with_grad && w.d.size() > 0 ? w.d.data() : nullptr;  // sigma' cache (short lists)
  smooth_ranks(s, nv, inv_tau, p, d);
  // Eq. 17: DCG = sum_j g_j / log2(1 + pi_j); a_j = g_j * d/dpi [1 / log2(1 + pi)](pi_j).
  // z = poison(s_j + r_j) carries a non-finite input into the loss and the gradient.
  for (int64_t j = 0; j < nv; ++j) gs[j] = ndcg_gain(r[j]);  // libm exp2: the reference's gain
  T dcg = 0;
  int nan_gain = 0;
#pragma omp simd reduction(+ : dcg) reduction(| : nan_gain)
  for (int64_t j = 0; j < nv; ++j) {
    const T g = gs[j];
    T f, fd;
    ndcg_discounts(p[j], log_ge1(T(1) + p[j]), &f, &fd);  // p_j >= 1: no cancellation in 1 + p_j
    const T z = poison(s[j] + r[j]);
    dcg += g * f + z;
    av[j] = g * fd + z;
    nan_gain |= g != g;
  }
  // IDCG: the gains in descending order, position p discounted by disc[p] = 1 / log2(2 + p).
  // Short lists count, for each gain, the gains above it (gt) and equal to it (eq, itself
  // included): its tie group holds positions gt .. gt + eq - 1, so each member adds g_j
  // times the mean of their discounts (disc[gt] itself when eq = 1): O(C^2) compares in
  // whole vectors, no index compare, ~4x faster than std::sort at C = 128 (where the sort
  // took 1.1 ms of a 128 x 128 call). Long lists sort. A NaN gain would break the
  // ordering: the IDCG is NaN then.
  T ideal = std::numeric_limits<T>::quiet_NaN();
  if (!nan_gain) {
    ideal = 0;
    if (nv <= kCountRanksMax) {
      // in double: a tie group's members each add g_j times the group's mean discount, so
      // float rounding would grow with the group's size (a list of equal gains: 500 adds)
      double sum = 0;
      const int64_t pad = padded(nv);
      std::fill(gs + nv, gs + pad, -std::numeric_limits<T>::infinity());  // above or equal to none
      for (int64_t j = 0; j < nv; ++j) {
        const T gj = gs[j];
        if (gj == T(0)) continue;  // adds 0 wherever it stands
        T gt = 0, eq = 0;          // exact counts (C <= kCountRanksMax << 2^24)
#pragma omp simd reduction(+ : gt, eq)
        for (int64_t k = 0; k < pad; ++k) {
          gt += gs[k] > gj ? T(1) : T(0);
          eq += gs[k] == gj ? T(1) : T(0);
        }
        const int64_t at = static_cast<int64_t>(gt), ties = static_cast<int64_t>(eq);
        if (ties == 1) {
          sum += double(gj) * double(disc[at]);
        } else {
          double dsum = 0;
          for (int64_t i = 0; i < ties; ++i) dsum += double(disc[at + i]);
          sum += double(gj) * (dsum / double(ties));
        }
      }
      ideal = static_cast<T>(sum);
    } else {
      std::sort(gs, gs + nv, std::greater<T>());
      for (int64_t i = 0; i < nv; ++i) ideal += gs[i] * disc[i];
    }
  }
  idcg[q] = ideal;
  if (with_grad) {
    // G_m = sum_{k != m} sigma'((s_k - s_m) / tau) (a_k - a_m) (+ poison(a_m): a lone item)
    std::fill(av + nv, av + padded(nv), T(0));
    rank_grad(s, d, av, nv, inv_tau, p);  // p is free now: it receives G
    for (int64_t j = 0; j < nv; ++j) grow[(mrow ? w.idx[j] : j) * v.ac] = p[j] + poison(av[j]);
  }
  // Eq. 18, 20-21: loss = 1 - DCG / IDCG; 0 when IDCG <= 0 (still poisoned by a NaN)
  return (ideal > T(0) ? T(1) - dcg / ideal : T(0)) + poison(dcg);
}

using Layout = SmoothNDCGLayout;  // offsets into ws (smooth_ndcg.h)

template <typename T>
void forward_impl(const T* sim, int64_t ss0, int64_t ss1, const T* rel, int64_t rs0, int64_t rs1,
                  const uint8_t* mask, int64_t ms0, int64_t ms1, int64_t n, int64_t m, int direction,
                  int reduction, bool with_grad, T tau, T* out, T* ws) {
  const Layout L = smooth_ndcg_layout(n, m, direction);
  const View v1 = view_of(false, n, m, ss0, ss1, rs0, rs1, ms0, ms1);
  const View v2 = view_of(true, n, m, ss0, ss1, rs0, rs1, ms0, ms1);
  const T inv_tau = T(1) / tau;
  const int64_t c_max = std::max(L.d1 ? m : 0, L.d2 ? n : 0);
  std::vector<T> disc(c_max);  // IDCG discounts 1 / log2(1 + p), p = 1..c_max
  for (int64_t i = 0; i < c_max; ++i) disc[i] = ndcg_discount(T(i + 1));
  std::vector<int64_t> n_valid(L.q);
  T* qloss = ws + L.qloss;
  T* idcg = ws + L.idcg;
  const int64_t work = (L.d1 ? n * m * m : 0) + (L.d2 ? m * n * n : 0);
#pragma omp parallel if (work >= kParallelWork)
  {
    Scratch<T> w(c_max, with_grad);
    if (L.d1) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t q = 0; q < n; ++q)
        qloss[q] = forward_query(v1, q, sim, rel, mask, inv_tau, disc.data(), w, with_grad, ws + L.a1, idcg,
                                 &n_valid[q]);
    }
    if (L.d2) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t q = 0; q < m; ++q)
        qloss[L.nq1 + q] = forward_query(v2, q, sim, rel, mask, inv_tau, disc.data(), w, with_grad,
                                         ws + L.a2, idcg + L.nq1, &n_valid[L.nq1 + q]);
    }
  }
  // reduction, in a fixed order: per direction the sum and the count of non-empty lists
  T total = 0;
  const int64_t off[2] = {0, L.nq1}, len[2] = {L.nq1, L.nq2};
  for (int d = 0; d < 2; ++d) {
    T sum = 0;
    int64_t count = 0;
    for (int64_t q = off[d]; q < off[d] + len[d]; ++q) {
      sum += qloss[q];
      count += n_valid[q] > 0;
      if (reduction == kNone) out[q] = qloss[q];
    }
    ws[L.counts + d] = static_cast<T>(count);
    if (reduction == kMean) total += count > 0 ? sum / static_cast<T>(count) : T(0);
    if (reduction == kSum) total += sum;
  }
  if (reduction != kNone) out[0] = total;
}

// The backward is elementwise: grad[i, j] = c_i2t[i] * G_i2t[i, j] + c_t2i[j] * G_t2i[i, j]
// with the per-query factor c = -w / (tau * IDCG) (w = d out / d query loss); a constant
// query loss (c = 0) still passes a non-finite G on. Masked entries get exactly 0.
template <typename T>
void backward_impl(const uint8_t* mask, int64_t ms0, int64_t ms1, int64_t n, int64_t m, int direction,
                   int reduction, T tau, const T* grad_out, int64_t gs, const T* ws, T* grad) {
  const Layout L = smooth_ndcg_layout(n, m, direction);
  const T inv_tau = T(1) / tau;
  const T* idcg = ws + L.idcg;
  T scale[2];
  for (int d = 0; d < 2; ++d) {
    const T count = ws[L.counts + d];
    scale[d] = reduction == kMean ? (count > T(0) ? T(1) / count : T(0)) : T(1);
  }
  auto coef = [&](int d, int64_t qi) {
    const T wq = reduction == kNone ? grad_out[qi * gs] : grad_out[0] * scale[d];
    return idcg[qi] > T(0) ? -wq * inv_tau / idcg[qi] : T(0);
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

void smooth_ndcg_forward(DType dt, const void* sim, int64_t ss0, int64_t ss1, const void* rel,
                         int64_t rs0, int64_t rs1, const uint8_t* mask, int64_t ms0, int64_t ms1,
                         int64_t n, int64_t m, int direction, int reduction, int with_grad, double tau,
                         void* out, void* ws) {
  FASTRANK_DISPATCH_CPU(dt, T,
      forward_impl<T>(static_cast<const T*>(sim), ss0, ss1, static_cast<const T*>(rel), rs0, rs1, mask,
                      ms0, ms1, n, m, direction, reduction, with_grad != 0, static_cast<T>(tau),
                      static_cast<T*>(out), static_cast<T*>(ws)));
}

void smooth_ndcg_backward(DType dt, const void* sim, int64_t ss0, int64_t ss1, const uint8_t* mask,
                          int64_t ms0, int64_t ms1, int64_t n, int64_t m, int direction,
                          int reduction, double tau, const void* grad_out, int64_t gs,
                          const void* ws, void* grad) {
  (void)sim;  // the forward kept G: the backward is elementwise
  (void)ss0;
  (void)ss1;
  FASTRANK_DISPATCH_CPU(dt, T,
      backward_impl<T>(mask, ms0, ms1, n, m, direction, reduction, static_cast<T>(tau),
                       static_cast<const T*>(grad_out), gs, static_cast<const T*>(ws),
                       static_cast<T*>(grad)));
}

}  // namespace cpu
}  // namespace fastrank
