// Fast re-ranking kernels (docs/spec.md §3; DVSE, Eq. 13-15): entry points.
//
// sim is a strided (n, m) matrix: element (i, j) is sim[i * sim_sr + j * sim_sc] (strides
// in elements: contiguous, transposed, sliced or expanded all work). With
// (g1, g2) = gamma and (l1, l2) = lam, all > 0:
//
//   col_lse[j]   = log sum_l exp(g1 * sim[l, j])          (over the n rows)
//   row_lse[i]   = log sum_l exp(l1 * sim[i, l])          (over the m columns)
//   i2t[i, j]    = g2 * sim[i, j] - col_lse[j]            (Eq. 14-15, softmax0, log space)
//   t2i[i, j]    = l2 * sim[i, j] - row_lse[i]            (Eq. 15, softmax1, log space)
//
// Backward, with G1 = dL/d i2t, G2 = dL/d t2i, P = exp(g1 * sim - col_lse[j]) (each column
// sums to 1) and Q = exp(l1 * sim - row_lse[i]) (each row sums to 1):
//
//   grad_sim[i, j] = g2 * G1[i, j] - g1 * P[i, j] * sum_l G1[l, j]
//                  + l2 * G2[i, j] - l1 * Q[i, j] * sum_l G2[i, l]
//
// G1 / G2 are strided like sim and may be null (a zero gradient). i2t, t2i and grad_sim are
// written contiguous (n, m) in the input dtype; col_lse (m) and row_lse (n) are in the
// accumulation type (float, or double for float64 inputs). `workspace` holds
// fast_rerank_workspace(n, m) accumulation-type elements of partial statistics over a
// fixed grid of bands: O(n + m) (at most 16 (n + m) on the CPU, 256 (n + m) on CUDA),
// never an (n, m) matrix. Peak memory of a forward: the two outputs + O(n + m). On the CPU
// workspace may be null: the kernel then allocates it for the call.
//
// Non-finite sim (docs/spec.md §1): the kernels propagate NaN/inf (max_nan in every max
// reduction, poison(sim) added to every gradient element), so a NaN or +-inf in sim gives
// non-finite statistics, scores and gradient. The CPU lse/forward also return whether all
// statistics are finite (the caller's raising check, with no second read of sim); the
// CUDA entries are asynchronous and leave that check to the caller (off by default).
#pragma once
#include <cstdint>

#include "fastrank/common.h"
#include "fastrank/params.h"

namespace fastrank {
// The parameters of the three entry points (the same on both backends; CUDA adds the
// stream). dt: sim's storage type; (g1, g2) = gamma, (l1, l2) = lam.
struct FastRerankLse {
  DType dt;
  int64_t n, m;
  MatIn sim;
  double g1, l1;
  void* workspace;
  void* col_lse;
  void* row_lse;
};
FASTRANK_FIELDS(FastRerankLse, dt, n, m, sim, g1, l1, workspace, col_lse, row_lse)
struct FastRerankForward {
  DType dt;
  int64_t n, m;
  MatIn sim;
  double g1, g2, l1, l2;
  void* workspace;
  void* col_lse;
  void* row_lse;
  void* i2t;
  void* t2i;
};
FASTRANK_FIELDS(FastRerankForward, dt, n, m, sim, g1, g2, l1, l2, workspace, col_lse, row_lse, i2t, t2i)
struct FastRerankBackward {
  DType dt;
  int64_t n, m;
  MatIn sim;
  MatIn g_i2t, g_t2i;  // data null: a zero gradient
  const void* col_lse;
  const void* row_lse;
  double g1, g2, l1, l2;
  void* workspace;
  void* grad;
};
FASTRANK_FIELDS(FastRerankBackward, dt, n, m, sim, g_i2t, g_t2i, col_lse, row_lse, g1, g2, l1, l2, workspace, grad)

namespace cpu {
int64_t fast_rerank_workspace(int64_t n, int64_t m);
// The statistics alone (pass 1): col_lse and row_lse. Returns true when all are finite.
bool fast_rerank_lse(const FastRerankLse& p);
// Pass 1 + pass 2: statistics, then both score matrices in one read-write sweep.
// Returns true when all statistics are finite.
bool fast_rerank_forward(const FastRerankForward& p);
void fast_rerank_backward(const FastRerankBackward& p);
}  // namespace cpu

namespace cuda {
using FastRerankLse = OnStream<::fastrank::FastRerankLse>;
using FastRerankForward = OnStream<::fastrank::FastRerankForward>;
using FastRerankBackward = OnStream<::fastrank::FastRerankBackward>;
// Return a cudaError_t as int (0 = success).
int64_t fast_rerank_workspace(int64_t n, int64_t m);
int fast_rerank_lse(const FastRerankLse& p);
int fast_rerank_forward(const FastRerankForward& p);
int fast_rerank_backward(const FastRerankBackward& p);
}  // namespace cuda
}  // namespace fastrank
