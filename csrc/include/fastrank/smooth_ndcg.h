// Smooth-NDCG kernels (docs/spec.md §2.1 and 2.1a; Listwise ITR, Eq. 16-21): entry points.
//
// One call computes every requested direction and the reduction.
// sim, rel and mask are strided (n, m) matrices: element (i, j) of sim is
// sim[i * ss0 + j * ss1] (strides in elements). The i2t queries are the n rows, the t2i
// queries the m columns: the same code over the swapped strides, never a transposed copy.
// rel: on the CPU in sim's storage type; on CUDA in sim's storage type or the accumulation
// type (`rel_dt`), so labels are never rounded to a half-precision sim's dtype.
// mask (uint8 0/1, may be null = every item valid):
// a masked entry takes part in no rank, gain, pair or IDCG, and its gradient is 0.
// `direction` and `reduction` are the codes of common.h (Direction, Reduction). Each entry
// point takes one parameter struct (params.h), its backend's own.
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
// Workspace `ws` (accumulation type A: float, double for float64): the smooth-rank engine's
// (params.h, SmoothRankLayout; smooth_rank_ws_numel elements), aux = the per-query IDCG:
//   [w_i2t (n*m) if i2t][w_t2i (n*m) if t2i][idcg (Q)][qloss (Q)][count_i2t, count_t2i]
// w_d[i * m + j] is per-element state of direction d for the backward (0 if masked):
//  - CPU: G = sum_{k != m} sigma'((s_k - s_m) / tau) (a_k - a_m), the gradient up to the
//    per-query factor; the forward runs this second pair pass while the list is in cache,
//    on the sigma' values its rank pass kept (skipped when with_grad = 0), so the
//    backward is elementwise;
//  - CUDA version 2 (the default): G scaled by the query's -1 / (tau * IDCG), complete but for
//    the upstream weight (the forward runs both pair passes; the backward is elementwise),
//    w_t2i stored transposed, (m, n), as the subset heads' (smooth_rank.cuh);
//  - CUDA version 1 (version = 1): a = g * d/dpi [1 / log2(1 + pi)]; the
//    backward runs the pair pass.
// All carry poison(s + r), so a non-finite input poisons the gradient. Then
//   d loss_q / d s_m = -(1 / (tau * IDCG_q)) sum_{k != m} sigma'((s_k - s_m) / tau) (a_k - a_m)
// scaled by grad_out (strided by `gs`; reduction none: one per query, else grad_out[0]
// times 1/count_d for mean). grad is written contiguous (n, m) in sim's storage type.
#pragma once
#include <cstdint>

#include "fastrank/common.h"
#include "fastrank/params.h"

namespace fastrank {

// One struct per entry point for both backends (CUDA: OnStream, the stream last); a field one
// backend does not read is filled all the same (0 for a pointer it ignores).
// The relevance is the matrix `rel` or, when rel_i2t.offsets is set, the lists rel_i2t (the n
// rows) and rel_t2i (the m columns; the CPU reads none: it makes them from the rows by a
// counting pass, O(nnz + m)), values in rel_dt: on the CPU sim's storage type; on CUDA
// sim's storage type or the accumulation type, so labels are never rounded to a half-precision
// sim's dtype. A list whose items are mostly of gain 0 takes the sparse pass: ranks for its
// nonzero-gain items only, each against every item, O(C * k) instead of O(C^2) (docs/spec.md
// §2.1b); `paths` chooses (kAutoPath: the cheaper; kDensePath, kSparsePath:
// forced, for the tests and benchmarks). `version`: the CUDA kernels' version (1 or 2, below;
// the CPU has one). with_grad = false: the forward skips the gradient pass (CUDA version 1
// ignores it). `partials`: CUDA's scratch, smooth_ndcg_partials_numel accumulation-type
// elements (the CPU reads none: 0).
struct SmoothNdcgForward {
  Lists lists;
  DType rel_dt;
  MatIn sim, rel;
  MaskIn mask;
  ListsIn rel_i2t, rel_t2i;
  int version, paths;
  double tau;
  bool with_grad;
  void* out;
  void* ws;
  void* partials;
};
FASTRANK_FIELDS(SmoothNdcgForward, lists, rel_dt, sim, rel, mask, rel_i2t, rel_t2i, version, paths, tau, with_grad,
                out, ws, partials)
// sim: read by CUDA version 1's backward only (its pair pass); the others are elementwise over ws.
struct SmoothNdcgBackward {
  Lists lists;
  int version;
  MatIn sim;
  MaskIn mask;
  double tau;
  VecIn grad_out;  // accumulation type
  const void* ws;
  void* grad;
};
FASTRANK_FIELDS(SmoothNdcgBackward, lists, version, sim, mask, tau, grad_out, ws, grad)

namespace cpu {
// The forward keeps G in ws while each list is in cache (with_grad = false: it skips that
// pass); the backward is then elementwise over ws and never reads sim.
void smooth_ndcg_forward(const SmoothNdcgForward& p);
void smooth_ndcg_backward(const SmoothNdcgBackward& p);
}  // namespace cpu

namespace cuda {
// Two kernel versions (the struct's `version`, chosen in Python: fastrank.kernel_variant), one
// workspace size:
//  - version 2 (smooth_ndcg.cu, the default): a block a list; the forward runs both pair
//    passes (with_grad; the rank pass alone without) and leaves w_d = G_d complete but for
//    the upstream weight, w_t2i transposed (m, n) as the subset heads' (smooth_rank.cuh); the
//    backward is the smooth-rank engine's elementwise one. `partials`: the list flags (Q),
//    then a scratch of 4 (span + 32) values for each block of a direction's launch. The
//    relevance is the matrix `rel` or, when rel_i2t.offsets is set, the lists rel_i2t (the n
//    rows) and rel_t2i (the m columns), values in rel_dt (docs/spec.md §2.1b): the (n, m)
//    matrix is never made. Each list takes the dense pass (every pair) or the sparse one (its
//    items of nonzero gain against every item, O(C k)), the cheaper (takes_sparse_pass, common.h)
//    unless `paths` forces one (kDensePath, kSparsePath);
//  - version 1 (smooth_ndcg_v1.cu): thread-per-element tiles; the forward writes a, the
//    backward runs the pair pass over sim; `partials`: per-tile partial sums. It reads the
//    relevance matrix only (given lists it returns cudaErrorNotSupported) and the dense pass.
// `partials` has smooth_ndcg_partials_numel accumulation-type elements (the larger need of
// the two), freed after the forward. `stream`: a cudaStream_t. The entry points return a
// cudaError_t as int (0 = success).
using SmoothNdcgForward = OnStream<::fastrank::SmoothNdcgForward>;
using SmoothNdcgBackward = OnStream<::fastrank::SmoothNdcgBackward>;
constexpr int kSmoothNdcgTile = 16;  // version 1: element tile edge (smooth_ndcg_v1.cu)
constexpr int64_t kSmoothNdcgListBlocks = 1024;  // version 2: the most blocks of a direction's launch
constexpr int kSmoothNdcgRows = 4;   // version 2, sparse pass: the nonzero-gain items a block ranks at once
constexpr int kSmoothNdcgThreads = 256;  // version 2: a block's threads
// version 2: a list's scratch span, its length rounded up to a power of two >= 32
FR_HD int64_t smooth_ndcg_list_span(int64_t len) {
  int64_t s = 32;
  while (s < len) s <<= 1;
  return s;
}
// version 2: the blocks of one direction's launch over `lists` lists, one list at a time each
inline int64_t smooth_ndcg_list_blocks(int64_t lists) {
  return lists < kSmoothNdcgListBlocks ? lists : kSmoothNdcgListBlocks;
}
// version 2: the scratch of one direction's launch (4 (span + 32) values a block), lists of `len`
inline int64_t smooth_ndcg_list_scratch(int64_t lists, int64_t len) {
  return smooth_ndcg_list_blocks(lists) * 4 * (smooth_ndcg_list_span(len) + 32);
}
// version 1: 3 values per query per tile of its list, 3 * (n * ceil(m / 16) if i2t + m * ceil(n / 16)
// if t2i); version 2: Q list flags + the larger direction's scratch (the two launches reuse it);
// the larger of the two versions' needs.
inline int64_t smooth_ndcg_partials_numel(int64_t n, int64_t m, int direction) {
  const int64_t t = kSmoothNdcgTile;
  const int64_t v1 =
      3 * (((direction & kI2T) ? n * ((m + t - 1) / t) : 0) + ((direction & kT2I) ? m * ((n + t - 1) / t) : 0));
  const int64_t s1 = (direction & kI2T) ? smooth_ndcg_list_scratch(n, m) : 0;
  const int64_t s2 = (direction & kT2I) ? smooth_ndcg_list_scratch(m, n) : 0;
  const int64_t v2 = query_count(n, m, direction) + (s1 > s2 ? s1 : s2);
  return v1 > v2 ? v1 : v2;
}
int smooth_ndcg_forward(const SmoothNdcgForward& p);
int smooth_ndcg_backward(const SmoothNdcgBackward& p);
}  // namespace cuda
}  // namespace fastrank
