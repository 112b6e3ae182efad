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
#include "fastrank/params.h"

namespace fastrank {
// The forward's and the backward's parameters (the CPU takes relevance in sim's dtype only;
// CUDA adds the stream). idx: (n_total, n_w, 2) int32; aux: kendall_aux_numel elements
// (kendall.h's layout).
struct KendallSwForward {
  Lists lists;
  DType rel_dt;
  MatIn sim, rel;
  double alpha, beta, hi;
  int64_t n_w;
  void* loss;
  int32_t* idx;
  void* aux;
};
FASTRANK_FIELDS(KendallSwForward, lists, rel_dt, sim, rel, alpha, beta, hi, n_w, loss, idx, aux)
struct KendallSwBackward {
  Lists lists;
  MatIn sim;
  const int32_t* idx;
  int64_t n_w;
  const void* aux;
  const void* grad_out;  // contiguous, accumulation type
  void* grad;
};
FASTRANK_FIELDS(KendallSwBackward, lists, sim, idx, n_w, aux, grad_out, grad)

namespace cpu {
void kendall_sw_forward(const KendallSwForward& p);
void kendall_sw_backward(const KendallSwBackward& p);
}  // namespace cpu

namespace cuda {
using KendallSwForward = OnStream<::fastrank::KendallSwForward>;
using KendallSwBackward = OnStream<::fastrank::KendallSwBackward>;
int kendall_sw_forward(const KendallSwForward& p);
int kendall_sw_backward(const KendallSwBackward& p);
}  // namespace cuda
}  // namespace fastrank
