// Fast re-ranking on CUDA (docs/spec.md §3; DVSE, Eq. 13-15). Formulas: fast_rerank.h.
//
// Launches: forward = 3 (tile statistics, merge, scores), backward = 3 (tile sums, merge,
// gradient), the same at every size; nothing else runs on the device (no host sync, no
// copies; capturable in a CUDA graph).
// Tiling: the (n, m) matrix is cut into tiles of kTileRows rows x kThreads columns; a
// block of kThreads threads owns one column tile at a time (thread t <-> column c0 + t, so
// row reads are coalesced). The statistics grid is fixed by (n, m): gx = min(column tiles,
// kMaxGx) block columns and gy = min(row tiles, kMaxGy) block rows; block (bx, by) walks
// column tiles bx, bx + gx, ... and, for each, row tiles by, by + gy, ... A tile is read
// once, in strips of S rows staged in shared memory:
//  - columns: each thread keeps the running (max, sum) of g1 * s of its column over the
//    block's row tiles (one rescale exp per strip, one exp per element, exponents <= 0);
//  - rows: warp w reduces strip rows w, w + 8, ... over the 256 staged columns with
//    butterfly shuffles (max, then sum of exp(l1 * s - max)), and folds the pair into the
//    block column's running pair of that row (same thread every time, fixed order).
// Partials: gy x m column pairs + gx x n row pairs in the workspace, O(n + m) (at most
// 128 (n + m) values); lse_merge_kernel folds them in order. Scores and gradient are one
// elementwise sweep each (thread per column, rows strided over grid.y). The backward's
// column sums of G1 and row sums of G2 reuse the grid (sums_tile_kernel,
// sums_merge_kernel).
// NaN propagation (docs/spec.md §1, no host check by default): non-finite input is staged as
// NaN, every max reduction uses max_nan (fmax would drop a NaN), so its row and column
// statistics come out NaN; the scores of that row/column and the gradient follow, and
// every gradient element adds poison(sim) (NaN for sim = +-inf, NaN even where the
// formula's exp would drop a -inf).
// Precision: sim, outputs and gradients are read and written in the input dtype (half and
// bfloat16 included: no conversion copies); accumulation in float (double for float64).
// Every reduction has a fixed order (per-thread loops, butterfly shuffles, in-order
// merges): bit-identical run to run, no atomics. No (n, m) buffer besides the outputs (and
// grad_sim in the backward).
#include <cuda_runtime.h>

#include "fastrank/fast_rerank.h"
#include "fastrank/launch.h"

namespace fastrank {
namespace cuda {
namespace {

constexpr int kThreads = 256;  // columns of a tile = threads of a block
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 64;  // rows of a tile
constexpr int64_t kMaxGx = 32;  // block columns of the statistics grid (row partials: gx x n)
constexpr int64_t kMaxGy = 64;  // block rows of the statistics grid (column partials: gy x m)
constexpr int64_t kElemRows = 4;  // rows per thread (at least) in the elementwise sweeps
constexpr int64_t kMaxGridY = 1024;

// rows of a shared-memory strip: 32 x 256 floats or 16 x 256 doubles = 32 KiB
template <typename A> struct Strip { static constexpr int rows = sizeof(A) == 8 ? 16 : 32; };

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- forward pass 1: partials of col_lse / row_lse over the fixed grid --------------------
template <typename T>
__global__ void __launch_bounds__(kThreads)
    lse_tile_kernel(const T* __restrict__ sim, int64_t sr, int64_t sc, int64_t n, int64_t m, int64_t nrt,
                    int64_t nct, acc_t<T> g1, acc_t<T> l1, acc_t<T>* __restrict__ ws) {
  using A = acc_t<T>;
  constexpr int S = Strip<A>::rows;
  __shared__ A tile[S][kThreads];
  const int64_t gx = gridDim.x, gy = gridDim.y, bx = blockIdx.x, by = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const A ninf = -INFINITY;
  A* pc_m = ws;                // [block row][j]
  A* pc_s = ws + gy * m;
  A* pr_m = ws + 2 * gy * m;   // [block column][i]
  A* pr_s = pr_m + gx * n;
  for (int64_t ct = bx; ct < nct; ct += gx) {
    const int64_t c = ct * kThreads + threadIdx.x;
    const bool valid = c < m;
    const bool first = ct == bx;
    A cm = ninf, cs = A(0);
    for (int64_t rt = by; rt < nrt; rt += gy) {
      const int64_t r0 = rt * kTileRows;
      const int64_t r1 = r0 + kTileRows < n ? r0 + kTileRows : n;
      for (int64_t i0 = r0; i0 < r1; i0 += S) {
        const int h = r1 - i0 < S ? static_cast<int>(r1 - i0) : S;
        A tmax = ninf;
        for (int r = 0; r < h; ++r) {
          A v = valid ? load(sim[(i0 + r) * sr + c * sc]) : ninf;  // -inf: adds exp(-inf) = 0
          if (valid && !isfinite(v)) v = A(NAN);  // NaN / +-inf input -> NaN statistics
          tile[r][threadIdx.x] = v;
          tmax = max_nan(tmax, v);
        }
        if (valid) {  // column: max(g1 * s) = g1 * max(s) since g1 > 0
          const A nm = max_nan(cm, g1 * tmax);
          cs *= exp_nonpos(cm - nm);  // first strip: exp(-inf) = 0
          cm = nm;
          for (int r = 0; r < h; ++r) cs += exp_nonpos(g1 * tile[r][threadIdx.x] - cm);
        }
        __syncthreads();
        for (int r = warp; r < h; r += kWarps) {  // rows: (max, sum) over this tile's columns
          A mx = ninf;
          for (int q = lane; q < kThreads; q += 32) mx = max_nan(mx, tile[r][q]);
          const A mm = l1 * warp_max(mx);
          A s = 0;
          for (int q = lane; q < kThreads; q += 32) s += exp_nonpos(l1 * tile[r][q] - mm);
          s = warp_sum(s);
          if (lane == 0) {
            const int64_t k = bx * n + i0 + r;
            if (first) {
              pr_m[k] = mm;
              pr_s[k] = s;
            } else {  // fold into this block column's pair (written by this same thread)
              const A om = pr_m[k], nm = max_nan(om, mm);
              pr_s[k] = pr_s[k] * exp_nonpos(om - nm) + s * exp_nonpos(mm - nm);
              pr_m[k] = nm;
            }
          }
        }
        __syncthreads();
      }
    }
    if (valid) {
      pc_m[by * m + c] = cm;
      pc_s[by * m + c] = cs;
    }
  }
}

// log sum_t ps[t] exp(pm[t]), in order t
template <typename A> __device__ A merge_lse(const A* pm, const A* ps, int64_t stride, int64_t k) {
  A mx = pm[0];
  for (int64_t t = 1; t < k; ++t) mx = max_nan(mx, pm[t * stride]);
  A s = 0;
  for (int64_t t = 0; t < k; ++t) s += ps[t * stride] * exp_nonpos(pm[t * stride] - mx);
  return mx + log(s);
}

// thread k < m: col_lse[k]; m <= k < m + n: row_lse[k - m]
template <typename A>
__global__ void __launch_bounds__(kThreads, min_blocks<A>(8, 4))
    lse_merge_kernel(const A* __restrict__ ws, int64_t n, int64_t m, int64_t gx, int64_t gy,
                     A* __restrict__ col_lse, A* __restrict__ row_lse) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (k < m) {
    col_lse[k] = merge_lse(ws + k, ws + gy * m + k, m, gy);
  } else if (k < m + n) {
    const A* pr_m = ws + 2 * gy * m;
    row_lse[k - m] = merge_lse(pr_m + (k - m), pr_m + gx * n + (k - m), n, gx);
  }
}

// ---- forward pass 2: i2t = g2 s - col_lse[j], t2i = l2 s - row_lse[i] ------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads)
    scores_kernel(const T* __restrict__ sim, int64_t sr, int64_t sc, int64_t n, int64_t m,
                  const acc_t<T>* __restrict__ col_lse, const acc_t<T>* __restrict__ row_lse, acc_t<T> g2,
                  acc_t<T> l2, T* __restrict__ i2t, T* __restrict__ t2i) {
  using A = acc_t<T>;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= m) return;
  const A cl = col_lse[j];
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const A v = load(sim[i * sr + j * sc]);
    i2t[i * m + j] = store<T>(g2 * v - cl);
    t2i[i * m + j] = store<T>(l2 * v - row_lse[i]);
  }
}

// ---- backward pass 1: partial column sums of G1, row sums of G2 over the fixed grid ---------
template <typename T>
__global__ void __launch_bounds__(kThreads)
    sums_tile_kernel(const T* __restrict__ G1, int64_t g1r, int64_t g1c, const T* __restrict__ G2, int64_t g2r,
                     int64_t g2c, int64_t n, int64_t m, int64_t nrt, int64_t nct, acc_t<T>* __restrict__ ws) {
  using A = acc_t<T>;
  constexpr int S = Strip<A>::rows;
  __shared__ A tile[S][kThreads];
  const int64_t gx = gridDim.x, gy = gridDim.y, bx = blockIdx.x, by = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  A* pc = ws;            // [block row][j]
  A* pr = ws + gy * m;   // [block column][i]
  for (int64_t ct = bx; ct < nct; ct += gx) {
    const int64_t c = ct * kThreads + threadIdx.x;
    const bool valid = c < m;
    const bool first = ct == bx;
    A acc = 0;
    for (int64_t rt = by; rt < nrt; rt += gy) {
      const int64_t r0 = rt * kTileRows;
      const int64_t r1 = r0 + kTileRows < n ? r0 + kTileRows : n;
      if (G1 != nullptr && valid)
        for (int64_t i = r0; i < r1; ++i) acc += load(G1[i * g1r + c * g1c]);
      if (G2 != nullptr) {  // uniform over the grid
        for (int64_t i0 = r0; i0 < r1; i0 += S) {
          const int h = r1 - i0 < S ? static_cast<int>(r1 - i0) : S;
          for (int r = 0; r < h; ++r) tile[r][threadIdx.x] = valid ? load(G2[(i0 + r) * g2r + c * g2c]) : A(0);
          __syncthreads();
          for (int r = warp; r < h; r += kWarps) {
            A s = 0;
            for (int q = lane; q < kThreads; q += 32) s += tile[r][q];
            s = warp_sum(s);
            if (lane == 0) {
              const int64_t k = bx * n + i0 + r;
              pr[k] = first ? s : pr[k] + s;
            }
          }
          __syncthreads();
        }
      }
    }
    if (G1 != nullptr && valid) pc[by * m + c] = acc;
  }
}

// a1[j] = g1 * sum_t pc[t][j] ; b2[i] = l1 * sum_t pr[t][i]   (in order)
template <typename A>
__global__ void __launch_bounds__(kThreads)
    sums_merge_kernel(A* __restrict__ ws, bool has1, bool has2, int64_t n, int64_t m, int64_t gx, int64_t gy,
                      A g1, A l1) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  A* pc = ws;
  A* pr = ws + gy * m;
  A* a1 = pr + gx * n;
  A* b2 = a1 + m;
  if (k < m) {
    if (!has1) return;
    A s = 0;
    for (int64_t t = 0; t < gy; ++t) s += pc[t * m + k];
    a1[k] = g1 * s;
  } else if (k < m + n) {
    if (!has2) return;
    const int64_t i = k - m;
    A s = 0;
    for (int64_t t = 0; t < gx; ++t) s += pr[t * n + i];
    b2[i] = l1 * s;
  }
}

// ---- backward pass 2: grad = g2 G1 - P a1[j] + l2 G2 - Q b2[i] + poison(s) ------------------
template <typename T>
__global__ void __launch_bounds__(kThreads)
    grad_kernel(const T* __restrict__ sim, int64_t sr, int64_t sc, const T* __restrict__ G1, int64_t g1r,
                int64_t g1c, const T* __restrict__ G2, int64_t g2r, int64_t g2c, int64_t n, int64_t m,
                const acc_t<T>* __restrict__ col_lse, const acc_t<T>* __restrict__ row_lse,
                const acc_t<T>* __restrict__ a1, const acc_t<T>* __restrict__ b2, acc_t<T> g1, acc_t<T> g2,
                acc_t<T> l1, acc_t<T> l2, T* __restrict__ grad) {
  using A = acc_t<T>;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= m) return;
  const A cl = col_lse[j];
  const A a = G1 != nullptr ? a1[j] : A(0);
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
    const A v = load(sim[i * sr + j * sc]);
    A out = poison(v);
    if (G1 != nullptr) out += g2 * load(G1[i * g1r + j * g1c]) - exp_nonpos(g1 * v - cl) * a;
    if (G2 != nullptr) out += l2 * load(G2[i * g2r + j * g2c]) - exp_nonpos(l1 * v - row_lse[i]) * b2[i];
    grad[i * m + j] = store<T>(out);
  }
}

struct Launch {
  int64_t nrt, nct, gx, gy;
  dim3 tiles, elems, merge;
  Launch(int64_t n, int64_t m) {
    nrt = cdiv(n, kTileRows);
    nct = cdiv(m, kThreads);
    gx = nct < kMaxGx ? nct : kMaxGx;
    gy = nrt < kMaxGy ? nrt : kMaxGy;
    tiles = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
    int64_t ey = cdiv(n, kElemRows);  // rows per elementwise block column: grid-stride
    ey = ey < kMaxGridY ? ey : kMaxGridY;
    elems = dim3(static_cast<unsigned>(nct), static_cast<unsigned>(ey));
    merge = dim3(static_cast<unsigned>(cdiv(n + m, kThreads)));
  }
};

template <typename T>
int lse_launch(const T* sim, int64_t sr, int64_t sc, int64_t n, int64_t m, acc_t<T> g1, acc_t<T> l1,
               acc_t<T>* ws, acc_t<T>* col_lse, acc_t<T>* row_lse, cudaStream_t st, const Launch& L) {
  const int e = launch(lse_tile_kernel<T>, L.tiles, kThreads, 0, st, sim, sr, sc, n, m, L.nrt, L.nct, g1, l1, ws);
  if (e != 0) return e;
  return launch(lse_merge_kernel<acc_t<T>>, L.merge, kThreads, 0, st, ws, n, m, L.gx, L.gy, col_lse, row_lse);
}

}  // namespace

int64_t fast_rerank_workspace(int64_t n, int64_t m) {
  const Launch L(n, m);
  return 2 * (L.gy * m + L.gx * n);  // >= backward's gy*m + gx*n + m + n; <= 128 (n + m)
}

int fast_rerank_lse(const FastRerankLse& p) {
  const int64_t n = p.n, m = p.m;
  const Launch L(n, m);
  FASTRANK_DISPATCH_CUDA(p.dt, T, {
    using A = acc_t<T>;
    return lse_launch<T>(static_cast<const T*>(p.sim.data), p.sim.s0, p.sim.s1, n, m, static_cast<A>(p.g1),
                         static_cast<A>(p.l1), static_cast<A*>(p.workspace), static_cast<A*>(p.col_lse),
                         static_cast<A*>(p.row_lse), static_cast<cudaStream_t>(p.stream), L);
  });
  return 0;
}

int fast_rerank_forward(const FastRerankForward& p) {
  const int64_t n = p.n, m = p.m, sim_sr = p.sim.s0, sim_sc = p.sim.s1;
  const cudaStream_t st = static_cast<cudaStream_t>(p.stream);
  const Launch L(n, m);
  FASTRANK_DISPATCH_CUDA(p.dt, T, {
    using A = acc_t<T>;
    const T* s = static_cast<const T*>(p.sim.data);
    const int e = lse_launch<T>(s, sim_sr, sim_sc, n, m, static_cast<A>(p.g1), static_cast<A>(p.l1),
                                static_cast<A*>(p.workspace), static_cast<A*>(p.col_lse), static_cast<A*>(p.row_lse),
                                st, L);
    if (e != 0) return e;
    return launch(scores_kernel<T>, L.elems, kThreads, 0, st, s, sim_sr, sim_sc, n, m,
                  static_cast<const A*>(p.col_lse), static_cast<const A*>(p.row_lse), static_cast<A>(p.g2),
                  static_cast<A>(p.l2), static_cast<T*>(p.i2t), static_cast<T*>(p.t2i));
  });
  return 0;
}

int fast_rerank_backward(const FastRerankBackward& p) {
  const int64_t n = p.n, m = p.m;
  const int64_t gi_sr = p.g_i2t.s0, gi_sc = p.g_i2t.s1, gt_sr = p.g_t2i.s0, gt_sc = p.g_t2i.s1;
  const cudaStream_t st = static_cast<cudaStream_t>(p.stream);
  const Launch L(n, m);
  FASTRANK_DISPATCH_CUDA(p.dt, T, {
    using A = acc_t<T>;
    const T* G1 = static_cast<const T*>(p.g_i2t.data);
    const T* G2 = static_cast<const T*>(p.g_t2i.data);
    A* ws = static_cast<A*>(p.workspace);
    A* a1 = ws + L.gy * m + L.gx * n;
    A* b2 = a1 + m;
    int e = launch(sums_tile_kernel<T>, L.tiles, kThreads, 0, st, G1, gi_sr, gi_sc, G2, gt_sr, gt_sc, n, m, L.nrt,
                   L.nct, ws);
    if (e != 0) return e;
    e = launch(sums_merge_kernel<A>, L.merge, kThreads, 0, st, ws, G1 != nullptr, G2 != nullptr, n, m, L.gx, L.gy,
               static_cast<A>(p.g1), static_cast<A>(p.l1));
    if (e != 0) return e;
    return launch(grad_kernel<T>, L.elems, kThreads, 0, st, static_cast<const T*>(p.sim.data), p.sim.s0, p.sim.s1,
                  G1, gi_sr, gi_sc, G2, gt_sr, gt_sc, n, m, static_cast<const A*>(p.col_lse),
                  static_cast<const A*>(p.row_lse), a1, b2, static_cast<A>(p.g1), static_cast<A>(p.g2),
                  static_cast<A>(p.l1), static_cast<A>(p.l2), static_cast<T*>(p.grad));
  });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
