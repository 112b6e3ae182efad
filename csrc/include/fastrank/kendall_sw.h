// Kendall loss with sliding-window sampling and hard-sample mining, SW-HS
// (SPEC.md 2.3; paper 001, Eq. 18-20): entry points.
//
// Each query is one row of a strided (n_q, n_c) matrix (strides in elements; t2i is the
// same kernel over transposed strides). `rel`, `upper`, `lower`, `loss` and `grad_loss`
// are in the accumulation type (float, or double for float64 inputs).
//
// Windows m = 0 .. n_w - 1 have edges upper[m] (u) and lower[m] (l): non-increasing
// arrays, computed in float64 by Python and rounded once to the accumulation type, the
// same values the reference compares against.
//   positives P_m = {j : r_j >= u_m},  negatives N_m = {k : r_k < l_m}
//   j*_m = argmin_{P_m} s_j, k*_m = argmax_{N_m} s_k   (ties: the lowest index)
//   loss[q] = (1 / n_w) * sum_m [s_{k*} - s_{j*}]+   (an empty P_m or N_m adds 0)
// forward writes loss (n_q) and idx (n_q, n_w, 2) int32: idx[q, m] = (j*, k*), -1 where
// the set is empty. backward writes grad_sim (n_q, n_c) contiguous, in the input dtype:
//   grad_sim[q, c] = grad_loss[q] / n_w * ( #{m active: k*_m = c} - #{m active: j*_m = c} ),
//   a window is active when both indices exist and s_{k*} > s_{j*} (subgradient 0 at ==).
#pragma once
#include <cstdint>

#include "fastrank/common.h"

namespace fastrank {
namespace cpu {
void kendall_sw_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                        int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, const void* upper,
                        const void* lower, int64_t n_w, void* loss, int32_t* idx);
void kendall_sw_backward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, int64_t n_q,
                         int64_t n_c, const int32_t* idx, int64_t n_w, const void* grad_loss,
                         void* grad_sim);
}  // namespace cpu

namespace cuda {
// Return a cudaError_t as int (0 = success); `stream` is a cudaStream_t.
int kendall_sw_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                       int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, const void* upper,
                       const void* lower, int64_t n_w, void* loss, int32_t* idx, void* stream);
int kendall_sw_backward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, int64_t n_q,
                        int64_t n_c, const int32_t* idx, int64_t n_w, const void* grad_loss,
                        void* grad_sim, void* stream);
}  // namespace cuda
}  // namespace fastrank
