// Smooth-NDCG kernels (SPEC.md 2.1 and 2.1a; paper 000, Eq. 16-21): entry points.
//
// One call computes every requested direction and the reduction (issue 11).
// sim, rel and mask are strided (n, m) matrices: element (i, j) of sim is
// sim[i * ss0 + j * ss1] (strides in elements). The i2t queries are the n rows, the t2i
// queries the m columns: the same code over the swapped strides, never a transposed copy.
// rel is in sim's storage type. mask (uint8 0/1, may be null = every item valid):
// a masked entry takes part in no rank, gain, pair or IDCG, and its gradient is 0.
// `direction` and `reduction` are the codes of common.h (Direction, Reduction).
//
// For the list of query q (its valid items j, s_j = sim, g_j = 2^r_j - 1):
//   pi_j  = 1 + sum_{k != j} sigma((s_k - s_j) / tau)            (Eq. 16)
//   DCG   = sum_j g_j / log2(1 + pi_j)                            (Eq. 17)
//   IDCG  = sum_p g_(p) / log2(1 + p), gains sorted descending    (computed in the kernel)
//   loss  = 1 - DCG / IDCG, 0 when IDCG <= 0 (no valid item, or all gains 0)
// Per-query losses go i2t first (n), then t2i (m), only the requested directions
// (Q = their count). `out` is (Q,) for reduction none, else one value: "mean" = the sum
// over directions of the mean over lists with >= 1 valid item (0 if none), "sum" = sum.
//
// Workspace `ws` (accumulation type A: float, double for float64), smooth_ndcg_ws_numel:
//   [a_i2t (n*m) if i2t][a_t2i (n*m) if t2i][idcg (Q)][qloss (Q)][count_i2t, count_t2i]
// a_d[i * m + j] = g * d/dpi [1 / log2(1 + pi)] at pi of (i, j) in direction d (0 if
// masked), plus poison(s + r) = (s + r) - (s + r) so that a non-finite input poisons the gradient. The
// backward needs only sim, mask and ws:
//   d loss_q / d s_m = -(1 / (tau * IDCG_q)) sum_{k != m} sigma'((s_k - s_m) / tau) (a_k - a_m)
// scaled by grad_out (strided by `gs`; reduction none: one per query, else grad_out[0]
// times 1/count_d for mean). grad is written contiguous (n, m) in sim's storage type.
#pragma once
#include <cstdint>

#include "fastrank/common.h"

namespace fastrank {

inline int64_t smooth_ndcg_ws_numel(int64_t n, int64_t m, int direction) {
  const int64_t d1 = direction & kI2T ? 1 : 0, d2 = direction & kT2I ? 1 : 0;
  const int64_t q = d1 * n + d2 * m;
  return (d1 + d2) * n * m + 2 * q + 2;
}

namespace cpu {
void smooth_ndcg_forward(DType dt, const void* sim, int64_t ss0, int64_t ss1, const void* rel,
                         int64_t rs0, int64_t rs1, const uint8_t* mask, int64_t ms0, int64_t ms1,
                         int64_t n, int64_t m, int direction, int reduction, double tau, void* out,
                         void* ws);
void smooth_ndcg_backward(DType dt, const void* sim, int64_t ss0, int64_t ss1, const uint8_t* mask,
                          int64_t ms0, int64_t ms1, int64_t n, int64_t m, int direction,
                          int reduction, double tau, const void* grad_out, int64_t gs,
                          const void* ws, void* grad);
}  // namespace cpu

namespace cuda {
// `partials`: per-tile partial sums of the forward (A elements, freed after it):
// 3 * (n * ceil(m / 16) if i2t + m * ceil(n / 16) if t2i); see smooth_ndcg.cu.
// Return a cudaError_t as int (0 = success); `stream` is a cudaStream_t.
int smooth_ndcg_forward(DType dt, const void* sim, int64_t ss0, int64_t ss1, const void* rel,
                        int64_t rs0, int64_t rs1, const uint8_t* mask, int64_t ms0, int64_t ms1,
                        int64_t n, int64_t m, int direction, int reduction, double tau, void* out,
                        void* ws, void* partials, void* stream);
int smooth_ndcg_backward(DType dt, const void* sim, int64_t ss0, int64_t ss1, const uint8_t* mask,
                         int64_t ms0, int64_t ms1, int64_t n, int64_t m, int direction,
                         int reduction, double tau, const void* grad_out, int64_t gs,
                         const void* ws, void* grad, void* stream);
}  // namespace cuda
}  // namespace fastrank
