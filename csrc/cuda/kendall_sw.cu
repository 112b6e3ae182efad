// Kendall SW-HS loss on CUDA (docs/spec.md §2.3; BCLS, Eq. 18-20).
//
// Launches: forward = 1 kernel (+ 1 one-block reduction for mean/sum), backward = 1
// kernel, for every N and direction; no host sync, no host-device copy: the window edges
// are computed in the kernels from (alpha, beta, hi, n_w) with IEEE double operations
// that nvcc cannot fuse or reorder (__dmul_rn, __dsub_rn), the same values Python
// computes, rounded once to the accumulation type.
// Forward tiling: one block of 256 threads per query, grid-strided (i2t rows, then t2i
// columns through swapped strides); the windows are processed in chunks of kWin (one
// chunk for the usual n_w = 18). The edges are non-increasing in m, so a candidate j is
// a positive of windows m >= p_j = #{m : u_m > r_j} and a negative of windows
// m < n_j = #{m : l_m > r_j} (binary searches over m, edges computed on the fly; the
// same comparisons as `r >= u_m` / `r < l_m`). Within the chunk [c0, c1), j goes into one
// positive bucket max(p_j, c0) - c0 (if p_j < c1) and one negative bucket
// min(n_j, c1) - 1 - c0 (if n_j > c0). Each bucket keeps the minimum (positives) /
// maximum (negatives) score and, among candidates with that score, the lowest index:
// two passes of shared-memory integer atomicMin/atomicMax on an order-preserving integer
// key of the score, then on the index. Integer min/max do not depend on the order the
// threads arrive in, so the result is deterministic. Thread 0 then scans the chunk's
// buckets in window order (prefix minimum = argmin over P_m, suffix maximum = argmax
// over N_m, ties to the lower index), writes idx and adds the hinges in window order.
// The poison (sum of 0 * s + 0 * r over the row, a fixed-tree block sum) is added to the
// query's loss. Memory: 12 * kWin bytes of shared memory per block; idx (n_total, n_w, 2).
// Backward tiling: one block per tile of kTileR rows x kTileC columns of grad, the tiles on
// a flat gridDim.x (thread per entry, consecutive threads along a row: coalesced writes). The block stages the
// windows of its kTileR rows (i2t) and kTileC columns (t2i) in shared memory, kWin at a
// time, as (j*, k*) or (-1, -1) when the window is inactive (s_{k*} <= s_{j*}); entry
// (i, j) counts +1 / -1 where it is k* / j* of its row's and of its column's windows,
// then grad = count_row * w_i / n_w + count_col * w_j / n_w + 0 * qloss (NaN
// propagation). Each entry is written once by one thread: no atomics, deterministic.
#include <cuda_runtime.h>

#include <climits>

#include "fastrank/kendall.h"
#include "fastrank/kendall_sw.h"
#include "fastrank/launch.h"

namespace fastrank {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWin = 512;
constexpr int kTileC = 32, kTileR = 8, kBwdWin = 64;

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

__device__ __forceinline__ float round_to(double x, float) { return __double2float_rn(x); }
__device__ __forceinline__ double round_to(double x, double) { return x; }

// Window edges, as Python: u_m = hi - m * beta, l_m = u_m - alpha in double, then rounded.
struct Edges {
  double alpha, beta, hi;
  __device__ __forceinline__ double upper(int m) const { return __dsub_rn(hi, __dmul_rn(static_cast<double>(m), beta)); }
  __device__ __forceinline__ double lower(int m) const { return __dsub_rn(upper(m), alpha); }
};

// #{m < n_w : edge(m) > x} for a non-increasing edge sequence (binary search).
template <typename A, bool kUpper>
__device__ __forceinline__ int count_above(const Edges& e, int n_w, A x) {
  int lo = 0, hi = n_w;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const A edge = round_to(kUpper ? e.upper(mid) : e.lower(mid), A());
    if (edge > x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

template <typename T, typename R>
__global__ void __launch_bounds__(kThreads) sw_forward_kernel(const KendallSwForward p, int64_t n_i2t, int64_t n_total,
                                                              Edges edges, acc_t<T>* __restrict__ loss_none) {
  using A = acc_t<T>;
  const T* __restrict__ sim = static_cast<const T*>(p.sim.data);
  const R* __restrict__ rel = static_cast<const R*>(p.rel.data);
  A* __restrict__ aux = static_cast<A*>(p.aux);
  int32_t* __restrict__ idx = p.idx;
  const int64_t s0 = p.sim.s0, s1 = p.sim.s1, r0 = p.rel.s0, r1 = p.rel.s1, n = p.lists.n, m = p.lists.m;
  const int n_w = static_cast<int>(p.n_w);
  __shared__ unsigned long long p_key[kWin], n_key[kWin];
  __shared__ int p_idx[kWin], n_idx[kWin];
  __shared__ A scratch[kThreads];
  // one query per block, grid-strided (more queries than blocks: gridDim.x <= 2^31 - 1)
  for (int64_t qg = blockIdx.x; qg < n_total; qg += gridDim.x) {
    const bool t2i = qg >= n_i2t;
    const int64_t q = t2i ? qg - n_i2t : qg;
    const int64_t sc = t2i ? s0 : s1, rc = t2i ? r0 : r1;
    const T* row = sim + q * (t2i ? s1 : s0);
    const R* rrow = rel + q * (t2i ? r1 : r0);
    const int64_t n_c = t2i ? n : m;
    int32_t* out = idx + qg * static_cast<int64_t>(n_w) * 2;
    A p_sum = 0;
    for (int64_t c = threadIdx.x; c < n_c; c += kThreads) p_sum += poison(load(row[c * sc])) + poison(load(rrow[c * rc]));
    const A pois = block_sum(p_sum, scratch);
    A total = 0;  // used by thread 0 only
    for (int c0 = 0; c0 < n_w; c0 += kWin) {
      const int c1 = n_w - c0 < kWin ? n_w : c0 + kWin;
      for (int b = threadIdx.x; b < kWin; b += kThreads) {
        p_key[b] = ~0ull; n_key[b] = 0ull; p_idx[b] = INT_MAX; n_idx[b] = INT_MAX;
      }
      __syncthreads();
      // pass 1: the extreme score of each bucket
      for (int64_t c = threadIdx.x; c < n_c; c += kThreads) {
        const A r = load(rrow[c * rc]);
        const unsigned long long key = order_key(load(row[c * sc]));
        const int p = count_above<A, true>(edges, n_w, r);
        if (p < c1) atomicMin(&p_key[(p > c0 ? p : c0) - c0], key);
        const int nn = count_above<A, false>(edges, n_w, r);
        if (nn > c0) atomicMax(&n_key[(nn < c1 ? nn : c1) - 1 - c0], key);
      }
      __syncthreads();
      // pass 2: the lowest index holding it
      for (int64_t c = threadIdx.x; c < n_c; c += kThreads) {
        const A r = load(rrow[c * rc]);
        const unsigned long long key = order_key(load(row[c * sc]));
        const int p = count_above<A, true>(edges, n_w, r);
        if (p < c1) {
          const int b = (p > c0 ? p : c0) - c0;
          if (p_key[b] == key) atomicMin(&p_idx[b], static_cast<int>(c));
        }
        const int nn = count_above<A, false>(edges, n_w, r);
        if (nn > c0) {
          const int b = (nn < c1 ? nn : c1) - 1 - c0;
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
        // N_m shrinks with m: suffix maximum (ties: lower index); the chunk's windows
        // [c0, c1) also see the negatives of later chunks through nn >= c1 -> bucket c1-1-c0
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
          const int64_t mw = c0 + b;
          out[2 * mw] = j == INT_MAX ? -1 : j;
          out[2 * mw + 1] = k == INT_MAX ? -1 : k;
          if (j != INT_MAX && k != INT_MAX) total += hinge_nan(load(row[k * sc]) - load(row[j * sc]));
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const A lq = total / static_cast<A>(n_w) + pois;
      aux[qg] = lq;
      aux[n_total + qg] = A(1);
      if (loss_none != nullptr) loss_none[qg] = lq;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kTileC * kTileR) sw_backward_kernel(
    const T* __restrict__ sim, int64_t s0, int64_t s1, const int32_t* __restrict__ idx, int n_w,
    const acc_t<T>* __restrict__ aux, const acc_t<T>* __restrict__ go, int64_t n, int64_t m, bool i2t, bool t2i,
    bool none, int64_t tiles_c, T* __restrict__ grad) {
  using A = acc_t<T>;
  __shared__ int row_w[kTileR][kBwdWin][2];
  __shared__ int col_w[kTileC][kBwdWin][2];
  const int tx = threadIdx.x % kTileC, ty = threadIdx.x / kTileC;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) / tiles_c * kTileR;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) % tiles_c * kTileC;
  const int64_t i = i0 + ty, j = j0 + tx;
  const int64_t n_total = (i2t ? n : 0) + (t2i ? m : 0);
  const int64_t off_t = i2t ? n : 0;  // first t2i query
  int cnt_r = 0, cnt_c = 0;
  for (int c0 = 0; c0 < n_w; c0 += kBwdWin) {
    const int len = n_w - c0 < kBwdWin ? n_w - c0 : kBwdWin;
    // stage the windows: rows (i2t) then columns (t2i), inactive ones as (-1, -1)
    for (int e = threadIdx.x; e < (kTileR + kTileC) * len; e += kTileC * kTileR) {
      const int who = e / len, b = e - who * len;
      const bool is_row = who < kTileR;
      const int64_t qq = is_row ? i0 + who : j0 + (who - kTileR);
      const bool have = is_row ? (i2t && qq < n) : (t2i && qq < m);
      int jw = -1, kw = -1;
      if (have) {
        const int64_t qg = is_row ? qq : off_t + qq;
        const int32_t* w = idx + (qg * n_w + c0 + b) * 2;
        const int jj = w[0], kk = w[1];
        if (jj >= 0 && kk >= 0) {
          const A sj = is_row ? load(sim[qq * s0 + jj * s1]) : load(sim[jj * s0 + qq * s1]);
          const A sk = is_row ? load(sim[qq * s0 + kk * s1]) : load(sim[kk * s0 + qq * s1]);
          if (sk > sj) { jw = jj; kw = kk; }
        }
      }
      int* dst = is_row ? row_w[who][b] : col_w[who - kTileR][b];
      dst[0] = jw;
      dst[1] = kw;
    }
    __syncthreads();
    for (int b = 0; b < len; ++b) {
      cnt_r += static_cast<int>(row_w[ty][b][1] == j) - static_cast<int>(row_w[ty][b][0] == j);
      cnt_c += static_cast<int>(col_w[tx][b][1] == i) - static_cast<int>(col_w[tx][b][0] == i);
    }
    __syncthreads();
  }
  if (i >= n || j >= m) return;
  const A* coef = aux + 2 * n_total;
  const A inv_w = A(1) / static_cast<A>(n_w);
  A g = 0;
  if (i2t) g += static_cast<A>(cnt_r) * ((none ? go[i] : go[0] * coef[0]) * inv_w) + poison(aux[i]);
  if (t2i) g += static_cast<A>(cnt_c) * ((none ? go[off_t + j] : go[0] * coef[i2t ? 1 : 0]) * inv_w) + poison(aux[off_t + j]);
  grad[i * m + j] = store<T>(g);
}

template <typename T, typename R>
int launch_forward(const KendallSwForward& p, Graded<T, R>) {
  return launch_queries<kThreads>(sw_forward_kernel<T, R>, p, Edges{p.alpha, p.beta, p.hi});
}

}  // namespace

int kendall_sw_forward(const KendallSwForward& p) {
  return dispatch_graded(p.lists.dt, p.rel_dt, [&](auto types) { return launch_forward(p, types); });
}

int kendall_sw_backward(const KendallSwBackward& p) {
  // row tiles x column tiles on a flat gridDim.x (no 65535 limit on either)
  const int64_t tiles_c = (p.lists.m + kTileC - 1) / kTileC;
  const unsigned grid = flat_grid((p.lists.n + kTileR - 1) / kTileR * tiles_c);
  if (grid == 0) return static_cast<int>(cudaErrorInvalidConfiguration);
  // this kernel keeps its own argument list: taking the struct whole cost it registers
  FASTRANK_DISPATCH_CUDA(p.lists.dt, T, {
    using A = acc_t<T>;
    return launch(sw_backward_kernel<T>, grid, kTileC * kTileR, 0, static_cast<cudaStream_t>(p.stream),
                  static_cast<const T*>(p.sim.data), p.sim.s0, p.sim.s1, p.idx, static_cast<int>(p.n_w),
                  static_cast<const A*>(p.aux), static_cast<const A*>(p.grad_out), p.lists.n, p.lists.m,
                  (p.lists.direction & kI2T) != 0, (p.lists.direction & kT2I) != 0, p.lists.reduction == kNone,
                  tiles_c, static_cast<T*>(p.grad));
  });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
