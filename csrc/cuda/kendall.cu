// Fused Kendall ranking loss on CUDA (docs/spec.md §2.2, 2.1a, 2.1b; BCLS, Eq. 17).
//
// Launches: forward = 1 kernel (+ 1 one-block reduction for mean/sum), backward = 1
// elementwise kernel, for every N and direction. No host sync, no host-device copy.
// Forward tiling: one block of 256 threads a list, grid-strided over at most kKendallBlocks
// blocks, each with its scratch (kendall.h); the i2t rows first, then the t2i columns, which
// read sim/relevance/mask through swapped strides. Per list:
//  1. setup (graded_list.cuh): the list's scores s and relevance r gathered into the scratch
//     (s = 0, r = NaN outside the list: NaN is in no active pair, so neither walk tests a
//     mask), from the relevance matrix or its lists, and its items of nonzero relevance (the
//     rows) compacted in list order;
//  2. the dense walk or the sparse one, the cheaper (takes_sparse_pass) unless `paths`
//     forces one.
// Dense walk: thread t owns candidates j = t, t + 256, ... of its list; for each, the block
// streams the list (s_k, r_k, r_k + a) through shared memory in chunks of kChunk candidates and
// the thread accumulates in registers everything candidate j needs:
//   loss_j = sum_k [r_j > r_k + a] [s_k - s_j]+     (j is the upper member of the pair)
//   cnt_j  = #{k : r_j > r_k + a}
//   g_j    = #{k : r_k > r_j + a, s_j > s_k} - #{k : r_j > r_k + a, s_k > s_j}   (an integer)
// Every ordered pair is looked at from both ends (each end computes only its own terms;
// the CPU's unordered-pair trick would need a scatter to the other end). O(C^2) a list.
// Sparse walk: with a >= 0 a pair of two items of relevance 0 is never active, so only the
// pairs with a row count: O(C k) a list of k rows. The rows go kRows at a time, (s, r, r + a,
// item) in registers, against the list walked by the block's threads (thread t: items t,
// t + 256, ...). Each visit (row j, item m) adds m's own terms with j (its gradient count into
// the scratch g, over the groups), and, when m is no row, j's own terms with m (summed over the
// block at the end of the group, block_sums, and added to g_j); a pair of two rows is visited
// from each row, and its loss and count are taken at the visit with m < j only. A visit costs
// about twice a dense pair (both ends' terms).
// Fixed-tree block sums give the loss, the pair count, the valid-item count and the poison
// (sum of poison(s) + poison(r): NaN iff a value read is NaN/inf); each thread then rescales
// its own entries by 1 / max(1, cnt) and adds the poison. Reads sim (and relevance when it
// has sim's dtype) in the input dtype: half / bf16 without a converted copy.
// Memory: dsim (n_dir, n, m) in the accumulation type (saved for the backward), aux
// (2 n_total + 2), the scratch (4 (C + 32) values a block, kendall.h), 3 * kChunk accumulation-type
// values + block-sum scratch of shared memory. Registers: 64 for the float types (4 blocks of 256
// threads an SM; at 5 blocks' 48, sm_90 spilled the list's state), 2 blocks for double. No (n, m, m) tensor, no floating-point atomics:
// bit-identical run to run.
// Backward: grad[e] = sum_d w_d * dsim[d, e], one thread per element (grid-stride),
// grad_output and coef read from device memory; written in sim's dtype.
#include <cuda_runtime.h>

#include <limits>

#include "fastrank/kendall.h"
#include "fastrank/launch.h"
#include "graded_list.cuh"

namespace fastrank {
namespace cuda {
namespace {

constexpr int kThreads = kKendallThreads;
constexpr int kChunk = 1024;
constexpr int kRows = kKendallRows;

// The dense walk over a list of `len` items gathered in s, r: adds to *l_sum and *n_sum the
// loss and the pair count of its ordered pairs, each at its upper end, and writes each valid
// item's gradient count g_j to out[j * oc].
template <typename A>
__device__ void dense_walk(const A* s, const A* r, int64_t len, A alpha, const ListRef& list, const uint8_t* mask,
                           A* out, int64_t oc, A* s_k, A* r_k, A* ra_k, A* l_sum, long long* n_sum) {
  for (int64_t j0 = 0; j0 < len; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    const bool valid = in_list(list, mask, j);
    const A s_j = valid ? s[j] : A(0);
    const A r_j = valid ? r[j] : A(0);
    const A ra_j = r_j + alpha;
    A l_j = 0;
    int n_j = 0, g_j = 0;
    for (int64_t c0 = 0; c0 < len; c0 += kChunk) {
      const int cn = len - c0 < kChunk ? static_cast<int>(len - c0) : kChunk;
      for (int t = threadIdx.x; t < cn; t += kThreads) {
        s_k[t] = s[c0 + t];
        r_k[t] = r[c0 + t];
        ra_k[t] = r[c0 + t] + alpha;  // NaN outside the list: in no active pair
      }
      __syncthreads();
      if (valid) {
        for (int t = 0; t < cn; ++t) {
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
      *l_sum += l_j;
      *n_sum += n_j;
    }
  }
}

// The sparse walk over a list of `len` items gathered in s, r, whose np rows are rows[0, np):
// adds to *l_sum and *n_sum the loss and the pair count of its active pairs and writes each
// item's gradient count to g (the header above). red: kThreads / 32 * kRows ints of shared
// memory, out_sum: kRows more.
template <typename A>
__device__ void sparse_walk(const A* s, const A* r, const int* rows, int len, int np, A alpha, A* g, int* red,
                            int* out_sum, A* l_sum, long long* n_sum) {
  for (int c0 = 0; c0 < np; c0 += kRows) {
    A sj[kRows], rj[kRows], raj[kRows];
    int jx[kRows], gj[kRows];  // gj: row j's own gradient count with the non-rows of this thread
    FASTRANK_UNROLL
    for (int i = 0; i < kRows; ++i) {
      jx[i] = c0 + i < np ? rows[c0 + i] : -1;  // padding: relevance NaN, in no active pair
      sj[i] = jx[i] >= 0 ? s[jx[i]] : A(0);
      rj[i] = jx[i] >= 0 ? r[jx[i]] : std::numeric_limits<A>::quiet_NaN();
      raj[i] = rj[i] + alpha;
      gj[i] = 0;
    }
    A loss = 0;
    int count = 0;
    for (int m = threadIdx.x; m < len; m += kThreads) {
      const A sm = s[m], rm = r[m], ram = rm + alpha;
      const bool zm = rm == A(0);  // m is no row (outside the list: NaN, no row either)
      int gm = 0;
      FASTRANK_UNROLL
      for (int i = 0; i < kRows; ++i) {
        const A d = sm - sj[i];
        const bool up = rj[i] > ram;    // j above m: pair term [s_m - s_j]+
        const bool down = rm > raj[i];  // m above j: pair term [s_j - s_m]+
        const int x = static_cast<int>(up && d > A(0)) - static_cast<int>(down && d < A(0));
        gm += x;                         // m's own count
        gj[i] -= zm ? x : 0;             // j's own count, when m is no row
        const bool once = zm || m < jx[i];  // a pair of two rows counts at one of its two visits
        loss += once ? ((up && d > A(0)) ? d : ((down && d < A(0)) ? -d : A(0))) : A(0);
        count += once && (up || down);
      }
      g[m] = c0 == 0 ? static_cast<A>(gm) : g[m] + static_cast<A>(gm);
    }
    *l_sum += loss;
    *n_sum += count;
    block_sums<kThreads>(gj, red, out_sum);
    if (threadIdx.x < kRows && c0 + static_cast<int>(threadIdx.x) < np)
      g[rows[c0 + threadIdx.x]] += static_cast<A>(out_sum[threadIdx.x]);
    __syncthreads();  // the next group's walk adds into the rows' g
  }
}

template <typename T, typename R>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(4, 2))
kendall_kernel(const KendallForward p, int64_t n_i2t, int64_t n_total, acc_t<T> alpha,
               acc_t<T>* __restrict__ loss_none) {
  using A = acc_t<T>;
  const T* __restrict__ sim = static_cast<const T*>(p.sim.data);
  const R* __restrict__ rel = static_cast<const R*>(p.rel.data);
  const uint8_t* __restrict__ mask = p.mask.data;
  A* __restrict__ dsim = static_cast<A*>(p.dsim);
  A* __restrict__ aux = static_cast<A*>(p.aux);
  const int64_t n = p.lists.n, m = p.lists.m;
  __shared__ A s_k[kChunk];
  __shared__ A r_k[kChunk];
  __shared__ A ra_k[kChunk];
  __shared__ A scratch[kThreads];
  __shared__ long long scratch_n[kThreads];
  __shared__ int warp_count[kThreads / 32];
  __shared__ int row_sums[(kThreads / 32 + 1) * kRows];
  for (int64_t qg = blockIdx.x; qg < n_total; qg += gridDim.x) {
    const bool t2i = qg >= n_i2t;
    const int64_t q = t2i ? qg - n_i2t : qg;
    const ListRef list = list_ref(p, t2i, q);
    const int64_t len = list.len, stride = len + 32;
    // this list's scratch (kendall.h): its scores (0 outside it), its relevance (NaN outside
    // it), its rows, the sparse walk's gradient counts
    A* const s = static_cast<A*>(p.partials) + kendall_scratch_at(n, m, p.lists.direction, gridDim.x, qg);
    A* const r = s + stride;
    int* const rows = reinterpret_cast<int*>(s + 2 * stride);
    A* const g = s + 3 * stride;
    // this query's entries of its dsim slab: element c at out[c * oc]
    A* out = dsim + (t2i && n_i2t > 0 ? n * m : 0) + (t2i ? q : q * m);
    const int64_t oc = t2i ? m : 1;
    const ListCounts<A> k = gather_list<kThreads, T, R, A>(list, sim, rel, t2i ? p.rel_t2i : p.rel_i2t, mask, len,
                                                           A(0), std::numeric_limits<A>::quiet_NaN(), s, r, rows,
                                                           static_cast<A*>(nullptr), scratch, warp_count);
    const bool sparse = takes_sparse_pass(p.paths, k.np, len);
    A l_sum = 0;
    long long n_sum = 0;
    if (sparse) {
      sparse_walk(s, r, rows, static_cast<int>(len), k.np, alpha, g, row_sums, row_sums + (kThreads / 32) * kRows,
                  &l_sum, &n_sum);
    } else {
      dense_walk(s, r, len, alpha, list, mask, out, oc, s_k, r_k, ra_k, &l_sum, &n_sum);
    }
    const A total = block_sum(l_sum, scratch);
    const long long cnt = block_sum(n_sum, scratch_n);
    const A denom = static_cast<A>(cnt > 1 ? cnt : 1);
    for (int64_t j = threadIdx.x; j < len; j += kThreads) {  // own entries only
      if (!in_list(list, mask, j)) {
        out[j * oc] = A(0);  // masked: gradient exactly 0
      } else {
        const A gj = sparse ? (k.np > 0 ? g[j] : A(0)) : out[j * oc];
        out[j * oc] = gj / denom + k.pois;
      }
    }
    if (threadIdx.x == 0) {
      const A lq = total / denom + k.pois;
      aux[qg] = lq;
      aux[n_total + qg] = k.nv > A(0) ? A(1) : A(0);
      if (loss_none != nullptr) loss_none[qg] = lq;
    }
    __syncthreads();  // the next list reuses the scratch
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
  using A = acc_t<T>;
  const int64_t n = p.lists.n, m = p.lists.m;
  const int direction = p.lists.direction, reduction = p.lists.reduction;
  const int64_t n_i2t = (direction & kI2T) ? n : 0, n_t2i = (direction & kT2I) ? m : 0;
  const cudaStream_t st = static_cast<cudaStream_t>(p.stream);
  const int e = launch(kendall_kernel<T, R>, static_cast<unsigned>(kendall_blocks(n, m, direction)), kThreads, 0, st,
                       p, n_i2t, n_i2t + n_t2i, static_cast<A>(p.alpha), reduction == kNone ? static_cast<A*>(p.loss) : nullptr);
  return e != 0 ? e : reduce_queries<A>(p.aux, n_i2t, n_t2i, reduction, p.loss, st);
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
