// Fused smooth-NDCG on the CPU (SPEC.md 2.1; paper 000, Eq. 16-21).
//
// Work: O(n_q * n_c^2) per pass, forward = 1 pass, backward = 1 pass.
// Memory plan: O(n_c) scratch per thread (the query's row of sim copied contiguous,
// whatever the strides, plus one accumulator row); outputs pi (n_q, n_c) and loss (n_q).
// Never an (n_q, n_c, n_c) tensor.
// Parallelism: OpenMP over queries (one query per thread at a time, so sums are in a
// fixed order and results are bit-identical run to run). The inner loop visits each
// unordered pair (j, k > j) once; one exp gives sigma(x) for j and sigma(-x) for k, and
// `#pragma omp simd` vectorises it (the float exp in common.h is plain arithmetic).
#include "fastrank/smooth_ndcg.h"

#include <algorithm>
#include <vector>

namespace fastrank {
namespace cpu {
namespace {

// The pair loops run over whole vectors: rows are padded to a multiple of kLanes with
// finite zeros, each inner loop starts at the vector boundary below k = j + 1, and a
// 0/1 mask drops the pairs with k <= j or k >= n_c. Without this, the scalar remainder
// of the triangular loop dominates at n_c ~ 100 (2-3x slower at 128).
constexpr int64_t kLanes = 16;
constexpr int64_t kParallelWork = int64_t(1) << 18;  // below: one thread (no fork/join)
inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }
inline int64_t aligned_start(int64_t k) { return k / kLanes * kLanes; }
template <typename T> inline T pair_mask(int64_t k, int64_t j, int64_t n) {
  return static_cast<T>((k > j) & (k < n));
}

template <typename T>
void forward_impl(const T* sim, int64_t sim_sq, int64_t sim_sc, const T* rel, int64_t rel_sq,
                  int64_t rel_sc, int64_t n_q, int64_t n_c, const T* idcg, T tau, T* loss, T* pi) {
  const T inv_tau = T(1) / tau;
  const int64_t n_pad = padded(n_c);
#pragma omp parallel if (n_q * n_c * n_c >= kParallelWork)
  {
    std::vector<T> s_buf(n_pad, T(0)), p_buf(n_pad);
#pragma omp for schedule(dynamic, 1)
    for (int64_t q = 0; q < n_q; ++q) {
      T* __restrict s = s_buf.data();
      T* __restrict p = p_buf.data();
      gather_row(sim + q * sim_sq, sim_sc, n_c, s);
      std::fill(p, p + n_pad, T(1));
      // Eq. 16: pi_j = 1 + sum_{k != j} sigma((s_k - s_j) / tau), pairs (j, k > j)
      for (int64_t j = 0; j < n_c; ++j) {
        const T sj = s[j];
        T acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t k = aligned_start(j + 1); k < n_pad; ++k) {
          const T keep = pair_mask<T>(k, j, n_c);
          const T x = (s[k] - sj) * inv_tau;
          acc += keep * logistic_pos(x);   // sigma((s_k - s_j) / tau) -> pi_j
          p[k] += keep * logistic_neg(x);  // sigma((s_j - s_k) / tau) -> pi_k
        }
        p[j] += acc;
      }
      // Eq. 17-18, 20: loss = 1 - DCG / IDCG
      T dcg = 0;
      const T* r = rel + q * rel_sq;
      for (int64_t j = 0; j < n_c; ++j) dcg += ndcg_gain(r[j * rel_sc]) * ndcg_discount(p[j]);
      loss[q] = idcg[q] > T(0) ? T(1) - dcg / idcg[q] : T(0);
      std::copy(p, p + n_c, pi + q * n_c);
    }
  }
}

template <typename T>
void backward_impl(const T* sim, int64_t sim_sq, int64_t sim_sc, const T* rel, int64_t rel_sq,
                   int64_t rel_sc, int64_t n_q, int64_t n_c, const T* idcg, const T* pi,
                   const T* grad_loss, T tau, T* grad_sim) {
  const T inv_tau = T(1) / tau;
  const int64_t n_pad = padded(n_c);
#pragma omp parallel if (n_q * n_c * n_c >= kParallelWork)
  {
    std::vector<T> s_buf(n_pad, T(0)), a_buf(n_pad, T(0)), g_buf(n_pad);
#pragma omp for schedule(dynamic, 1)
    for (int64_t q = 0; q < n_q; ++q) {
      T* out = grad_sim + q * n_c;
      if (!(idcg[q] > T(0)) || grad_loss[q] == T(0)) {  // loss is constant 0 for this query
        std::fill(out, out + n_c, T(0));
        continue;
      }
      T* __restrict s = s_buf.data();
      T* __restrict a = a_buf.data();
      T* __restrict g = g_buf.data();
      gather_row(sim + q * sim_sq, sim_sc, n_c, s);
      const T* r = rel + q * rel_sq;
      const T* pq = pi + q * n_c;
      for (int64_t j = 0; j < n_c; ++j) a[j] = ndcg_gain(r[j * rel_sc]) * ndcg_discount_deriv(pq[j]);
      std::fill(g, g + n_pad, T(0));
      // d DCG / d s_m = (1/tau) sum_{k != m} sigma'((s_k - s_m) / tau) (a_k - a_m); pairs (m, k > m)
      for (int64_t m = 0; m < n_c; ++m) {
        const T sm = s[m], am = a[m];
        T acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t k = aligned_start(m + 1); k < n_pad; ++k) {
          const T t = pair_mask<T>(k, m, n_c) * logistic_deriv((s[k] - sm) * inv_tau) * (a[k] - am);
          acc += t;
          g[k] -= t;
        }
        g[m] += acc;
      }
      const T coef = -grad_loss[q] * inv_tau / idcg[q];
      for (int64_t j = 0; j < n_c; ++j) out[j] = coef * g[j];
    }
  }
}

}  // namespace

void smooth_ndcg_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc,
                         const void* rel, int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c,
                         const void* idcg, double tau, void* loss, void* pi) {
  FASTRANK_DISPATCH_CPU(dt, T,
      forward_impl<T>(static_cast<const T*>(sim), sim_sq, sim_sc, static_cast<const T*>(rel), rel_sq,
                      rel_sc, n_q, n_c, static_cast<const T*>(idcg), static_cast<T>(tau),
                      static_cast<T*>(loss), static_cast<T*>(pi)));
}

void smooth_ndcg_backward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc,
                          const void* rel, int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c,
                          const void* idcg, const void* pi, const void* grad_loss, double tau,
                          void* grad_sim) {
  FASTRANK_DISPATCH_CPU(dt, T,
      backward_impl<T>(static_cast<const T*>(sim), sim_sq, sim_sc, static_cast<const T*>(rel), rel_sq,
                       rel_sc, n_q, n_c, static_cast<const T*>(idcg), static_cast<const T*>(pi),
                       static_cast<const T*>(grad_loss), static_cast<T>(tau),
                       static_cast<T*>(grad_sim)));
}

}  // namespace cpu
}  // namespace fastrank
