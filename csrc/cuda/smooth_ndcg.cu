// Fused smooth-NDCG on CUDA (SPEC.md 2.1; paper 000, Eq. 16-21).
//
// Tiling: grid = (n_q queries, ceil(n_c / 256) candidate tiles); thread j of a block
// owns candidate j of its query and keeps its running sum in a register. The block
// streams the query's row through shared memory in chunks of kChunk candidates k
// (loaded once per block, read by all 256 threads), so global reads are n_c per block
// and the work per thread is n_c exps (sigma((s_k - s_j)/tau) in the forward,
// sigma'(.) (a_k - a_j) in the backward).
// Memory plan: no (n_q, n_c, n_c) tensor; pi (n_q, n_c) float is the only saved state.
// Accumulation in float (double for float64 inputs); every sum is in a fixed order
// (per-thread loop + fixed-tree block reduction): bit-identical run to run.
// Kernels: pi_kernel -> loss_kernel (one block per query reduces DCG) ; grad_kernel.
#include <cuda_runtime.h>

#include "fastrank/smooth_ndcg.h"

namespace fastrank {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 1024;

template <typename T>
__global__ void __launch_bounds__(kThreads) pi_kernel(const T* __restrict__ sim, int64_t sq, int64_t sc,
                                                      int64_t n_c, acc_t<T> inv_tau, acc_t<T>* __restrict__ pi) {
  using A = acc_t<T>;
  __shared__ A s_k[kChunk];
  const int64_t q = blockIdx.x;
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  const T* row = sim + q * sq;
  const A s_j = j < n_c ? load(row[j * sc]) : A(0);
  A sum = 0;
  for (int64_t c0 = 0; c0 < n_c; c0 += kChunk) {
    const int len = n_c - c0 < kChunk ? static_cast<int>(n_c - c0) : kChunk;
    for (int t = threadIdx.x; t < len; t += kThreads) s_k[t] = load(row[(c0 + t) * sc]);
    __syncthreads();
    for (int t = 0; t < len; ++t) {
      const A sig = logistic((s_k[t] - s_j) * inv_tau).pos;
      sum += (c0 + t != j) ? sig : A(0);
    }
    __syncthreads();
  }
  if (j < n_c) pi[q * n_c + j] = A(1) + sum;
}

template <typename A>
__global__ void __launch_bounds__(kThreads) loss_kernel(const A* __restrict__ rel, int64_t rq, int64_t rc,
                                                        int64_t n_c, const A* __restrict__ pi,
                                                        const A* __restrict__ idcg, A* __restrict__ loss) {
  __shared__ A scratch[kThreads];
  const int64_t q = blockIdx.x;
  A dcg = 0;
  for (int64_t j = threadIdx.x; j < n_c; j += kThreads)
    dcg += ndcg_gain(rel[q * rq + j * rc]) * ndcg_discount(pi[q * n_c + j]);
  dcg = block_sum(dcg, scratch);
  if (threadIdx.x == 0) loss[q] = idcg[q] > A(0) ? A(1) - dcg / idcg[q] : A(0);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) grad_kernel(const T* __restrict__ sim, int64_t sq, int64_t sc,
                                                        const acc_t<T>* __restrict__ rel, int64_t rq, int64_t rc,
                                                        int64_t n_c, const acc_t<T>* __restrict__ idcg,
                                                        const acc_t<T>* __restrict__ pi,
                                                        const acc_t<T>* __restrict__ grad_loss, acc_t<T> inv_tau,
                                                        T* __restrict__ grad) {
  using A = acc_t<T>;
  __shared__ A s_k[kChunk];
  __shared__ A a_k[kChunk];
  const int64_t q = blockIdx.x;
  const int64_t m = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  const T* row = sim + q * sq;
  const A* r = rel + q * rq;
  const A* p = pi + q * n_c;
  const bool active = idcg[q] > A(0) && grad_loss[q] != A(0);  // uniform over the block
  if (!active) {
    if (m < n_c) grad[q * n_c + m] = store<T>(A(0));
    return;
  }
  const A s_m = m < n_c ? load(row[m * sc]) : A(0);
  const A a_m = m < n_c ? ndcg_gain(r[m * rc]) * ndcg_discount_deriv(p[m]) : A(0);
  A sum = 0;
  for (int64_t c0 = 0; c0 < n_c; c0 += kChunk) {
    const int len = n_c - c0 < kChunk ? static_cast<int>(n_c - c0) : kChunk;
    for (int t = threadIdx.x; t < len; t += kThreads) {
      s_k[t] = load(row[(c0 + t) * sc]);
      a_k[t] = ndcg_gain(r[(c0 + t) * rc]) * ndcg_discount_deriv(p[c0 + t]);
    }
    __syncthreads();
    // the k == m term is sigma'(0) * (a_m - a_m) = 0: no mask needed
    for (int t = 0; t < len; ++t) sum += logistic_deriv((s_k[t] - s_m) * inv_tau) * (a_k[t] - a_m);
    __syncthreads();
  }
  if (m < n_c) grad[q * n_c + m] = store<T>(-grad_loss[q] * inv_tau / idcg[q] * sum);
}

dim3 grid_for(int64_t n_q, int64_t n_c) {
  return dim3(static_cast<unsigned>(n_q), static_cast<unsigned>((n_c + kThreads - 1) / kThreads));
}

}  // namespace

int smooth_ndcg_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                        int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, const void* idcg,
                        double tau, void* loss, void* pi, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  FASTRANK_DISPATCH_CUDA(dt, T, {
    using A = acc_t<T>;
    pi_kernel<T><<<grid_for(n_q, n_c), kThreads, 0, st>>>(static_cast<const T*>(sim), sim_sq, sim_sc, n_c,
                                                           static_cast<A>(1.0 / tau), static_cast<A*>(pi));
    FASTRANK_CUDA_CHECK_LAUNCH();
    loss_kernel<A><<<static_cast<unsigned>(n_q), kThreads, 0, st>>>(
        static_cast<const A*>(rel), rel_sq, rel_sc, n_c, static_cast<const A*>(pi),
        static_cast<const A*>(idcg), static_cast<A*>(loss));
    FASTRANK_CUDA_CHECK_LAUNCH();
  });
  return 0;
}

int smooth_ndcg_backward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                         int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, const void* idcg,
                         const void* pi, const void* grad_loss, double tau, void* grad_sim, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  FASTRANK_DISPATCH_CUDA(dt, T, {
    using A = acc_t<T>;
    grad_kernel<T><<<grid_for(n_q, n_c), kThreads, 0, st>>>(
        static_cast<const T*>(sim), sim_sq, sim_sc, static_cast<const A*>(rel), rel_sq, rel_sc, n_c,
        static_cast<const A*>(idcg), static_cast<const A*>(pi), static_cast<const A*>(grad_loss),
        static_cast<A>(1.0 / tau), static_cast<T*>(grad_sim));
    FASTRANK_CUDA_CHECK_LAUNCH();
  });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
