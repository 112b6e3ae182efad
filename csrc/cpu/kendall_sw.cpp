// Kendall SW-HS loss on the CPU (SPEC.md 2.3; paper 001, Eq. 18-20).
//
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
// Work: O(n_c * n_w / vector width + n_c + n_w) per query. Memory plan: O(n_c + n_w)
// scratch per thread (the row of r and s copied contiguous, the two counts, the
// buckets); outputs loss (n_q) and idx (n_q, n_w, 2) int32.
// Backward: per query, an integer counter per candidate (+1 as k*, -1 as j* of each
// active window, in window order), then grad = count * grad_loss / n_w: every gradient
// entry is written once, no atomics. OpenMP over queries (for large enough problems);
// deterministic.
#include "fastrank/kendall_sw.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace fastrank {
namespace cpu {
namespace {

template <typename T>
void forward_impl(const T* sim, int64_t sim_sq, int64_t sim_sc, const T* rel, int64_t rel_sq,
                  int64_t rel_sc, int64_t n_q, int64_t n_c, const T* upper, const T* lower, int64_t n_w,
                  T* loss, int32_t* idx) {
  const T inf = std::numeric_limits<T>::infinity();
  // small problems run on the calling thread: a parallel region costs more than it saves
  const bool parallel = n_q > 1 && n_q * (n_c + n_w) >= (int64_t(1) << 15);
#pragma omp parallel if (parallel)
  {
    std::vector<T> s_buf(n_c), r_buf(n_c), ps(n_w + 1), ns(n_w + 1);
    std::vector<int32_t> p_cnt(n_c), n_cnt(n_c), pi(n_w + 1), ni(n_w + 1);
#pragma omp for schedule(static)
    for (int64_t q = 0; q < n_q; ++q) {
      T* __restrict s = s_buf.data();
      T* __restrict r = r_buf.data();
      int32_t* __restrict pc = p_cnt.data();
      int32_t* __restrict nc = n_cnt.data();
      gather_row(sim + q * sim_sq, sim_sc, n_c, s);
      gather_row(rel + q * rel_sq, rel_sc, n_c, r);
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
      std::fill(ps.begin(), ps.end(), inf);
      std::fill(ns.begin(), ns.end(), -inf);
      std::fill(pi.begin(), pi.end(), -1);
      std::fill(ni.begin(), ni.end(), -1);
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
      int32_t* out = idx + q * n_w * 2;
      for (int64_t m = 0; m < n_w; ++m) {
        const int32_t j = pi[m], k = ni[m + 1];
        out[2 * m] = j;
        out[2 * m + 1] = k;
        if (j >= 0 && k >= 0) total += std::max(ns[m + 1] - ps[m], T(0));
      }
      loss[q] = total / static_cast<T>(n_w);
    }
  }
}

template <typename T>
void backward_impl(const T* sim, int64_t sim_sq, int64_t sim_sc, int64_t n_q, int64_t n_c,
                   const int32_t* idx, int64_t n_w, const T* grad_loss, T* grad_sim) {
  const bool parallel = n_q > 1 && n_q * (n_c + n_w) >= (int64_t(1) << 17);
#pragma omp parallel if (parallel)
  {
    std::vector<int32_t> count(n_c);
#pragma omp for schedule(static)
    for (int64_t q = 0; q < n_q; ++q) {
      const T* s = sim + q * sim_sq;
      const int32_t* w = idx + q * n_w * 2;
      std::fill(count.begin(), count.end(), 0);
      for (int64_t m = 0; m < n_w; ++m) {
        const int32_t j = w[2 * m], k = w[2 * m + 1];
        if (j >= 0 && k >= 0 && s[k * sim_sc] > s[j * sim_sc]) { ++count[k]; --count[j]; }
      }
      const T coef = grad_loss[q] / static_cast<T>(n_w);
      T* out = grad_sim + q * n_c;
      for (int64_t c = 0; c < n_c; ++c) out[c] = static_cast<T>(count[c]) * coef;
    }
  }
}

}  // namespace

void kendall_sw_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                        int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, const void* upper,
                        const void* lower, int64_t n_w, void* loss, int32_t* idx) {
  FASTRANK_DISPATCH_CPU(dt, T,
      forward_impl<T>(static_cast<const T*>(sim), sim_sq, sim_sc, static_cast<const T*>(rel), rel_sq,
                      rel_sc, n_q, n_c, static_cast<const T*>(upper), static_cast<const T*>(lower), n_w,
                      static_cast<T*>(loss), idx));
}

void kendall_sw_backward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, int64_t n_q,
                         int64_t n_c, const int32_t* idx, int64_t n_w, const void* grad_loss,
                         void* grad_sim) {
  FASTRANK_DISPATCH_CPU(dt, T,
      backward_impl<T>(static_cast<const T*>(sim), sim_sq, sim_sc, n_q, n_c, idx, n_w,
                       static_cast<const T*>(grad_loss), static_cast<T*>(grad_sim)));
}

}  // namespace cpu
}  // namespace fastrank
