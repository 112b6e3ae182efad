// Smooth-NDCG kernels (SPEC.md 2.1; paper 000, Eq. 16-21): entry points.
//
// Each query is one row of a strided (n_q, n_c) matrix: element (q, c) of `sim` is
// sim[q * sim_sq + c * sim_sc] (strides in elements), so the t2i direction is the same
// kernel over the transposed strides. `rel`, `idcg`, `loss`, `pi`, `grad_loss` are in
// the accumulation type (float, or double for float64 inputs); `grad_sim` is written
// contiguous (n_q, n_c) in the input dtype.
//
//   forward : pi[q, j] = 1 + sum_{k != j} sigma((s_k - s_j) / tau)
//             loss[q]  = 1 - sum_j (2^r_j - 1) / log2(1 + pi[q, j]) / idcg[q]   (0 if idcg[q] <= 0)
//   backward: grad_sim[q, m] = grad_loss[q] * d loss[q] / d s_m
//           = -grad_loss[q] / (tau * idcg[q]) * sum_{k != m} sigma'((s_k - s_m) / tau) (a_k - a_m),
//             a_j = (2^r_j - 1) * d/dpi [1 / log2(1 + pi)] at pi[q, j].
#pragma once
#include <cstdint>

#include "fastrank/common.h"

namespace fastrank {
namespace cpu {
void smooth_ndcg_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc,
                         const void* rel, int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c,
                         const void* idcg, double tau, void* loss, void* pi);
void smooth_ndcg_backward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc,
                          const void* rel, int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c,
                          const void* idcg, const void* pi, const void* grad_loss, double tau,
                          void* grad_sim);
}  // namespace cpu

namespace cuda {
// Return a cudaError_t as int (0 = success); `stream` is a cudaStream_t.
int smooth_ndcg_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc,
                        const void* rel, int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c,
                        const void* idcg, double tau, void* loss, void* pi, void* stream);
int smooth_ndcg_backward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc,
                         const void* rel, int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c,
                         const void* idcg, const void* pi, const void* grad_loss, double tau,
                         void* grad_sim, void* stream);
}  // namespace cuda
}  // namespace fastrank
