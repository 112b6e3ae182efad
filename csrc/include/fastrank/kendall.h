// Kendall ranking loss kernels (docs/spec.md §2.2 and 2.1a; BCLS, Eq. 17): entry points.
//
// One forward call computes every requested direction and the reduction. sim, rel and
// mask are (n, m) strided matrices (strides in elements): the i2t queries are the rows,
// the t2i queries the columns, read through the swapped strides (no transposed copy).
// `mask` is null or a bool matrix read as bytes (1 = the entry is in the list).
// `rel_dt` is rel's dtype: the same as sim's, or the accumulation type (float / double).
// Queries: slab 0 = i2t (if direction & kI2T), then t2i; n_total = sum of their counts.
//
//   per query, on its valid entries, with a = alpha rounded to the accumulation type:
//     active (j, k): r_j > r_k + a   (r_k + a rounded to the accumulation type)
//     cnt  = #{active (j, k)}
//     loss = sum_{active} [s_k - s_j]+ / max(1, cnt)   (+ poison: NaN/inf in s or r -> NaN)
//     dsim[c] = d loss / d s_c (0 for masked entries; subgradient 0 at s_k == s_j)
//
// Outputs (all in the accumulation type A, allocated by the caller):
//   dsim (n_dir, n, m) contiguous: slab d holds d loss[q] / d sim for its direction;
//   aux  (2 * n_total + 2): qloss[n_total], qvalid[n_total] (1 if the list has a valid
//        item), coef[2] (per slab: 1 / max(1, #valid lists) for mean, 1 for sum/none);
//   loss: (n_total,) for reduction none, else one value (mean over the valid lists of
//        each direction, directions summed; or the sum).
// Backward: grad (n, m) contiguous in sim's dtype:
//   grad[i, j] = sum_d w_d * dsim[d, i, j],  w_d = grad_out[off_d + q_d(i, j)] (none) or
//   grad_out[0] * coef[d] (mean / sum); grad_out is read from device memory.
#pragma once
#include <cstdint>

#include "fastrank/common.h"
#include "fastrank/params.h"
#if defined(__CUDACC__)
#include "fastrank/launch.h"
#endif

namespace fastrank {

// aux's elements: 2 * n_total + 2.
inline int64_t kendall_aux_numel(int64_t n, int64_t m, int direction) { return 2 * query_count(n, m, direction) + 2; }

// The forward's and the backward's parameters, one struct each for both backends (CUDA:
// OnStream, the stream last; the CPU takes relevance in sim's dtype only). `partials`: CUDA's
// scratch, kendall_partials_numel accumulation-type elements (each block's gathered list, the
// row of its relevance, its nonzero items and their gradient sums; the CPU: 0).
// The relevance is the matrix `rel` or, when rel_i2t.offsets is set, the lists rel_i2t (the n
// rows) and rel_t2i (the m columns; the CPU reads none: it makes them from the rows by a
// counting pass, O(nnz + m)) in rel_dt (docs/spec.md §2.1b). Only the pairs whose
// relevance differs by more than alpha count: with alpha >= 0 a pair of two zero-relevance
// items never does, so a list with k nonzero items costs O(C * k), whatever the form of the
// relevance. The CPU sorts each list by relevance and visits the active pairs only (one pass,
// `paths` ignored); CUDA walks every pair of the list (dense) or its k nonzero items against
// every item (sparse), the cheaper (takes_sparse_pass, common.h) unless `paths` forces one.
struct KendallForward {
  Lists lists;
  DType rel_dt;
  MatIn sim, rel;
  MaskIn mask;
  ListsIn rel_i2t, rel_t2i;
  int paths;
  double alpha;
  void* loss;
  void* dsim;
  void* aux;
  void* partials;
};
FASTRANK_FIELDS(KendallForward, lists, rel_dt, sim, rel, mask, rel_i2t, rel_t2i, paths, alpha, loss, dsim, aux,
                partials)
struct KendallBackward {
  Lists lists;
  const void* dsim;
  const void* aux;
  const void* grad_out;  // contiguous, accumulation type
  void* grad;
};
FASTRANK_FIELDS(KendallBackward, lists, dsim, aux, grad_out, grad)

namespace cpu {
// The reduction of a fused loss call on the CPU, shared by kendall and kendall_sw:
// aux = [qloss(n_total), qvalid(n_total), coef(2)] with the queries of slab d at
// [offs[d], offs[d] + counts[d]). Writes coef (1 / max(1, #valid) for mean, else 1) and
// loss (the n_total per-query losses for none, else one value). Serial, in query order,
// summed in double: deterministic.
template <typename T>
inline void reduce_queries(T* aux, int64_t n_total, int n_slabs, const int64_t* offs, const int64_t* counts,
                           int reduction, T* loss) {
  const T* qloss = aux;
  const T* qvalid = aux + n_total;
  T* coef = aux + 2 * n_total;
  coef[0] = coef[1] = T(1);
  double result = 0;
  for (int d = 0; d < n_slabs; ++d) {
    double sum = 0, valid = 0;
    for (int64_t q = offs[d]; q < offs[d] + counts[d]; ++q) { sum += qloss[q]; valid += qvalid[q]; }
    if (reduction == kMean) {
      const double c = 1.0 / (valid > 1.0 ? valid : 1.0);
      coef[d] = static_cast<T>(c);
      result += sum * c;
    } else {
      result += sum;
    }
  }
  if (reduction == kNone) {
    for (int64_t q = 0; q < n_total; ++q) loss[q] = qloss[q];
  } else {
    loss[0] = static_cast<T>(result);
  }
}

void kendall_forward(const KendallForward& p);
void kendall_backward(const KendallBackward& p);
}  // namespace cpu

namespace cuda {
// Return a cudaError_t as int (0 = success); `stream` is a cudaStream_t.
using KendallForward = OnStream<::fastrank::KendallForward>;
using KendallBackward = OnStream<::fastrank::KendallBackward>;
constexpr int64_t kKendallBlocks = 1024;  // the most blocks of the forward (grid-strided over the lists)
constexpr int kKendallRows = 4;           // sparse walk: the nonzero items a block takes at once
constexpr int kKendallThreads = 256;      // the forward's block
// The forward's blocks: one a list, at most kKendallBlocks.
inline int64_t kendall_blocks(int64_t n, int64_t m, int direction) {
  const int64_t q = query_count(n, m, direction);
  return q < kKendallBlocks ? (q > 0 ? q : 1) : kKendallBlocks;
}
// The forward's scratch: 4 (C + 32) values for each block that takes a list of C items, the
// blocks that take a row (i2t, C = m) first, then those that take a column (t2i, C = n), so
// that many short lists in one direction and a few long ones in the other do not size every
// block by the longest. List qg's scratch, at kendall_scratch_at, is its block's (block b
// takes the lists qg = b (mod blocks)): no two blocks share one.
FR_HD int64_t kendall_slots(int64_t lists, int64_t blocks) { return lists < blocks ? lists : blocks; }
FR_HD int64_t kendall_scratch_at(int64_t n, int64_t m, int direction, int64_t blocks, int64_t qg) {
  const int64_t n_i2t = (direction & kI2T) ? n : 0;
  if (qg < n_i2t) return (qg % blocks) * 4 * (m + 32);
  return kendall_slots(n_i2t, blocks) * 4 * (m + 32) + ((qg - n_i2t) % blocks) * 4 * (n + 32);
}
inline int64_t kendall_partials_numel(int64_t n, int64_t m, int direction) {
  const int64_t b = kendall_blocks(n, m, direction);
  const int64_t n_i2t = (direction & kI2T) ? n : 0, n_t2i = (direction & kT2I) ? m : 0;
  return kendall_slots(n_i2t, b) * 4 * (m + 32) + kendall_slots(n_t2i, b) * 4 * (n + 32);
}
int kendall_forward(const KendallForward& p);
int kendall_backward(const KendallBackward& p);

#if defined(__CUDACC__)
// The reduction of a fused loss call on CUDA, shared by kendall and kendall_sw: one block
// (a power-of-two number of threads) after the per-query kernel. aux as for the CPU
// (qloss, qvalid, coef); slab 0 has n0 queries at 0, slab 1 n1 queries at n0 (n1 = 0 for
// one direction). Writes coef and loss[0]. Fixed summation order: deterministic.
template <typename A>
__global__ void __launch_bounds__(256) reduce_queries_kernel(A* __restrict__ aux, int64_t n_total, int64_t n0, int64_t n1, int reduction,
                                      A* __restrict__ loss) {
  __shared__ A scratch[256];
  const A* qloss = aux;
  const A* qvalid = aux + n_total;
  A* coef = aux + 2 * n_total;
  A result = 0;
  for (int d = 0; d < 2; ++d) {
    const int64_t off = d == 0 ? 0 : n0, cnt = d == 0 ? n0 : n1;
    A sum = 0, valid = 0;
    for (int64_t q = off + threadIdx.x; q < off + cnt; q += blockDim.x) { sum += qloss[q]; valid += qvalid[q]; }
    sum = block_sum(sum, scratch);
    valid = block_sum(valid, scratch);
    const A c = reduction == kMean ? A(1) / (valid > A(1) ? valid : A(1)) : A(1);
    if (threadIdx.x == 0) coef[d] = c;
    if (cnt > 0) result += reduction == kMean ? sum * c : sum;
  }
  if (threadIdx.x == 0) loss[0] = result;
}

// After a per-query kernel over n_i2t + n_t2i queries (i2t first), its reduction: nothing
// for reduction none, else reduce_queries_kernel on aux (accumulation type A) into loss.
template <typename A>
inline int reduce_queries(void* aux, int64_t n_i2t, int64_t n_t2i, int reduction, void* loss, cudaStream_t st) {
  if (reduction == kNone) return 0;
  const int64_t c0 = n_i2t > 0 ? n_i2t : n_t2i, c1 = n_i2t > 0 ? n_t2i : 0;
  return launch(reduce_queries_kernel<A>, 1, 256, 0, st, static_cast<A*>(aux), n_i2t + n_t2i, c0, c1, reduction,
                static_cast<A*>(loss));
}

// A Kendall-family forward: `kernel` over the n_i2t + n_t2i queries of p (i2t first),
// grid-strided with kThreads threads a block, taking (p, n_i2t, n_total, extra, the
// per-query losses for reduction none or null), then its reduction (reduce_queries).
template <int kThreads, typename A, typename P, typename X>
inline int launch_queries(void (*kernel)(P, int64_t, int64_t, X, A*), const P& p, X extra) {
  const int64_t n_i2t = (p.lists.direction & kI2T) ? p.lists.n : 0, n_t2i = (p.lists.direction & kT2I) ? p.lists.m : 0;
  const int reduction = p.lists.reduction;
  const cudaStream_t st = static_cast<cudaStream_t>(p.stream);
  const int e = launch(kernel, strided_grid(n_i2t + n_t2i), kThreads, 0, st, p, n_i2t, n_i2t + n_t2i, extra,
                       reduction == kNone ? static_cast<A*>(p.loss) : nullptr);
  return e != 0 ? e : reduce_queries<A>(p.aux, n_i2t, n_t2i, reduction, p.loss, st);
}
#endif
}  // namespace cuda
}  // namespace fastrank
