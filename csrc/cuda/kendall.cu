// Fused Kendall ranking loss on CUDA (docs/spec.md §2.2, 2.1a; BCLS, Eq. 17).
//
// Launches: forward = 1 kernel (+ 1 one-block reduction for mean/sum), backward = 1
// elementwise kernel, for every N and direction. No host sync, no host-device copy.
// Forward tiling: one block of 256 threads per query, grid-strided (at most 2^31 - 1
// blocks); the i2t rows first, then the t2i columns, which read sim/relevance/mask through
// swapped strides. Thread t owns candidates j = t, t + 256, ... of its query; for each,
// the block streams the query's row (s_k, r_k, r_k + a) through shared memory in chunks of
// kChunk candidates and the thread accumulates in registers everything candidate j needs:
//   loss_j = sum_k [r_j > r_k + a] [s_k - s_j]+     (j is the upper member of the pair)
//   cnt_j  = #{k : r_j > r_k + a}
//   g_j    = #{k : r_k > r_j + a, s_j > s_k} - #{k : r_j > r_k + a, s_k > s_j}   (an integer)
// Every ordered pair is looked at from both ends (each end computes only its own terms;
// the CPU's unordered-pair trick would need a scatter to the other end). Masked entries
// (docs/spec.md §2.1a) are loaded as r = -inf, r + a = +inf (they are in no active pair) and own
// no j. g_j goes to the query's row (i2t) or column (t2i) of its dsim slab; fixed-tree
// block sums give the loss, the pair count, the valid-item count and the poison
// (sum of 0 * s + 0 * r: NaN iff a value read is NaN/inf), then each thread rescales its
// own entries by 1 / max(1, cnt) and adds the poison. Reads sim (and relevance when it
// has sim's dtype) in the input dtype: half / bf16 without a converted copy.
// Memory: dsim (n_dir, n, m) in the accumulation type (saved for the backward), aux
// (2 n_total + 2), 3 * kChunk accumulation-type values + 4 block-sum scratch arrays of
// shared memory. No (n, m, m) tensor, no floating-point atomics: bit-identical run to run.
// Backward: grad[e] = sum_d w_d * dsim[d, e], one thread per element (grid-stride),
// grad_output and coef read from device memory; written in sim's dtype.
#include <cuda_runtime.h>

#include <limits>

#include "fastrank/kendall.h"
#include "fastrank/launch.h"

namespace fastrank {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 1024;

template <typename T, typename R>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(5, 4))
kendall_kernel(const KendallForward p, int64_t n_i2t, int64_t n_total, acc_t<T> alpha,
               acc_t<T>* __restrict__ loss_none) {
  using A = acc_t<T>;
  const T* __restrict__ sim = static_cast<const T*>(p.sim.data);
  const R* __restrict__ rel = static_cast<const R*>(p.rel.data);
  const uint8_t* __restrict__ mask = p.mask.data;
  A* __restrict__ dsim = static_cast<A*>(p.dsim);
  A* __restrict__ aux = static_cast<A*>(p.aux);
  const int64_t s0 = p.sim.s0, s1 = p.sim.s1, r0 = p.rel.s0, r1 = p.rel.s1, m0 = p.mask.s0, m1 = p.mask.s1;
  const int64_t n = p.lists.n, m = p.lists.m;
  __shared__ A s_k[kChunk];
  __shared__ A r_k[kChunk];
  __shared__ A ra_k[kChunk];
  __shared__ A scratch[kThreads];
  __shared__ long long scratch_n[kThreads];
  const A inf = std::numeric_limits<A>::infinity();
  // one query per block, grid-strided (more queries than blocks: gridDim.x <= 2^31 - 1)
  for (int64_t qg = blockIdx.x; qg < n_total; qg += gridDim.x) {
    const bool t2i = qg >= n_i2t;
    const int64_t q = t2i ? qg - n_i2t : qg;
    const int64_t sc = t2i ? s0 : s1, rc = t2i ? r0 : r1, mc = t2i ? m0 : m1;
    const T* row = sim + q * (t2i ? s1 : s0);
    const R* rrow = rel + q * (t2i ? r1 : r0);
    const uint8_t* mrow = mask == nullptr ? nullptr : mask + q * (t2i ? m1 : m0);
    const int64_t n_c = t2i ? n : m;
    // this query's entries of its dsim slab: element c at out[c * oc]
    A* out = dsim + (t2i && n_i2t > 0 ? n * m : 0) + (t2i ? q : q * m);
    const int64_t oc = t2i ? m : 1;
    A l_sum = 0, p_sum = 0;
    long long n_sum = 0, v_sum = 0;
    for (int64_t j0 = 0; j0 < n_c; j0 += kThreads) {
      const int64_t j = j0 + threadIdx.x;
      const bool valid = j < n_c && (mrow == nullptr || mrow[j * mc] != 0);
      const A s_j = valid ? load(row[j * sc]) : A(0);
      const A r_j = valid ? load(rrow[j * rc]) : A(0);
      const A ra_j = r_j + alpha;
      A l_j = 0;
      int n_j = 0, g_j = 0;
      for (int64_t c0 = 0; c0 < n_c; c0 += kChunk) {
        const int len = n_c - c0 < kChunk ? static_cast<int>(n_c - c0) : kChunk;
        for (int t = threadIdx.x; t < len; t += kThreads) {
          const int64_t k = c0 + t;
          const bool in = mrow == nullptr || mrow[k * mc] != 0;
          const A r = load(rrow[k * rc]);
          s_k[t] = in ? load(row[k * sc]) : A(0);
          r_k[t] = in ? r : -inf;
          ra_k[t] = in ? r + alpha : inf;
        }
        __syncthreads();
        if (valid) {
          for (int t = 0; t < len; ++t) {
            const bool up = r_j > ra_k[t];    // r_j > r_k + a: pair term [s_k - s_j]+
            const bool down = r_k[t] > ra_j;  // r_k > r_j + a: pair term [s_j - s_k]+
            const A d = s_k[t] - s_j;
            l_j += (up && d > A(0)) ? d : A(0);
            n_j += up;
            g_j += static_cast<int>(down && d < A(0)) - static_cast<int>(up && d > A(0));
          }
        }
        __syncthreads();
      }
      if (valid) {
        out[j * oc] = static_cast<A>(g_j);
        l_sum += l_j;
        n_sum += n_j;
        p_sum += poison(s_j) + poison(r_j);
        v_sum += 1;
      } else if (j < n_c) {
        out[j * oc] = A(0);  // masked: gradient exactly 0
      }
    }
    const A total = block_sum(l_sum, scratch);
    const A pois = block_sum(p_sum, scratch);
    const long long cnt = block_sum(n_sum, scratch_n);
    const long long n_valid = block_sum(v_sum, scratch_n);
    const A denom = static_cast<A>(cnt > 1 ? cnt : 1);
    for (int64_t j = threadIdx.x; j < n_c; j += kThreads) {  // own entries only
      if (mrow == nullptr || mrow[j * mc] != 0) out[j * oc] = out[j * oc] / denom + pois;
    }
    if (threadIdx.x == 0) {
      const A lq = total / denom + pois;
      aux[qg] = lq;
      aux[n_total + qg] = n_valid > 0 ? A(1) : A(0);
      if (loss_none != nullptr) loss_none[qg] = lq;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) kendall_backward_kernel(const acc_t<T>* __restrict__ dsim,
                                                                    const acc_t<T>* __restrict__ aux,
                                                                    const acc_t<T>* __restrict__ go, int64_t n,
                                                                    int64_t m, bool i2t, bool t2i, bool none,
                                                                    T* __restrict__ grad) {
  using A = acc_t<T>;
  const int64_t nm = n * m;
  const int64_t n_total = (i2t ? n : 0) + (t2i ? m : 0);
  const A* coef = aux + 2 * n_total;
  const A* d1 = dsim + (i2t ? nm : 0);
  const A* go_t = go + (i2t ? n : 0);
  for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < nm; e += int64_t(gridDim.x) * kThreads) {
    const int64_t i = e / m, j = e - i * m;
    A g = 0;
    if (i2t) g += (none ? go[i] : go[0] * coef[0]) * dsim[e];
    if (t2i) g += (none ? go_t[j] : go[0] * coef[i2t ? 1 : 0]) * d1[e];
    grad[e] = store<T>(g);
  }
}

template <typename T, typename R>
int launch_forward(const KendallForward& p, Graded<T, R>) {
  return launch_queries<kThreads>(kendall_kernel<T, R>, p, static_cast<acc_t<T>>(p.alpha));
}

}  // namespace

int kendall_forward(const KendallForward& p) {
  return dispatch_graded(p.lists.dt, p.rel_dt, [&](auto types) { return launch_forward(p, types); });
}

int kendall_backward(const KendallBackward& p) {
  const unsigned blocks = strided_grid((p.lists.n * p.lists.m + kThreads - 1) / kThreads, 65536);
  // this kernel keeps its own argument list: taking the struct whole cost it registers
  FASTRANK_DISPATCH_CUDA(p.lists.dt, T, {
    using A = acc_t<T>;
    return launch(kendall_backward_kernel<T>, blocks, kThreads, 0, static_cast<cudaStream_t>(p.stream),
                  static_cast<const A*>(p.dsim), static_cast<const A*>(p.aux), static_cast<const A*>(p.grad_out),
                  p.lists.n, p.lists.m, (p.lists.direction & kI2T) != 0, (p.lists.direction & kT2I) != 0,
                  p.lists.reduction == kNone, static_cast<T*>(p.grad));
  });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
