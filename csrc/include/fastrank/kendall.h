// Kendall ranking loss kernels (SPEC.md 2.2; paper 001, Eq. 17): entry points.
//
// Each query is one row of a strided (n_q, n_c) matrix: element (q, c) of `sim` is
// sim[q * sim_sq + c * sim_sc] (strides in elements), so the t2i direction is the same
// kernel over the transposed strides. `rel`, `loss` and `dsim` are in the accumulation
// type (float, or double for float64 inputs); `dsim` is written contiguous (n_q, n_c).
//
//   forward: with a = alpha, pairs (j, k) of the row with r_j > r_k + a ("active"),
//     cnt[q]  = #{active (j, k)}
//     loss[q] = sum_{active (j, k)} [s_k - s_j]+ / max(1, cnt[q])
//     dsim[q, m] = d loss[q] / d s_m
//                = ( #{active (j, m): s_m > s_j} - #{active (m, k): s_k > s_m} ) / max(1, cnt[q])
//   (subgradient 0 at s_k == s_j, like torch.relu). The gradient is computed in the same
//   pass as the loss and saved: the backward is grad_sim = grad_loss[:, None] * dsim.
//
// `r_j > r_k + a` is evaluated exactly as the reference does: r_k + a rounded to the
// accumulation type (a itself rounded to it first), then compared.
#pragma once
#include <cstdint>

#include "fastrank/common.h"

namespace fastrank {
namespace cpu {
void kendall_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                     int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, double alpha, void* loss,
                     void* dsim);
}  // namespace cpu

namespace cuda {
// Returns a cudaError_t as int (0 = success); `stream` is a cudaStream_t.
int kendall_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                    int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, double alpha, void* loss,
                    void* dsim, void* stream);
}  // namespace cuda
}  // namespace fastrank
