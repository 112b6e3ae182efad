// Smooth-AP kernels (docs/spec.md §2.8; Brown et al., ECCV 2020): entry points, a head of the
// smooth-rank engine (params.h: its workspace; csrc/cpu/smooth_rank.h, csrc/cuda/smooth_rank.cuh).
//
// sim, positives and mask are strided (n, m) matrices (strides in elements); the i2t queries
// are the rows, the t2i queries the columns (swapped strides). positives and mask are bool
// matrices read as bytes; mask may be null (every item in the list). Per query, with its list
// L (the valid items) and positives P in L (the rows of the engine):
//   R_all(j) = 1 + sum_{k in L, k != j} sigma((s_k - s_j) / tau)
//   R_pos(j) = 1 + sum_{k in P, k != j} sigma((s_k - s_j) / tau)       for j in P
//   loss     = 1 - (1 / |P|) sum_{j in P} R_pos(j) / R_all(j); 0 when P is empty
// Pair work O(|P| * |L|) per query. "mean" = the sum over directions of the mean over the
// queries with a positive (0 if none), "sum", or the per-query losses (none; i2t first).
// Workspace ws (params.h, SmoothRankLayout): w_d = G_d, the per-query gradient d loss_q / d sim in the
// (n, m) layout, complete (the backward multiplies it by the upstream weight only).
// A non-finite score poisons its query's loss and its own gradient entry.
#pragma once
#include <cstdint>

#include "fastrank/common.h"
#include "fastrank/params.h"

namespace fastrank {
// One struct per entry point for both backends (CUDA: OnStream, the stream last).
// A subset head's forward (Smooth-AP; Recall@k adds its ks): with_grad = false skips G.
// `version`: the CUDA forward's (1: a block a query; 2, the default: a warp a query; the CPU
// has one). `partials`: CUDA's scratch, smooth_rank_partials_numel(n, m, direction)
// accumulation-type elements (the ranks and coefficients of the positives; the CPU: 0).
struct SmoothApForward {
  Lists lists;
  int version;
  MatIn sim;
  MaskIn pos, mask;
  double tau;
  bool with_grad;
  void* out;
  void* ws;
  void* partials;
};
FASTRANK_FIELDS(SmoothApForward, lists, version, sim, pos, mask, tau, with_grad, out, ws, partials)
// Shared by Smooth-AP and Recall@k: grad = sum over directions of w_q * G_d (masked: 0; CUDA
// reads no mask: masked entries of G are 0).
struct SmoothRankBackward {
  Lists lists;
  MaskIn mask;
  VecIn grad_out;  // accumulation type
  const void* ws;
  void* grad;
};
FASTRANK_FIELDS(SmoothRankBackward, lists, mask, grad_out, ws, grad)

namespace cpu {
void smooth_ap_forward(const SmoothApForward& p);
void smooth_rank_backward(const SmoothRankBackward& p);
}  // namespace cpu

namespace cuda {
// The subset heads' forward scratch, `partials` (smooth_rank.cuh): four (n, m) arrays per direction (the positives' ranks and coefficients), then, when t2i
// is requested, the column lists transposed, so that a column query reads its list
// contiguously: sim^T (m, n) in sim's element type (within n * m accumulation-type
// elements), then positives^T and mask^T, (m, n) bytes each (counted in 4-byte elements,
// the smallest accumulation type).
FR_HD int64_t smooth_rank_transposed_offset(int64_t n, int64_t m, int direction) {
  return 4 * (int64_t((direction & kI2T) != 0) + int64_t((direction & kT2I) != 0)) * n * m;
}

inline int64_t smooth_rank_partials_numel(int64_t n, int64_t m, int direction) {
  const int64_t nm = n * m;
  return smooth_rank_transposed_offset(n, m, direction) + ((direction & kT2I) ? nm + (2 * nm + 3) / 4 : 0);
}

// Entry points return a cudaError_t as int (0 = success); `stream` is a cudaStream_t.
using SmoothApForward = OnStream<::fastrank::SmoothApForward>;
using SmoothRankBackward = OnStream<::fastrank::SmoothRankBackward>;
int smooth_ap_forward(const SmoothApForward& p);
int smooth_rank_backward(const SmoothRankBackward& p);
}  // namespace cuda
}  // namespace fastrank
