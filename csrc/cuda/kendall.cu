// Fused Kendall ranking loss on CUDA (SPEC.md 2.2; paper 001, Eq. 17).
//
// Tiling: one block of 256 threads per query (grid = n_q). Thread t owns candidates
// j = t, t + 256, ... of its query; for each, the block streams the query's row (s_k,
// r_k, r_k + a) through shared memory in chunks of kChunk candidates k, and the thread
// accumulates, in registers, everything candidate j needs:
//   loss_j = sum_k [r_j > r_k + a] [s_k - s_j]+     (j is the upper member of the pair)
//   cnt_j  = #{k : r_j > r_k + a}
//   g_j    = #{k : r_k > r_j + a, s_j > s_k} - #{k : r_j > r_k + a, s_k > s_j}   (an integer)
// so every ordered pair is looked at from both ends (each end computes only its own
// terms): the unordered-pair trick of the CPU kernel would need a scatter to the other
// end (atomics, or a shared-memory transpose), which costs more than the duplicated
// compare/select work. g_j is written to dsim; a fixed-tree block reduction gives the
// query's loss and count, then each thread divides its own dsim entries by
// max(1, cnt). No (n_q, n_c, n_c) tensor, no floating-point atomics: bit-identical run
// to run. Memory: dsim (n_q, n_c) (saved for the backward, which is one multiply) and
// 3 * kChunk accumulation-type values of shared memory.
#include <cuda_runtime.h>

#include "fastrank/kendall.h"

namespace fastrank {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 1024;

template <typename T>
__global__ void __launch_bounds__(kThreads) kendall_kernel(const T* __restrict__ sim, int64_t sq, int64_t sc,
                                                           const acc_t<T>* __restrict__ rel, int64_t rq,
                                                           int64_t rc, int64_t n_c, acc_t<T> alpha,
                                                           acc_t<T>* __restrict__ loss,
                                                           acc_t<T>* __restrict__ dsim) {
  using A = acc_t<T>;
  __shared__ A s_k[kChunk];
  __shared__ A r_k[kChunk];
  __shared__ A ra_k[kChunk];
  __shared__ A scratch[kThreads];
  __shared__ long long scratch_n[kThreads];
  const int64_t q = blockIdx.x;
  const T* row = sim + q * sq;
  const A* rrow = rel + q * rq;
  A* out = dsim + q * n_c;
  A l_sum = 0;
  long long n_sum = 0;
  for (int64_t j0 = 0; j0 < n_c; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    const bool valid = j < n_c;
    const A s_j = valid ? load(row[j * sc]) : A(0);
    const A r_j = valid ? rrow[j * rc] : A(0);
    const A ra_j = r_j + alpha;
    A l_j = 0;
    int n_j = 0, g_j = 0;
    for (int64_t c0 = 0; c0 < n_c; c0 += kChunk) {
      const int len = n_c - c0 < kChunk ? static_cast<int>(n_c - c0) : kChunk;
      for (int t = threadIdx.x; t < len; t += kThreads) {
        s_k[t] = load(row[(c0 + t) * sc]);
        const A r = rrow[(c0 + t) * rc];
        r_k[t] = r;
        ra_k[t] = r + alpha;
      }
      __syncthreads();
      for (int t = 0; t < len; ++t) {
        const bool up = r_j > ra_k[t];    // r_j > r_k + a: pair term [s_k - s_j]+
        const bool down = r_k[t] > ra_j;  // r_k > r_j + a: pair term [s_j - s_k]+
        const A d = s_k[t] - s_j;
        l_j += (up && d > A(0)) ? d : A(0);
        n_j += up;
        g_j += static_cast<int>(down && d < A(0)) - static_cast<int>(up && d > A(0));
      }
      __syncthreads();
    }
    if (valid) {
      out[j] = static_cast<A>(g_j);
      l_sum += l_j;
      n_sum += n_j;
    }
  }
  const A total = block_sum(l_sum, scratch);
  const long long cnt = block_sum(n_sum, scratch_n);
  const A denom = static_cast<A>(cnt > 1 ? cnt : 1);
  for (int64_t j = threadIdx.x; j < n_c; j += kThreads) out[j] = out[j] / denom;  // own entries only
  if (threadIdx.x == 0) loss[q] = total / denom;
}

}  // namespace

int kendall_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                    int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, double alpha, void* loss,
                    void* dsim, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  FASTRANK_DISPATCH_CUDA(dt, T, {
    using A = acc_t<T>;
    kendall_kernel<T><<<static_cast<unsigned>(n_q), kThreads, 0, st>>>(
        static_cast<const T*>(sim), sim_sq, sim_sc, static_cast<const A*>(rel), rel_sq, rel_sc, n_c,
        static_cast<A>(alpha), static_cast<A*>(loss), static_cast<A*>(dsim));
    FASTRANK_CUDA_CHECK_LAUNCH();
  });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
