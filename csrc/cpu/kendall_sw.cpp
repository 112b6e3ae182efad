// Kendall SW-HS loss on the CPU (docs/spec.md §2.3; BCLS, Eq. 18-20).
//
// One call: every requested direction (t2i through the swapped strides) and the
// reduction (cpu::reduce_queries, shared with kendall). The window edges are computed
// here once per call, in double exactly as Python does (no FMA, no reassociation: the
// intermediate values go through volatile), then rounded to T.
// Sort-free, all windows of a query from its row at once. The window edges are
// non-increasing in m, so
//   j is a positive of window m  (r_j >= u_m)  for m >= p_j = #{m : u_m > r_j},
//   k is a negative of window m  (r_k <  l_m)  for m <  n_k = #{m : l_m > r_k}
// (the same comparisons as `r >= u_m` / `r < l_m`). p and n are counted for the whole
// row with one vectorised pass per window (`#pragma omp simd` over the candidates:
// branch-free, far cheaper than a branchy binary search per candidate for the usual
// n_w ~ 20). Then each candidate goes into one bucket: positive bucket p_j keeps the
// lowest-index minimum score, negative bucket n_k the lowest-index maximum (candidates
// in increasing order, strict comparisons, branch-free selects; bucket n_w of the
// positives and bucket 0 of the negatives collect the candidates in no window).
// argmin over P_m = prefix minimum of positive buckets 0..m; argmax over N_m = suffix
// maximum of negative buckets m+1..n_w; both scans break ties by the lower index.
// NaN/inf: the poison (common.h) of every s and r of the row is added to the query's loss, and the
// backward adds poison(qloss) to the query's gradient entries.
// Work: O(n_c * n_w / vector width + n_c + n_w) per query. Memory plan: O(kTile * n_c + n_w)
// scratch per thread (kTile = 16 queries' rows of s and r copied contiguous by gather_rows:
// t2i reads 16 columns per cache line; the two counts; the buckets) plus the 2 * n_w
// edges per call; outputs loss, idx (n_total, n_w, 2) int32, aux.
// Backward: per query, an integer counter per candidate (+1 as k*, -1 as j* of each
// active window, in window order), then grad = count * w / n_w: i2t writes the rows,
// then t2i adds to the columns, kTile columns per cache line (each entry owned by one
// thread in each pass, no atomics, fixed order). OpenMP over tiles of kTile queries (for
// large enough problems); deterministic.
#include "fastrank/kendall_sw.h"

#include <omp.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "fastrank/kendall.h"

namespace fastrank {
namespace cpu {
namespace {

constexpr int64_t kTile = 16;  // queries per tile (gather_rows: one cache line of floats per item)

// One thread's scratch for one query: per candidate the two window counts, per bucket
// (n_w + 1) the running minimum / maximum score and its index.
template <typename T>
struct Buckets {
  int32_t *pc, *nc, *pi, *ni;
  T *ps, *ns;
};

// The loss of one query (s, r: its n_c scores and relevances, contiguous) and its
// (j*, k*) per window into out[2 * m], out[2 * m + 1].
template <typename T>
T window_loss(const T* __restrict s, const T* __restrict r, int64_t n_c, const T* upper, const T* lower,
              int64_t n_w, const Buckets<T>& b, int32_t* out) {
  const T inf = std::numeric_limits<T>::infinity();
  int32_t* __restrict pc = b.pc;
  int32_t* __restrict nc = b.nc;
  int32_t* pi = b.pi;
  int32_t* ni = b.ni;
  T* ps = b.ps;
  T* ns = b.ns;
  T poison = 0;
#pragma omp simd reduction(+ : poison)
  for (int64_t c = 0; c < n_c; ++c) poison += fastrank::poison(s[c]) + fastrank::poison(r[c]);
  // p_c = #{m : u_m > r_c}, n_c = #{m : l_m > r_c}
  std::fill(pc, pc + n_c, 0);
  std::fill(nc, nc + n_c, 0);
  for (int64_t m = 0; m < n_w; ++m) {
    const T u = upper[m], l = lower[m];
#pragma omp simd
    for (int64_t c = 0; c < n_c; ++c) {
      pc[c] += u > r[c] ? 1 : 0;
      nc[c] += l > r[c] ? 1 : 0;
    }
  }
  // buckets: lowest-index minimum (positives) / maximum (negatives) per entry count
  std::fill(ps, ps + n_w + 1, inf);
  std::fill(ns, ns + n_w + 1, -inf);
  std::fill(pi, pi + n_w + 1, -1);
  std::fill(ni, ni + n_w + 1, -1);
  for (int64_t c = 0; c < n_c; ++c) {
    const T sc = s[c];
    const int32_t p = pc[c], n = nc[c], ci = static_cast<int32_t>(c);
    const bool lower_s = sc < ps[p];
    ps[p] = lower_s ? sc : ps[p];
    pi[p] = lower_s ? ci : pi[p];
    const bool higher_s = sc > ns[n];
    ns[n] = higher_s ? sc : ns[n];
    ni[n] = higher_s ? ci : ni[n];
  }
  // P_m (m = 0..n_w-1) = candidates with p <= m: prefix minimum over buckets 0..m
  for (int64_t m = 1; m < n_w; ++m) {
    const int32_t a = pi[m - 1], b = pi[m];
    if (a >= 0 && (b < 0 || ps[m - 1] < ps[m] || (ps[m - 1] == ps[m] && a < b))) { ps[m] = ps[m - 1]; pi[m] = a; }
  }
  // N_m = candidates with n >= m + 1: suffix maximum over buckets n_w..m+1
  for (int64_t m = n_w - 1; m >= 1; --m) {
    const int32_t a = ni[m + 1], b = ni[m];
    if (a >= 0 && (b < 0 || ns[m + 1] > ns[m] || (ns[m + 1] == ns[m] && a < b))) { ns[m] = ns[m + 1]; ni[m] = a; }
  }
  // Eq. 19: (1 / M) sum_m [s_{k*} - s_{j*}]+, windows in order
  T total = 0;
  for (int64_t m = 0; m < n_w; ++m) {
    const int32_t j = pi[m], k = ni[m + 1];
    out[2 * m] = j;
    out[2 * m + 1] = k;
    if (j >= 0 && k >= 0) total += std::max(ns[m + 1] - ps[m], T(0));
  }
  return total / static_cast<T>(n_w) + poison;
}

template <typename T>
void direction_pass(const T* sim, int64_t s_q, int64_t s_c, const T* rel, int64_t r_q, int64_t r_c, int64_t n_q,
                    int64_t n_c, const T* upper, const T* lower, int64_t n_w, T* qloss, int32_t* idx) {
  // small problems run on the calling thread: a parallel region costs more than it saves
  const bool parallel = n_q > 1 && n_q * (n_c + n_w) >= (int64_t(1) << 15);
  const int64_t n_tiles = (n_q + kTile - 1) / kTile;
  // per-thread scratch, two allocations: a tile of kTile rows of s and r (kTile * n_c each)
  // and the buckets' scores; the counts and the buckets' indices
  auto body = [&](int64_t t_begin, int64_t t_step) {
    std::vector<T> t_buf(2 * kTile * n_c + 2 * (n_w + 1));
    std::vector<int32_t> i_buf(2 * n_c + 2 * (n_w + 1));
    T* s_tile = t_buf.data();
    T* r_tile = s_tile + kTile * n_c;
    Buckets<T> b;
    b.ps = r_tile + kTile * n_c;
    b.ns = b.ps + (n_w + 1);
    b.pc = i_buf.data();
    b.nc = b.pc + n_c;
    b.pi = b.nc + n_c;
    b.ni = b.pi + (n_w + 1);
    for (int64_t tile = t_begin; tile < n_tiles; tile += t_step) {
      const int64_t q0 = tile * kTile, nt = std::min(kTile, n_q - q0);
      gather_rows(sim, s_q, s_c, q0, nt, n_c, s_tile);
      gather_rows(rel, r_q, r_c, q0, nt, n_c, r_tile);
      for (int64_t t = 0; t < nt; ++t)
        qloss[q0 + t] = window_loss(s_tile + t * n_c, r_tile + t * n_c, n_c, upper, lower, n_w, b,
                                    idx + (q0 + t) * n_w * 2);
    }
  };
  if (!parallel) {  // no OpenMP region for small problems
    body(0, 1);
    return;
  }
#pragma omp parallel
  body(omp_get_thread_num(), omp_get_num_threads());  // static round-robin of tiles: fixed per-query work
}

template <typename T>
void forward_impl(const KendallSwForward& p) {
  const T* sim = static_cast<const T*>(p.sim.data);
  const T* rel = static_cast<const T*>(p.rel.data);
  const int64_t s0 = p.sim.s0, s1 = p.sim.s1, r0 = p.rel.s0, r1 = p.rel.s1, n = p.lists.n, m = p.lists.m;
  const double alpha = p.alpha, beta = p.beta, hi = p.hi;
  const int64_t n_w = p.n_w;
  const int direction = p.lists.direction, reduction = p.lists.reduction;
  T* loss = static_cast<T*>(p.loss);
  int32_t* idx = p.idx;
  T* aux = static_cast<T*>(p.aux);
  // window edges: u = hi - m * beta, l = u - alpha in double (as Python), rounded to T
  std::vector<T> upper(n_w), lower(n_w);
  for (int64_t w = 0; w < n_w; ++w) {
    volatile double prod = static_cast<double>(w) * beta;  // volatile: no FMA, no reassociation
    volatile double u = hi - prod;
    const double uu = u;
    const double l = uu - alpha;
    upper[w] = static_cast<T>(uu);
    lower[w] = static_cast<T>(l);
  }
  const bool i2t = direction & kI2T, t2i = direction & kT2I;
  const int64_t n_total = (i2t ? n : 0) + (t2i ? m : 0);
  int64_t off = 0, slab = 0, offs[2] = {0, 0}, counts[2] = {0, 0};
  if (i2t) {
    direction_pass(sim, s0, s1, rel, r0, r1, n, m, upper.data(), lower.data(), n_w, aux, idx);
    offs[slab] = off; counts[slab] = n; off += n; ++slab;
  }
  if (t2i) {
    direction_pass(sim, s1, s0, rel, r1, r0, m, n, upper.data(), lower.data(), n_w, aux + off, idx + off * n_w * 2);
    offs[slab] = off; counts[slab] = m; off += m; ++slab;
  }
  std::fill(aux + n_total, aux + 2 * n_total, T(1));  // every list is valid (no masks)
  reduce_queries(aux, n_total, static_cast<int>(slab), offs, counts, reduction, loss);
}

// One direction's share of the gradient: out[q * o_q + c * o_c] (+)= count * w_q / n_w + 0 * qloss[q].
template <typename T>
void backward_pass(const T* sim, int64_t s_q, int64_t s_c, int64_t n_q, int64_t n_c, const int32_t* idx,
                   int64_t n_w, const T* qloss, const T* go, T go_scale, bool accumulate, T* out, int64_t o_q,
                   int64_t o_c) {
  const bool parallel = n_q > 1 && n_q * (n_c + n_w) >= (int64_t(1) << 17);
  const int64_t n_tiles = (n_q + kTile - 1) / kTile;
  // a tile of kTile queries at a time: when the queries are the columns of out (o_q == 1,
  // t2i), each c writes kTile neighbouring values (one cache line) instead of kTile lines
  auto body = [&](int64_t t_begin, int64_t t_step) {
    std::vector<int32_t> count(kTile * n_c);
    T coef[kTile], nan_of[kTile];  // nan_of: 0, or NaN for a non-finite query loss
    for (int64_t tile = t_begin; tile < n_tiles; tile += t_step) {
      const int64_t q0 = tile * kTile, nt = std::min(kTile, n_q - q0);
      std::fill(count.begin(), count.begin() + nt * n_c, 0);
      for (int64_t t = 0; t < nt; ++t) {
        const int64_t q = q0 + t;
        const T* s = sim + q * s_q;
        const int32_t* w = idx + q * n_w * 2;
        int32_t* cnt = count.data() + t * n_c;
        for (int64_t m = 0; m < n_w; ++m) {
          const int32_t j = w[2 * m], k = w[2 * m + 1];
          if (j >= 0 && k >= 0 && s[k * s_c] > s[j * s_c]) { ++cnt[k]; --cnt[j]; }
        }
        coef[t] = (go == nullptr ? go_scale : go[q]) / static_cast<T>(n_w);
        nan_of[t] = fastrank::poison(qloss[q]);
      }
      auto put = [&](T* o, int64_t t, int64_t c) {
        const T v = static_cast<T>(count[t * n_c + c]) * coef[t] + nan_of[t];
        if (accumulate) *o += v;
        else *o = v;
      };
      if (o_q == 1 && o_c != 1) {
        for (int64_t c = 0; c < n_c; ++c)
          for (int64_t t = 0; t < nt; ++t) put(out + (q0 + t) + c * o_c, t, c);
      } else {
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t c = 0; c < n_c; ++c) put(out + (q0 + t) * o_q + c * o_c, t, c);
      }
    }
  };
  if (!parallel) {
    body(0, 1);
    return;
  }
#pragma omp parallel
  body(omp_get_thread_num(), omp_get_num_threads());
}

template <typename T>
void backward_impl(const KendallSwBackward& p) {
  const T* sim = static_cast<const T*>(p.sim.data);
  const int64_t s0 = p.sim.s0, s1 = p.sim.s1, n = p.lists.n, m = p.lists.m, n_w = p.n_w;
  const int32_t* idx = p.idx;
  const T* aux = static_cast<const T*>(p.aux);
  const T* go = static_cast<const T*>(p.grad_out);
  T* grad = static_cast<T*>(p.grad);
  const int direction = p.lists.direction, reduction = p.lists.reduction;
  const bool i2t = direction & kI2T, t2i = direction & kT2I;
  const int64_t n_total = (i2t ? n : 0) + (t2i ? m : 0);
  const T* coef = aux + 2 * n_total;
  const bool none = reduction == kNone;
  int64_t off = 0, slab = 0;
  if (i2t) {
    backward_pass(sim, s0, s1, n, m, idx, n_w, aux, none ? go : nullptr, none ? T(0) : go[0] * coef[0], false,
                  grad, m, int64_t(1));
    off += n;
    ++slab;
  } else {
    std::fill(grad, grad + n * m, T(0));
  }
  if (t2i) {
    backward_pass(sim, s1, s0, m, n, idx + off * n_w * 2, n_w, aux + off, none ? go + off : nullptr,
                  none ? T(0) : go[0] * coef[slab], true, grad, int64_t(1), m);
  }
}

}  // namespace

void kendall_sw_forward(const KendallSwForward& p) {
  if (p.rel_dt != p.lists.dt) throw std::invalid_argument("fastrank: CPU kendall_sw needs relevance in sim's dtype");
  FASTRANK_DISPATCH_CPU(p.lists.dt, T, forward_impl<T>(p));
}

void kendall_sw_backward(const KendallSwBackward& p) { FASTRANK_DISPATCH_CPU(p.lists.dt, T, backward_impl<T>(p)); }

}  // namespace cpu
}  // namespace fastrank
