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
#include <vector>

namespace fastrank {
namespace cpu {
namespace {

// The pair loops run over whole vectors: rows are padded to a multiple of kLanes with
// finite zeros, each inner loop starts at the vector boundary below k = j + 1, and a
// 0/1 factor drops the pairs with k <= j or k >= n. Without this, the scalar remainder
// of the triangular loop dominates at n ~ 100 (2-3x slower at 128).
constexpr int64_t kLanes = 16;
constexpr int64_t kParallelWork = int64_t(1) << 18;  // below: one thread (no fork/join)
inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }
inline int64_t aligned_start(int64_t k) { return k / kLanes * kLanes; }
template <typename T> inline T pair_mask(int64_t k, int64_t j, int64_t n) {
  return static_cast<T>((k > j) & (k < n));
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
  std::vector<T> s, y, p, g;
  std::vector<int64_t> idx;
  explicit Scratch(int64_t c) : s(padded(c)), y(padded(c)), p(padded(c)), g(c), idx(c) {}
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

// Eq. 16: p_j = 1 + sum_{k != j} sigma((s_k - s_j) / tau) over the nv items of s
// (s padded with finite values up to padded(nv)); pairs (j, k > j) once.
template <typename T>
void smooth_ranks(const T* __restrict s, int64_t nv, T inv_tau, T* __restrict p) {
  const int64_t n_pad = padded(nv);
  std::fill(p, p + n_pad, T(1));
  for (int64_t j = 0; j < nv; ++j) {
    const T sj = s[j];
    T acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t k = aligned_start(j + 1); k < n_pad; ++k) {
      const T keep = pair_mask<T>(k, j, nv);
      const T x = (s[k] - sj) * inv_tau;
      acc += keep * logistic_pos(x);   // sigma((s_k - s_j) / tau) -> p_j
      p[k] += keep * logistic_neg(x);  // sigma((s_j - s_k) / tau) -> p_k
    }
    p[j] += acc;
  }
}

// g_m = sum_{k != m} sigma'((s_k - s_m) / tau) (a_k - a_m); pairs (m, k > m) once
// (s and a padded with finite values up to padded(nv)).
template <typename T>
void rank_grad(const T* __restrict s, const T* __restrict a, int64_t nv, T inv_tau, T* __restrict g) {
  const int64_t n_pad = padded(nv);
  std::fill(g, g + n_pad, T(0));
  for (int64_t m = 0; m < nv; ++m) {
    const T sm = s[m], am = a[m];
    T acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t k = aligned_start(m + 1); k < n_pad; ++k) {
      const T t = pair_mask<T>(k, m, nv) * logistic_deriv((s[k] - sm) * inv_tau) * (a[k] - am);
      acc += t;
      g[k] -= t;
    }
    g[m] += acc;
  }
}

// One query of the forward: writes its row of a and its IDCG, returns its loss;
// *n_valid = the number of items in its list.
template <typename T>
T forward_query(const View& v, int64_t q, const T* sim, const T* rel, const uint8_t* mask, T inv_tau,
                const T* disc, Scratch<T>& w, T* a, T* idcg, int64_t* n_valid) {
  const uint8_t* mrow = mask ? mask + q * v.mq : nullptr;
  T* __restrict s = w.s.data();
  T* __restrict r = w.y.data();
  T* __restrict p = w.p.data();
  T* __restrict gs = w.g.data();
  const int64_t nv = gather_valid(sim + q * v.sq, v.sc, rel + q * v.rq, v.rc, mrow, v.mc, v.nc, s, r,
                                  w.idx.data());
  *n_valid = nv;
  T* arow = a + q * v.aq;
  if (mrow != nullptr)
    for (int64_t c = 0; c < v.nc; ++c) arow[c * v.ac] = T(0);  // masked items: a = 0
  if (nv == 0) {
    idcg[q] = T(0);
    return T(0);
  }
  std::fill(s + nv, s + padded(nv), T(0));
  smooth_ranks(s, nv, inv_tau, p);
  // Eq. 17: DCG = sum_j g_j / log2(1 + pi_j); a_j = g_j * d/dpi [1 / log2(1 + pi)](pi_j).
  // z = poison(s_j + r_j) carries a non-finite input into the loss and the gradient.
  constexpr T kLn2 = T(0.69314718055994530942);
  T dcg = 0;
  bool nan_gain = false;
  for (int64_t j = 0; j < nv; ++j) {
    const T g = ndcg_gain(r[j]);
    const T l = std::log1p(p[j]);
    const T z = poison(s[j] + r[j]);
    dcg += g * (kLn2 / l) + z;
    arow[(mrow ? w.idx[j] : j) * v.ac] = g * (-kLn2 / ((T(1) + p[j]) * l * l)) + z;
    gs[j] = g;
    nan_gain |= g != g;
  }
  // IDCG: the gains sorted descending, position p discounted by 1 / log2(1 + p).
  // (A NaN gain would break the sort's ordering: the IDCG is NaN then.)
  T ideal = std::numeric_limits<T>::quiet_NaN();
  if (!nan_gain) {
    std::sort(gs, gs + nv, std::greater<T>());
    ideal = 0;
    for (int64_t i = 0; i < nv; ++i) ideal += gs[i] * disc[i];
  }
  idcg[q] = ideal;
  // Eq. 18, 20-21: loss = 1 - DCG / IDCG; 0 when IDCG <= 0 (still poisoned by a NaN)
  return (ideal > T(0) ? T(1) - dcg / ideal : T(0)) + poison(dcg);
}

// One query of the backward: its items' gradient, written (or added, for the second
// direction) into grad; masked items get exactly 0 (written by the first direction).
template <typename T>
void backward_query(const View& v, int64_t q, const T* sim, const uint8_t* mask, const T* a, T coef,
                    T inv_tau, Scratch<T>& w, T* grad, bool accumulate) {
  const uint8_t* mrow = mask ? mask + q * v.mq : nullptr;
  T* __restrict s = w.s.data();
  T* __restrict av = w.y.data();
  T* __restrict g = w.p.data();
  const int64_t nv = gather_valid(sim + q * v.sq, v.sc, a + q * v.aq, v.ac, mrow, v.mc, v.nc, s, av,
                                  w.idx.data());
  T* grow = grad + q * v.aq;
  if (!accumulate && mrow != nullptr)
    for (int64_t c = 0; c < v.nc; ++c) grow[c * v.ac] = T(0);
  if (nv == 0) return;
  if (coef == T(0)) {
    // constant loss (IDCG <= 0 or a zero weight): 0, unless an input was non-finite
    for (int64_t j = 0; j < nv; ++j) g[j] = poison(av[j]);
  } else {
    std::fill(s + nv, s + padded(nv), T(0));
    std::fill(av + nv, av + padded(nv), T(0));
    rank_grad(s, av, nv, inv_tau, g);
    for (int64_t j = 0; j < nv; ++j) g[j] *= coef;
  }
  for (int64_t j = 0; j < nv; ++j) {
    T& out = grow[(mrow ? w.idx[j] : j) * v.ac];
    out = accumulate ? out + g[j] : g[j];
  }
}

struct Layout {  // offsets into ws (smooth_ndcg.h)
  bool d1, d2;
  int64_t nq1, nq2, q;
  int64_t a1, a2, idcg, qloss, counts;
};

Layout layout_of(int64_t n, int64_t m, int direction) {
  Layout l;
  l.d1 = (direction & kI2T) != 0;
  l.d2 = (direction & kT2I) != 0;
  l.nq1 = l.d1 ? n : 0;
  l.nq2 = l.d2 ? m : 0;
  l.q = l.nq1 + l.nq2;
  l.a1 = 0;
  l.a2 = l.d1 ? n * m : 0;
  l.idcg = (int64_t(l.d1) + int64_t(l.d2)) * n * m;
  l.qloss = l.idcg + l.q;
  l.counts = l.qloss + l.q;
  return l;
}

template <typename T>
void forward_impl(const T* sim, int64_t ss0, int64_t ss1, const T* rel, int64_t rs0, int64_t rs1,
                  const uint8_t* mask, int64_t ms0, int64_t ms1, int64_t n, int64_t m, int direction,
                  int reduction, T tau, T* out, T* ws) {
  const Layout L = layout_of(n, m, direction);
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
    Scratch<T> w(c_max);
    if (L.d1) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t q = 0; q < n; ++q)
        qloss[q] = forward_query(v1, q, sim, rel, mask, inv_tau, disc.data(), w, ws + L.a1, idcg,
                                 &n_valid[q]);
    }
    if (L.d2) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t q = 0; q < m; ++q)
        qloss[L.nq1 + q] = forward_query(v2, q, sim, rel, mask, inv_tau, disc.data(), w, ws + L.a2,
                                         idcg + L.nq1, &n_valid[L.nq1 + q]);
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

template <typename T>
void backward_impl(const T* sim, int64_t ss0, int64_t ss1, const uint8_t* mask, int64_t ms0, int64_t ms1,
                   int64_t n, int64_t m, int direction, int reduction, T tau, const T* grad_out, int64_t gs,
                   const T* ws, T* grad) {
  const Layout L = layout_of(n, m, direction);
  const View v1 = view_of(false, n, m, ss0, ss1, 0, 0, ms0, ms1);
  const View v2 = view_of(true, n, m, ss0, ss1, 0, 0, ms0, ms1);
  const T inv_tau = T(1) / tau;
  const int64_t c_max = std::max(L.d1 ? m : 0, L.d2 ? n : 0);
  const T* idcg = ws + L.idcg;
  // d loss / d (query loss): grad_out per query ("none"), else grad_out[0] (/ count: "mean")
  T scale[2];
  for (int d = 0; d < 2; ++d) {
    const T count = ws[L.counts + d];
    scale[d] = reduction == kMean ? (count > T(0) ? T(1) / count : T(0)) : T(1);
  }
  auto coef = [&](int d, int64_t qi) {
    const T wq = reduction == kNone ? grad_out[qi * gs] : grad_out[0] * scale[d];
    return idcg[qi] > T(0) ? -wq * inv_tau / idcg[qi] : T(0);
  };
  const int64_t work = (L.d1 ? n * m * m : 0) + (L.d2 ? m * n * n : 0);
#pragma omp parallel if (work >= kParallelWork)
  {
    Scratch<T> w(c_max);
    if (L.d1) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t q = 0; q < n; ++q)
        backward_query(v1, q, sim, mask, ws + L.a1, coef(0, q), inv_tau, w, grad, false);
    }
    if (L.d2) {  // after the i2t loop's barrier: add into what it wrote
#pragma omp for schedule(dynamic, 1)
      for (int64_t q = 0; q < m; ++q)
        backward_query(v2, q, sim, mask, ws + L.a2, coef(1, L.nq1 + q), inv_tau, w, grad, L.d1);
    }
  }
}

}  // namespace

void smooth_ndcg_forward(DType dt, const void* sim, int64_t ss0, int64_t ss1, const void* rel,
                         int64_t rs0, int64_t rs1, const uint8_t* mask, int64_t ms0, int64_t ms1,
                         int64_t n, int64_t m, int direction, int reduction, double tau, void* out,
                         void* ws) {
  FASTRANK_DISPATCH_CPU(dt, T,
      forward_impl<T>(static_cast<const T*>(sim), ss0, ss1, static_cast<const T*>(rel), rs0, rs1, mask,
                      ms0, ms1, n, m, direction, reduction, static_cast<T>(tau), static_cast<T*>(out),
                      static_cast<T*>(ws)));
}

void smooth_ndcg_backward(DType dt, const void* sim, int64_t ss0, int64_t ss1, const uint8_t* mask,
                          int64_t ms0, int64_t ms1, int64_t n, int64_t m, int direction,
                          int reduction, double tau, const void* grad_out, int64_t gs,
                          const void* ws, void* grad) {
  FASTRANK_DISPATCH_CPU(dt, T,
      backward_impl<T>(static_cast<const T*>(sim), ss0, ss1, mask, ms0, ms1, n, m, direction, reduction,
                       static_cast<T>(tau), static_cast<const T*>(grad_out), gs,
                       static_cast<const T*>(ws), static_cast<T*>(grad)));
}

}  // namespace cpu
}  // namespace fastrank
