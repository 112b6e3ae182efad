// Fused smooth-NDCG on CUDA, version 1 (docs/spec.md §2.1, 2.1a; Listwise ITR, Eq. 16-21): the
// thread-per-element tiles, kept beside version 2 (smooth_ndcg.cu) so that one build times both
// (the params' version = 1 selects it: fastrank.kernel_variant(version=1)). Its workspace: a in ws.
//
// One call = 2 launches forward + 1 backward, for every N and direction, no host sync:
//   forward_tiles  grid = ceil(n / 16) * ceil(m / 16) blocks of 16 x 16 threads on a flat
//                  gridDim.x (block b is row tile by = b / ceil(m / 16), column tile
//                  bx = b % ceil(m / 16): no gridDim.y limit on the number of rows); thread
//                  (ty, tx) owns element (i, j) = (16 * by + ty, 16 * bx + tx) of sim and
//                  computes both its i2t smooth rank (over row i) and its t2i smooth rank
//                  (over column j), its gain rank among the list's gains (for the IDCG:
//                  rank counting, O(C^2) per list like the ranks themselves), its DCG and
//                  IDCG terms and its backward weight a. Block sums of the terms over the
//                  tile's row / column segments go to `partials` (fixed order).
//   finalize       one block: per query, the sum over its tiles' partials in tile order ->
//                  DCG, IDCG, loss; then the per-direction count and sum (fixed-tree
//                  block_sum) -> the reduction. Deterministic, no atomics.
//   backward_tiles the same grid; thread (i, j) sums sigma'(.)(a_k - a_ij) over row i and
//                  over column j and writes grad[i, j] once (both directions, no atomics).
// Tiling / memory: candidates are staged through shared memory in chunks of kChunk: the
// 16 rows of the tile x kChunk columns (i2t) and kChunk rows x the 16 columns of the tile
// (t2i), values converted to the accumulation type A once on load (half/bf16 read
// directly; relevance is read in its own dtype, sim's or the accumulation type, so bfloat16
// scores never round float32 labels); every staged value is reused by 16 threads, and global reads are coalesced
// along rows (16-element segments for the t2i columns of a row-major sim). Masked items:
// in the forward staged as score and gain -inf (their sigmoid is exactly 0 and they never
// outrank, so the pair loop tests no mask) with 32-bit index compares within a chunk; in
// the backward staged with a 0 flag (a predicate, not a compaction) and never read. The
// pair loops are issue-bound on an H100 (ncu: the ALU pipe busiest, memory idle), so their
// instruction count is their time: per pair, sm_90, float (nvdisasm), the forward's 51 ->
// 25 and the backward's 37 -> 23, from this staging and the hardware reciprocal of common.h.
// Kernel arguments: the entry point's parameter struct (smooth_ndcg.h) whole, by value, plus
// what the launcher derives from it (tiles of m, 1 / tau in the accumulation type, offsets).
// Saved state: ws = a per direction (n * m A each), idcg, counts; partials (3 values per
// query per tile, about 3/16 of an (n, m) matrix per direction) live only in the forward.
// Each ordered pair is evaluated by the thread of each of its two elements: on a GPU the
// sigma(-x) = 1 - sigma(x) sharing would need a cross-thread scatter (atomics or a second
// buffer); exp and reciprocal are single MUFU instructions, so it is not worth it here.
#include <cuda_runtime.h>

#include <limits>

#include "fastrank/launch.h"
#include "fastrank/smooth_ndcg.h"

namespace fastrank {
namespace cuda {
namespace v1 {
namespace {

constexpr int kTile = kSmoothNdcgTile;     // element tile edge (smooth_ndcg.h)
constexpr int kThreads = kTile * kTile;    // one thread per element of the tile
constexpr int kChunk = 32;                 // candidates staged per shared-memory step
constexpr int kFinalThreads = 1024;        // finalize: one block (power of two)

using Layout = SmoothRankLayout;  // offsets into ws (params.h)

inline int64_t tiles(int64_t x) { return (x + kTile - 1) / kTile; }

__device__ __forceinline__ bool in_list(const uint8_t* mask, int64_t ms0, int64_t ms1, int64_t i, int64_t j) {
  return mask == nullptr || mask[i * ms0 + j * ms1] != 0;
}

// Stages chunk c0 of direction d's candidates for the tile at (i0, j0): calls
// put(slot, cc, ii, jj, ok) for the kTile x kChunk elements, slot = a row of the tile
// (i2t, candidates = columns c0 + cc) or a column of it (t2i, candidates = rows c0 + cc);
// ok = inside sim and in the list. Consecutive threads read consecutive columns either
// way (coalesced).
template <typename Put>
__device__ __forceinline__ void stage_chunk(int d, int64_t c0, int64_t i0, int64_t j0, int64_t n, int64_t m,
                                            const uint8_t* mask, int64_t ms0, int64_t ms1, Put&& put) {
  for (int e = threadIdx.x; e < kTile * kChunk; e += kThreads) {
    const int slot = d == 0 ? e / kChunk : e % kTile;
    const int cc = d == 0 ? e % kChunk : e / kTile;
    const int64_t ii = d == 0 ? i0 + slot : c0 + cc;
    const int64_t jj = d == 0 ? c0 + cc : j0 + slot;
    put(slot, cc, ii, jj, ii < n && jj < m && in_list(mask, ms0, ms1, ii, jj));
  }
}

template <typename T, typename R>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(3, 4))
forward_tiles(const SmoothNdcgForward p, int64_t tiles_m, acc_t<T> inv_tau, acc_t<T>* __restrict__ a1,
              acc_t<T>* __restrict__ a2, acc_t<T>* __restrict__ part1, acc_t<T>* __restrict__ part2) {
  using A = acc_t<T>;
  const T* __restrict__ sim = static_cast<const T*>(p.sim.data);
  const R* __restrict__ rel = static_cast<const R*>(p.rel.data);
  const uint8_t* __restrict__ mask = p.mask.data;
  const int64_t ss0 = p.sim.s0, ss1 = p.sim.s1, rs0 = p.rel.s0, rs1 = p.rel.s1, ms0 = p.mask.s0, ms1 = p.mask.s1;
  const int64_t n = p.lists.n, m = p.lists.m;
  const int direction = p.lists.direction;
  // staged [tile row or column][candidate]: scores and gains, -inf for a candidate outside
  // the list (its sigmoid is 0 and it never outranks: the pair loop tests no mask)
  __shared__ A sh_s[kTile][kChunk + 1];
  __shared__ A sh_g[kTile][kChunk + 1];
  __shared__ A red[3][kTile][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t bx = int64_t(blockIdx.x) % tiles_m, by = int64_t(blockIdx.x) / tiles_m;
  const int64_t i0 = by * kTile, j0 = bx * kTile;
  const int64_t i = i0 + ty, j = j0 + tx;
  const bool in = i < n && j < m;
  const bool v_ij = in && in_list(mask, ms0, ms1, i, j);
  const A s_ij = v_ij ? load(sim[i * ss0 + j * ss1]) : A(0);
  const A r_ij = v_ij ? load(rel[i * rs0 + j * rs1]) : A(0);
  const A g_ij = ndcg_gain(r_ij);  // 0 outside the list
  const A z = poison(s_ij + r_ij);  // a non-finite input poisons its terms
  FASTRANK_UNROLL
  for (int d = 0; d < 2; ++d) {
    if (!(direction & (d == 0 ? kI2T : kT2I))) continue;  // uniform over the block
    // d = 0: the list of element (i, j) is row i (candidates k over m columns, own index j);
    // d = 1: column j (candidates over n rows, own index i). `me` = this thread's slot.
    const int64_t nc = d == 0 ? m : n, own = d == 0 ? j : i;
    const int me = d == 0 ? ty : tx;
    A pi = 1;
    int64_t rank = 0;  // items of the list ranked before (i, j) by gain (ties: by index)
    const A out = -std::numeric_limits<A>::infinity();  // a staged candidate outside the list
    for (int64_t c0 = 0; c0 < nc; c0 += kChunk) {
      stage_chunk(d, c0, i0, j0, n, m, mask, ms0, ms1, [&](int slot, int cc, int64_t ii, int64_t jj, bool ok) {
        sh_s[slot][cc] = ok ? load(sim[ii * ss0 + jj * ss1]) : out;
        sh_g[slot][cc] = ok ? ndcg_gain(load(rel[ii * rs0 + jj * rs1])) : out;
      });
      __syncthreads();
      const int len = nc - c0 < kChunk ? static_cast<int>(nc - c0) : kChunk;
      // own's index in this chunk, clamped to [-1, kChunk]: 32-bit compares in the pair loop
      const int own_cc = own < c0 ? -1 : own - c0 > kChunk ? kChunk : static_cast<int>(own - c0);
      int ahead = 0;
      // pair loop: v1 forward ranks
      for (int cc = 0; cc < len; ++cc) {
        const A gk = sh_g[me][cc];
        // Eq. 16: pi = 1 + sum_{k != own, k in the list} sigma((s_k - s_own) / tau)
        const A sig = logistic_pos((sh_s[me][cc] - s_ij) * inv_tau);
        pi += cc != own_cc ? sig : A(0);
        ahead += (gk > g_ij || (gk == g_ij && cc < own_cc)) ? 1 : 0;
      }
      rank += ahead;
      __syncthreads();
    }
    A dcg_t = 0, ideal_t = 0, cnt = 0, a = 0;
    if (v_ij) {
      A f, fd;
      ndcg_discounts(pi, log1p(pi), &f, &fd);
      dcg_t = g_ij * f + z;                                    // Eq. 17 term
      a = g_ij * fd + z;                                       // backward weight
      ideal_t = g_ij * ndcg_discount(static_cast<A>(rank + 1));  // IDCG term: g at its ideal position
      cnt = 1;
    }
    if (in) (d == 0 ? a1 : a2)[i * m + j] = a;
    // partial sums over the tile's segment of the list: row i (over tx) or column j (over ty)
    red[0][ty][tx] = dcg_t;
    red[1][ty][tx] = ideal_t;
    red[2][ty][tx] = cnt;
    __syncthreads();
    if (d == 0 && tx < 3 && i < n) {
      A acc = 0;
      for (int t = 0; t < kTile; ++t) acc += red[tx][ty][t];
      part1[(bx * n + i) * 3 + tx] = acc;
    }
    if (d == 1 && ty < 3 && j < m) {
      A acc = 0;
      for (int t = 0; t < kTile; ++t) acc += red[ty][t][tx];
      part2[(by * m + j) * 3 + ty] = acc;
    }
    __syncthreads();
  }
}

template <typename A>
__global__ void __launch_bounds__(kFinalThreads)
finalize(const Lists lists, const A* __restrict__ part1, const A* __restrict__ part2, A* __restrict__ ws,
         A* __restrict__ out) {
  __shared__ A scratch[kFinalThreads];
  const int64_t n = lists.n, m = lists.m;
  const int direction = lists.direction, reduction = lists.reduction;
  const Layout L = smooth_rank_layout(n, m, direction);
  A total = 0;
  int64_t off = 0;
  for (int d = 0; d < 2; ++d) {
    if (!(d == 0 ? L.d1 : L.d2)) {
      if (threadIdx.x == 0) ws[L.counts + d] = A(0);
      continue;
    }
    const int64_t nq = d == 0 ? n : m;
    const int64_t nt = d == 0 ? (m + kTile - 1) / kTile : (n + kTile - 1) / kTile;
    const A* part = d == 0 ? part1 : part2;
    A sum = 0, cnt = 0;
    for (int64_t q = threadIdx.x; q < nq; q += blockDim.x) {
      A dcg = 0, ideal = 0, nv = 0;
      for (int64_t t = 0; t < nt; ++t) {  // coalesced over q; tiles in a fixed order
        const A* p = part + (t * nq + q) * 3;
        dcg += p[0];
        ideal += p[1];
        nv += p[2];
      }
      // Eq. 18, 20-21: loss = 1 - DCG / IDCG, 0 when IDCG <= 0 (still poisoned by a NaN)
      const A loss = (ideal > A(0) ? A(1) - dcg / ideal : A(0)) + poison(dcg);
      ws[L.idcg + off + q] = ideal;
      ws[L.qloss + off + q] = loss;
      if (reduction == kNone) out[off + q] = loss;
      sum += loss;
      cnt += nv > A(0) ? A(1) : A(0);
    }
    add_direction(sum, cnt, reduction, scratch, ws + L.counts + d, total);
    off += nq;
  }
  if (threadIdx.x == 0 && reduction != kNone) out[0] = total;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(3, 2))
backward_tiles(const SmoothNdcgBackward p, int64_t tiles_m, acc_t<T> inv_tau) {
  using A = acc_t<T>;
  const T* __restrict__ sim = static_cast<const T*>(p.sim.data);
  const uint8_t* __restrict__ mask = p.mask.data;
  const A* __restrict__ grad_out = static_cast<const A*>(p.grad_out.data);
  const A* __restrict__ ws = static_cast<const A*>(p.ws);
  T* __restrict__ grad = static_cast<T*>(p.grad);
  const int64_t ss0 = p.sim.s0, ss1 = p.sim.s1, ms0 = p.mask.s0, ms1 = p.mask.s1, gs = p.grad_out.s;
  const int64_t n = p.lists.n, m = p.lists.m;
  const int direction = p.lists.direction, reduction = p.lists.reduction;
  __shared__ A sh_s[kTile][kChunk + 1];
  __shared__ A sh_a[kTile][kChunk + 1];
  __shared__ bool sh_v[kTile][kChunk + 1];  // a flag here: staging -inf costs the half
                                            // instantiations a spill on sm_90
  const Layout L = smooth_rank_layout(n, m, direction);
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t i0 = int64_t(blockIdx.x) / tiles_m * kTile, j0 = int64_t(blockIdx.x) % tiles_m * kTile;
  const int64_t i = i0 + ty, j = j0 + tx;
  const bool in = i < n && j < m;
  const bool v_ij = in && in_list(mask, ms0, ms1, i, j);
  const A s_ij = v_ij ? load(sim[i * ss0 + j * ss1]) : A(0);
  // Each direction's coefficient and own weight a_ij first: across the candidate loops only
  // these stay live, not the offsets, pointers and flags they come from (fewer registers,
  // no local-memory spills; docs/cuda-resources.md).
  A coef[2] = {A(0), A(0)}, a_own[2] = {A(0), A(0)};
  FASTRANK_UNROLL
  for (int d = 0; d < 2; ++d) {
    if (!(d == 0 ? L.d1 : L.d2) || !v_ij) continue;
    const int64_t q = d == 0 ? i : j, off = d == 0 || !L.d1 ? 0 : n;  // the query's row of idcg, grad_out
    const A count = ws[L.counts + d];
    const A scale = reduction == kMean ? (count > A(0) ? A(1) / count : A(0)) : A(1);
    const A wq = reduction == kNone ? grad_out[(off + q) * gs] : grad_out[0] * scale;
    const A ideal = ws[L.idcg + off + q];
    coef[d] = ideal > A(0) ? -wq * inv_tau / ideal : A(0);
    a_own[d] = ws[(d == 0 ? L.a1 : L.a2) + i * m + j];
  }
  const A* a_dir[2] = {ws + L.a1, ws + L.a2};
  const bool on[2] = {L.d1, L.d2};
  A total = 0;
  FASTRANK_UNROLL
  for (int d = 0; d < 2; ++d) {
    if (!on[d]) continue;  // uniform over the block
    const A* a = a_dir[d];
    const int64_t nc = d == 0 ? m : n;
    const int me = d == 0 ? ty : tx;
    const A a_ij = a_own[d];
    A sum = 0;
    for (int64_t c0 = 0; c0 < nc; c0 += kChunk) {
      stage_chunk(d, c0, i0, j0, n, m, mask, ms0, ms1, [&](int slot, int cc, int64_t ii, int64_t jj, bool ok) {
        sh_s[slot][cc] = ok ? load(sim[ii * ss0 + jj * ss1]) : A(0);
        sh_a[slot][cc] = ok ? a[ii * m + jj] : A(0);
        sh_v[slot][cc] = ok;
      });
      __syncthreads();
      const int len = nc - c0 < kChunk ? static_cast<int>(nc - c0) : kChunk;
      // d loss / d s_own = -(1 / (tau IDCG)) sum_{k in the list} sigma'((s_k - s_own) / tau) (a_k - a_own)
      // (the k = own term is 0: a_k - a_own = 0)
      // pair loop: v1 backward sums
      for (int cc = 0; cc < len; ++cc) {
        const A t = logistic_deriv((sh_s[me][cc] - s_ij) * inv_tau) * (sh_a[me][cc] - a_ij);
        sum += sh_v[me][cc] ? t : A(0);
      }
      __syncthreads();
    }
    if (v_ij) total += coef[d] == A(0) ? poison(sum) : coef[d] * sum;  // constant loss: 0 unless non-finite
  }
  if (in) grad[i * m + j] = store<T>(v_ij ? total : A(0));
}

template <typename T, typename R>
int launch_forward(const SmoothNdcgForward& p, Graded<T, R>) {
  using A = acc_t<T>;
  const int64_t n = p.lists.n, m = p.lists.m;
  const Layout L = smooth_rank_layout(n, m, p.lists.direction);
  const unsigned grid = flat_grid(tiles(n) * tiles(m));
  if (grid == 0) return static_cast<int>(cudaErrorInvalidConfiguration);
  const cudaStream_t st = static_cast<cudaStream_t>(p.stream);
  A* w = static_cast<A*>(p.ws);
  A* part1 = static_cast<A*>(p.partials);
  A* part2 = part1 + (L.d1 ? 3 * n * tiles(m) : 0);
  const int e = launch(forward_tiles<T, R>, grid, kThreads, 0, st, p, tiles(m), static_cast<A>(1.0 / p.tau),
                       w + L.a1, w + L.a2, part1, part2);
  if (e != 0) return e;
  return launch(finalize<A>, 1, kFinalThreads, 0, st, p.lists, part1, part2, w, static_cast<A*>(p.out));
}

}  // namespace

int smooth_ndcg_forward(const SmoothNdcgForward& p) {
  return dispatch_graded(p.lists.dt, p.rel_dt, [&](auto types) { return launch_forward(p, types); });
}

int smooth_ndcg_backward(const SmoothNdcgBackward& p) {
  const int64_t n = p.lists.n, m = p.lists.m;
  const unsigned grid = flat_grid(tiles(n) * tiles(m));
  if (grid == 0) return static_cast<int>(cudaErrorInvalidConfiguration);
  FASTRANK_DISPATCH_CUDA(p.lists.dt, T, {
    using A = acc_t<T>;
    return launch(backward_tiles<T>, grid, kThreads, 0, static_cast<cudaStream_t>(p.stream), p, tiles(m),
                  static_cast<A>(1.0 / p.tau));
  });
  return 0;
}

}  // namespace v1
}  // namespace cuda
}  // namespace fastrank
