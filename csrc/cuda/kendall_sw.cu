// Kendall SW-HS loss on CUDA (SPEC.md 2.3; paper 001, Eq. 18-20).
//
// Forward tiling: one block of 256 threads per query (grid = n_q); the windows are
// processed in chunks of kWin (one chunk for the usual n_w = 18). The window edges are
// non-increasing in m, so a candidate j is a positive of windows m >= p_j =
// #{m : u_m > r_j} and a negative of windows m < n_j = #{m : l_m > r_j} (binary
// searches on the edge arrays, the same comparisons as `r >= u_m` / `r < l_m`).
// Within the chunk [c0, c1), j goes into one positive bucket max(p_j, c0) - c0 (if
// p_j < c1) and one negative bucket min(n_j, c1) - 1 - c0 (if n_j > c0). Each bucket
// keeps the minimum (positives) / maximum (negatives) score and, among candidates with
// that score, the lowest index: two passes of shared-memory integer atomicMin/atomicMax
// on an order-preserving integer key of the score, then on the index. Integer min/max
// do not depend on the order the threads arrive in, so the result is deterministic.
// Thread 0 then scans the chunk's buckets in window order (prefix minimum = argmin over
// P_m, suffix maximum = argmax over N_m, ties to the lower index), writes idx and adds
// the hinges in window order. Work: O(n_c log n_w) per query (n_c / 256 per thread) plus
// O(n_w) sequential; memory: 12 * kWin bytes of shared memory per block.
// Backward tiling: grid = (n_q, ceil(n_c / 256)); a block loads the query's windows
// (j*, k*, active?) through shared memory, and thread c counts +1 for each active window
// with k* = c and -1 for each with j* = c; grad = count * grad_loss / n_w. Every
// gradient entry is written once by one thread: no atomics, deterministic.
#include <cuda_runtime.h>

#include <climits>

#include "fastrank/kendall_sw.h"

namespace fastrank {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWin = 512;

// Order-preserving unsigned keys: a < b  <=>  key(a) < key(b) (finite values; -0 == +0).
__device__ __forceinline__ unsigned long long order_key(float x) {
  if (x == 0.0f) x = 0.0f;
  unsigned int b = __float_as_uint(x);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return b;
}
__device__ __forceinline__ unsigned long long order_key(double x) {
  if (x == 0.0) x = 0.0;
  unsigned long long b = static_cast<unsigned long long>(__double_as_longlong(x));
  return (b >> 63) ? ~b : (b | (1ull << 63));
}

// #{m : e[m] > x} for a non-increasing array e of length n.
template <typename A> __device__ __forceinline__ int count_above(const A* __restrict__ e, int n, A x) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (e[mid] > x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) sw_forward_kernel(const T* __restrict__ sim, int64_t sq, int64_t sc,
                                                              const acc_t<T>* __restrict__ rel, int64_t rq,
                                                              int64_t rc, int64_t n_c,
                                                              const acc_t<T>* __restrict__ upper,
                                                              const acc_t<T>* __restrict__ lower, int n_w,
                                                              acc_t<T>* __restrict__ loss,
                                                              int32_t* __restrict__ idx) {
  using A = acc_t<T>;
  __shared__ unsigned long long p_key[kWin], n_key[kWin];
  __shared__ int p_idx[kWin], n_idx[kWin];
  const int64_t q = blockIdx.x;
  const T* row = sim + q * sq;
  const A* rrow = rel + q * rq;
  int32_t* out = idx + q * static_cast<int64_t>(n_w) * 2;
  A total = 0;  // used by thread 0 only
  for (int c0 = 0; c0 < n_w; c0 += kWin) {
    const int c1 = n_w - c0 < kWin ? n_w : c0 + kWin;
    for (int b = threadIdx.x; b < kWin; b += kThreads) {
      p_key[b] = ~0ull; n_key[b] = 0ull; p_idx[b] = INT_MAX; n_idx[b] = INT_MAX;
    }
    __syncthreads();
    // pass 1: the extreme score of each bucket
    for (int64_t c = threadIdx.x; c < n_c; c += kThreads) {
      const A r = rrow[c * rc];
      const unsigned long long key = order_key(load(row[c * sc]));
      const int p = count_above(upper, n_w, r);
      if (p < c1) atomicMin(&p_key[(p > c0 ? p : c0) - c0], key);
      const int n = count_above(lower, n_w, r);
      if (n > c0) atomicMax(&n_key[(n < c1 ? n : c1) - 1 - c0], key);
    }
    __syncthreads();
    // pass 2: the lowest index holding it
    for (int64_t c = threadIdx.x; c < n_c; c += kThreads) {
      const A r = rrow[c * rc];
      const unsigned long long key = order_key(load(row[c * sc]));
      const int p = count_above(upper, n_w, r);
      if (p < c1) {
        const int b = (p > c0 ? p : c0) - c0;
        if (p_key[b] == key) atomicMin(&p_idx[b], static_cast<int>(c));
      }
      const int n = count_above(lower, n_w, r);
      if (n > c0) {
        const int b = (n < c1 ? n : c1) - 1 - c0;
        if (n_key[b] == key) atomicMin(&n_idx[b], static_cast<int>(c));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // P_m grows with m: prefix minimum (ties: lower index)
      unsigned long long rk = ~0ull;
      int ri = INT_MAX;
      for (int b = 0; b < c1 - c0; ++b) {
        if (p_idx[b] != INT_MAX && (ri == INT_MAX || p_key[b] < rk || (p_key[b] == rk && p_idx[b] < ri))) {
          rk = p_key[b]; ri = p_idx[b];
        }
        p_idx[b] = ri;
      }
      // N_m shrinks with m: suffix maximum (ties: lower index)
      rk = 0ull;
      ri = INT_MAX;
      for (int b = c1 - c0 - 1; b >= 0; --b) {
        if (n_idx[b] != INT_MAX && (ri == INT_MAX || n_key[b] > rk || (n_key[b] == rk && n_idx[b] < ri))) {
          rk = n_key[b]; ri = n_idx[b];
        }
        n_idx[b] = ri;
      }
      // Eq. 19: sum_m [s_{k*} - s_{j*}]+ in window order
      for (int b = 0; b < c1 - c0; ++b) {
        const int j = p_idx[b], k = n_idx[b];
        const int64_t m = c0 + b;
        out[2 * m] = j == INT_MAX ? -1 : j;
        out[2 * m + 1] = k == INT_MAX ? -1 : k;
        if (j != INT_MAX && k != INT_MAX) {
          const A d = load(row[k * sc]) - load(row[j * sc]);
          total += d > A(0) ? d : A(0);
        }
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[q] = total / static_cast<A>(n_w);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) sw_backward_kernel(const T* __restrict__ sim, int64_t sq, int64_t sc,
                                                               int64_t n_c, const int32_t* __restrict__ idx,
                                                               int n_w, const acc_t<T>* __restrict__ grad_loss,
                                                               T* __restrict__ grad) {
  using A = acc_t<T>;
  __shared__ int jw[kWin], kw[kWin];
  const int64_t q = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  const T* row = sim + q * sq;
  const int32_t* w = idx + q * static_cast<int64_t>(n_w) * 2;
  int count = 0;
  for (int c0 = 0; c0 < n_w; c0 += kWin) {
    const int len = n_w - c0 < kWin ? n_w - c0 : kWin;
    for (int b = threadIdx.x; b < len; b += kThreads) {
      const int j = w[2 * (c0 + b)], k = w[2 * (c0 + b) + 1];
      const bool active = j >= 0 && k >= 0 && load(row[k * sc]) > load(row[j * sc]);
      jw[b] = active ? j : -1;
      kw[b] = active ? k : -1;
    }
    __syncthreads();
    for (int b = 0; b < len; ++b) count += static_cast<int>(kw[b] == c) - static_cast<int>(jw[b] == c);
    __syncthreads();
  }
  if (c < n_c) grad[q * n_c + c] = store<T>(static_cast<A>(count) * (grad_loss[q] / static_cast<A>(n_w)));
}

}  // namespace

int kendall_sw_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                       int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, const void* upper,
                       const void* lower, int64_t n_w, void* loss, int32_t* idx, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  FASTRANK_DISPATCH_CUDA(dt, T, {
    using A = acc_t<T>;
    sw_forward_kernel<T><<<static_cast<unsigned>(n_q), kThreads, 0, st>>>(
        static_cast<const T*>(sim), sim_sq, sim_sc, static_cast<const A*>(rel), rel_sq, rel_sc, n_c,
        static_cast<const A*>(upper), static_cast<const A*>(lower), static_cast<int>(n_w),
        static_cast<A*>(loss), idx);
    FASTRANK_CUDA_CHECK_LAUNCH();
  });
  return 0;
}

int kendall_sw_backward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, int64_t n_q,
                        int64_t n_c, const int32_t* idx, int64_t n_w, const void* grad_loss,
                        void* grad_sim, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(n_q), static_cast<unsigned>((n_c + kThreads - 1) / kThreads));
  FASTRANK_DISPATCH_CUDA(dt, T, {
    using A = acc_t<T>;
    sw_backward_kernel<T><<<grid, kThreads, 0, st>>>(static_cast<const T*>(sim), sim_sq, sim_sc, n_c, idx,
                                                     static_cast<int>(n_w), static_cast<const A*>(grad_loss),
                                                     static_cast<T*>(grad_sim));
    FASTRANK_CUDA_CHECK_LAUNCH();
  });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
