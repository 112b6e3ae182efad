// Kendall loss with sliding-window sampling and hard-sample mining, SW-HS
// (docs/spec.md §2.3; BCLS, Eq. 18-20): entry points.
//
// One forward call computes every requested direction (i2t over the rows, t2i over the
// columns through swapped strides) and the reduction, like kendall.h (same query slabs,
// same aux layout and reduction codes). `rel_dt` is rel's dtype: sim's, or the
// accumulation type A.
//
// Windows m = 0 .. n_w - 1 (n_w = round((hi - lo - alpha) / beta), from Python), edges
// computed by the kernels in double, exactly as Python computes them, then rounded once
// to A (the same values the reference compares against):
//   u_m = hi - m * beta   (the product rounded, then the difference: no FMA)
//   l_m = u_m - alpha
//   positives P_m = {j : r_j >= u_m},  negatives N_m = {k : r_k < l_m}
//   j*_m = argmin_{P_m} s_j, k*_m = argmax_{N_m} s_k   (ties: the lowest index)
//   qloss[q] = (1 / n_w) * sum_m [s_{k*} - s_{j*}]+ (+ poison: NaN/inf read -> NaN)
// forward writes loss, idx (n_total, n_w, 2) int32 = (j*, k*) per query and window
// (-1 where the set is empty) and aux = [qloss(n_total), qvalid(n_total) = 1, coef(2)].
// backward writes grad (n, m) contiguous in sim's dtype:
//   grad[i, j] = sum over directions of w_q / n_w * (#{m active: k*_m = c} - #{m active: j*_m = c})
//                + 0 * qloss[q]   (NaN propagation),
//   w_q = grad_out[q] (none) or grad_out[0] * coef[d]; a window is active when both
//   indices exist and s_{k*} > s_{j*} (subgradient 0 at ==).
#pragma once
#include <cstdint>

#include "fastrank/common.h"

namespace fastrank {
namespace cpu {
void kendall_sw_forward(DType dt, DType rel_dt, const void* sim, int64_t sim_s0, int64_t sim_s1, const void* rel,
                        int64_t rel_s0, int64_t rel_s1, int64_t n, int64_t m, double alpha, double beta, double hi,
                        int64_t n_w, int direction, int reduction, void* loss, int32_t* idx, void* aux);
void kendall_sw_backward(DType dt, const void* sim, int64_t sim_s0, int64_t sim_s1, const int32_t* idx, int64_t n_w,
                         const void* aux, const void* grad_out, int64_t n, int64_t m, int direction, int reduction,
                         void* grad);
}  // namespace cpu

namespace cuda {
// Return a cudaError_t as int (0 = success); `stream` is a cudaStream_t.
int kendall_sw_forward(DType dt, DType rel_dt, const void* sim, int64_t sim_s0, int64_t sim_s1, const void* rel,
                       int64_t rel_s0, int64_t rel_s1, int64_t n, int64_t m, double alpha, double beta, double hi,
                       int64_t n_w, int direction, int reduction, void* loss, int32_t* idx, void* aux,
                       void* stream);
int kendall_sw_backward(DType dt, const void* sim, int64_t sim_s0, int64_t sim_s1, const int32_t* idx, int64_t n_w,
                        const void* aux, const void* grad_out, int64_t n, int64_t m, int direction, int reduction,
                        void* grad, void* stream);
}  // namespace cuda
}  // namespace fastrank
