// Fused smooth-NDCG on CUDA, version 2 (docs/spec.md §2.1, 2.1a, 2.1b; Listwise ITR, Eq. 16-21).
//
// One call = 1 launch a direction + 1 reduction forward, 1 elementwise backward, for
// every N and direction; no host sync, no float atomics, bit-identical run to run. Version 1
// (the thread-per-element tiles, smooth_ndcg_v1.cu) stays in the build: the params'
// `version` selects it per call (fastrank.kernel_variant(version=1)), so one run times both.
//
// forward_lists: one launch a direction, a block of 8 warps per list (grid-strided over the
// direction's lists, at most kSmoothNdcgListBlocks blocks, each with its own scratch of four
// arrays sized by the direction's list length). Per list, of C items (C = m for a row, n for a
// column):
//  1. setup (list_setup): the list's scores gathered into the scratch `y` (one strided pass over
//     its row or column; -inf for a masked item and for the padding up to the power of two Cs,
//     so that the pair passes test no mask), its relevance into `r` (from the matrix in the same
//     pass, or from its lists: zeros, then the listed entries, an item listed twice taking the
//     later entry as on the CPU), then one pass that counts the valid items, the items of
//     nonzero gain (the "rows") and the poison, and compacts the rows in list order (their item,
//     their gain) by a block-wide ballot scan;
//  2. the list takes the dense pass or the sparse one (takes_sparse_pass, `paths`);
//  dense (dense_list):
//  3. the ideal DCG from the gains sorted in the scratch (ideal_dcg: a bitonic sort of Cs values,
//     Cs log^2 Cs / 4 compare-exchanges; a function of the relevance alone, out of the pair loops);
//  4. the rank pass over the unordered pairs (pair_pass): pi_j = 1 + sum_k sigma((s_k - s_j) / tau);
//  5. per item f(pi), f'(pi): the DCG (a block sum), the loss, and a_j = g_j f'(pi_j) in `a`;
//  6. with a gradient, the gradient pass over the unordered pairs:
//     G_j = sum_k sigma'((s_k - s_j) / tau) (a_k - a_j), written to ws already scaled by the
//     list's factor -1 / (tau IDCG): the backward only multiplies by the upstream weight
//     (the smooth-rank engine's elementwise backward, smooth_rank.cuh; G_t2i stored
//     transposed, (m, n), so that a column's writes are contiguous).
//  sparse (sparse_list): an item of gain 0 adds nothing to the DCG whatever its rank, and its
//  a_j is 0, so only the np rows need a rank and an item meets only them in the gradient:
//     G_m = sum_{rows k != m} sigma'((s_k - s_m) / tau) a_k - a_m S1_m,
//     S1_m = sum_{k != m} sigma'((s_k - s_m) / tau)   (a row's; a_m = 0 for the others),
//  the CPU's derivation (csrc/cpu/smooth_ndcg.cpp: subset_grad with u = a). The ideal DCG sorts
//  the np nonzero gains only (a zero gain adds 0 wherever it stands). The rows go kRows at a
//  time, their score and item in registers, against the list walked by the block's threads
//  (thread t: items t, t + 256, ...): the rank pass sums each row's sigma and sigma' over the
//  thread's items, then over the block (block_sums: warp butterflies, then the warps in order),
//  and the row's weight a and its - a S1 follow at once; the gradient pass adds each item's
//  terms of the group into its G (the scratch `r`, zeroed first). Self pairs are left out by an
//  index test (a select a pair). Per list O(C ceil(np / kRows) kRows) pairs a pass, each with
//  the dense pass's one exp and one reciprocal.
// The dense pass's unordered pairs: the list is cut into tiles of 32 items; every unordered pair of
// tiles (a, b) is one warp's 32 x 32 block of pairs, the diagonal tiles (a, a) their
// 32 * 31 / 2 pairs. Lane l holds item j = 32 a + l in registers (its score and its sum),
// the tile b's scores sit in the warp's shared buffer (twice, so that lane l reads item
// (l + t) mod 32 at a constant offset t in the unrolled step t), and the sum of the k side
// travels with its item: after each step every lane passes its k-side sum to the lane
// below (one shuffle a pair), so after 32 steps each k-side sum is back at its item's lane,
// complete over the 32 j's. One exp and one reciprocal a pair give both sides:
//   e = 2^min((s_j - s_k) log2(e) / tau, 126), r = 1 / (1 + e): sigma(x) = r for j and
//   sigma(-x) = e r for k (x = (s_k - s_j) / tau); no cancellation, no sign test (the clamp
//   keeps e finite; its sigma, 2^-126, is far below a float's resolution of pi >= 1);
//   sigma'(x) = e r^2, and G_j += w (a_k - a_j), G_k -= w (a_k - a_j).
// Tile pairs go in the rounds of a round-robin tournament (the circle method: in each of
// the T' - 1 rounds every tile is in exactly one pair; T' = T rounded up to even, the odd
// tile out paired with a padding tile, a pair that is skipped), then the diagonal round: within a round no two
// warps touch the same tile, so each adds its two 32-sums into the scratch sums without
// atomics, in a fixed order; a block barrier ends each round.
// Memory: per block of the grid a scratch of 4 (Cs + 32) accumulation-type values (dense: y, r,
// acc, a; sparse: y, r then the sort buffer then G, the rows' items, their gains then weights;
// L1/L2-resident), partials = Q list flags + that; ws = G per direction (n * m each),
// idcg, qloss, counts (params.h). Shared memory: 8 warps x 64 (score, a) pairs.
// The only atomics: an integer max per listed entry, which picks the later of two entries for
// one item (bad input: the contract lists an item once).
// NaN (docs/spec.md §1): poison(s + r) of every item is added to the DCG and to a_j (dense) or
// to every G entry of the list (sparse), so it reaches the loss and every gradient entry of the
// list; a NaN gain makes the IDCG NaN.
#include <cuda_runtime.h>

#include <limits>

#include "fastrank/launch.h"
#include "fastrank/smooth_ndcg.h"
#include "graded_list.cuh"
#include "smooth_rank.cuh"

namespace fastrank {
namespace cuda {
namespace v1 {
int smooth_ndcg_forward(const SmoothNdcgForward& p);  // smooth_ndcg_v1.cu
int smooth_ndcg_backward(const SmoothNdcgBackward& p);
}  // namespace v1

namespace {

constexpr int kThreads = kSmoothNdcgThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kFinalThreads = 256;
constexpr int kRows = kSmoothNdcgRows;  // sparse pass: the rows a block ranks at once (smooth_ndcg.h)

using Layout = SmoothRankLayout;  // offsets into ws (params.h)

// The clamp of the exponent (log2 units): 2^126 is finite in float, 2^1000 in double.
template <typename A> __device__ __forceinline__ A exp2_cap();
template <> __device__ __forceinline__ float exp2_cap<float>() { return 126.0f; }
template <> __device__ __forceinline__ double exp2_cap<double>() { return 1000.0; }

// The scratch of one block: four arrays of span + 32 values. Dense pass: y (the scores), r (the
// relevance), acc (the gains, then the sums), a (the weights). Sparse pass: y, r (then the sort
// buffer, then G), acc (the rows' items, as int), a (the rows' relevance, then their weights).
// (One base pointer and a 32-bit stride: four pointers held over the pair passes cost registers.)
template <typename A> struct Scratch {
  A* base;
  int stride;
  __device__ __forceinline__ A* y() const { return base; }
  __device__ __forceinline__ A* r() const { return base + stride; }
  __device__ __forceinline__ A* acc() const { return base + 2 * stride; }
  __device__ __forceinline__ A* a() const { return base + 3 * stride; }
  __device__ __forceinline__ int* rows() const { return reinterpret_cast<int*>(acc()); }
};

// The ideal DCG (Eq. 18-21) of the `count` gains in buf[0, span) (span a power of two, -inf after
// them and for a NaN gain): a bitonic sort of buf into descending order (span log^2 span / 4
// compare-exchanges), then sum_p buf[p] / log2(1 + p), p = 1 .. count; NaN when `nans` > 0.
template <typename A>
__device__ A ideal_dcg(A* buf, int64_t span, int64_t count, A nans, A* red) {
  __syncthreads();  // buf is filled
  for (int64_t k = 2; k <= span; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = threadIdx.x; i < span; i += kThreads) {
        const int64_t l = i ^ j;
        if (l > i) {
          const A x = buf[i], z = buf[l];
          if (((i & k) == 0) == (x < z)) {  // descending where (i & k) == 0
            buf[i] = z;
            buf[l] = x;
          }
        }
      }
      __syncthreads();
    }
  }
  A ideal = 0;
  for (int64_t p = threadIdx.x; p < count; p += kThreads) ideal += buf[p] * ndcg_discount(static_cast<A>(p + 1));
  ideal = block_sum(ideal, red);
  return nans > A(0) ? std::numeric_limits<A>::quiet_NaN() : ideal;
}

// The pair of tiles (ta, tb) of one warp (kDiag false, ta != tb: 32 x 32 pairs; kDiag, ta == tb:
// the tile's 32 * 31 / 2). Rank pass (kGrad false): acc += the sigmas of each side. Gradient
// pass: acc += G, with a the weights. buf: this warp's staged (score, a) of tile tb, twice.
template <bool kGrad, bool kDiag, typename A>
__device__ __forceinline__ void tile_pair(int ta, int tb, A c2, const Scratch<A>& w, A (*buf)[2]) {
  const int lane = threadIdx.x % 32;
  const int64_t j = int64_t(ta) * 32 + lane, k = int64_t(tb) * 32 + lane;
  const A cap = exp2_cap<A>();
  const A yj = w.y()[j];
  const A aj = kGrad ? w.a()[j] : A(0);
  buf[lane][0] = buf[lane + 32][0] = w.y()[k];
  if (kGrad) buf[lane][1] = buf[lane + 32][1] = w.a()[k];
  __syncwarp();
  const int next = (lane + 1) & 31;
  A sj = 0, sk = 0;
  // kDiag: steps 1 .. 16, the pairs at distance 16 from the lower half of the lanes only
  constexpr int t0 = kDiag ? 1 : 0, t1 = kDiag ? 17 : 32;
  FASTRANK_UNROLL
  for (int t = t0; t < t1; ++t) {
    const A yk = buf[lane + t][0];
    const A e = exp2_approx(fmin((yj - yk) * c2, cap));  // exp(-x), x = (s_k - s_j) / tau
    const A r = rcp_approx(A(1) + e);                     // sigma(x)
    const A on = !kDiag || t < 16 || lane < 16 ? A(1) : A(0);
    if (kGrad) {
      const A wgt = e * r * r * (kDiag ? on : A(1));  // sigma'(x)
      const A da = buf[lane + t][1] - aj;             // a_k - a_j
      sj = fma(wgt, da, sj);
      sk = fma(-wgt, da, sk);
    } else if (kDiag) {
      sj += r * on;
      sk += e * r * on;
    } else {
      sj += r;             // sigma(x) for j
      sk = fma(e, r, sk);  // sigma(-x) for k
    }
    if (!kDiag || t < 16) sk = __shfl_sync(0xffffffffu, sk, next);
  }
  if (kDiag) sk = __shfl_sync(0xffffffffu, sk, (lane + 16) & 31);  // lane l now holds item l's k side
  __syncwarp();  // buf is restaged by the next pair
  if (kDiag) {
    w.acc()[j] += sj + sk;
  } else {
    w.acc()[j] += sj;
    w.acc()[k] += sk;
  }
}

// The circle method: pair p of round r (of tn - 1) among tn tiles (tn even); r, p < tn - 1.
__device__ __forceinline__ void round_pair(int r, int p, int tn, int* ta, int* tb) {
  const int m1 = tn - 1;
  const int a = r + p, b = r - p;
  *ta = p == 0 ? r : (a >= m1 ? a - m1 : a);
  *tb = p == 0 ? m1 : (b < 0 ? b + m1 : b);
}

// One pass over every unordered pair of the list's tiles (t tiles of 32), acc += its sums.
// The two passes' loops are written out apart so that each has its own source line (the pair
// loop counts of benchmarks/cuda_resources.py name them by it).
template <bool kGrad, typename A>
__device__ void pair_pass(int t, A c2, const Scratch<A>& w, A (*buf)[2]) {
  const int warp = threadIdx.x / 32;
  const int tn = t + (t & 1);  // with an odd t, the padding tile t takes the bye: pair 0, skipped
  const int p0 = warp == 0 && (t & 1) ? kWarps : warp;
  for (int r = 0; r + 1 < tn; ++r) {
    if (kGrad) {
      // pair loop: v2 gradient, tile pairs
      for (int p = p0; p < tn / 2; p += kWarps) {
        int ta, tb;
        round_pair(r, p, tn, &ta, &tb);
        tile_pair<true, false>(ta, tb, c2, w, buf);
      }
    } else {
      // pair loop: v2 ranks, tile pairs
      for (int p = p0; p < tn / 2; p += kWarps) {
        int ta, tb;
        round_pair(r, p, tn, &ta, &tb);
        tile_pair<false, false>(ta, tb, c2, w, buf);
      }
    }
    __syncthreads();
  }
  if (kGrad) {
    // pair loop: v2 gradient, diagonal tiles
    for (int p = warp; p < t; p += kWarps) tile_pair<true, true>(p, p, c2, w, buf);
  } else {
    // pair loop: v2 ranks, diagonal tiles
    for (int p = warp; p < t; p += kWarps) tile_pair<false, true>(p, p, c2, w, buf);
  }
  __syncthreads();
}

// The sparse pass over a list of `len` items whose np rows are in w.rows() (items) and w.a() (relevance)
// (the header above): writes the rows' weights over their gains, and, with_grad, G (before the
// list's factor) into w.r(); returns the DCG (poison not included). red: kThreads values of shared
// memory.
template <typename A>
__device__ A sparse_list(int len, int np, A c2, bool with_grad, const Scratch<A>& w, A* red) {
  const A ninf = -std::numeric_limits<A>::infinity();
  const A cap = exp2_cap<A>();
  const int* rows = w.rows();
  A* G = w.r();
  A* sums_out = red + kWarps * 2 * kRows;  // block_sums' result, apart from its warp sums
  if (with_grad) {
    for (int c = threadIdx.x; c < len; c += kThreads) G[c] = A(0);
    __syncthreads();  // the rank pass writes the rows' - a S1 into G
  }
  // the rank pass: pi_j = 1 + sum_{k != j} sigma((s_k - s_j) / tau), S1_j likewise with sigma'
  A dcg = 0;  // thread i < kRows: the DCG terms of rows i, kRows + i, ...
  for (int c0 = 0; c0 < np; c0 += kRows) {
    A yj[kRows], sums[2 * kRows];  // sums: kRows sigma sums, then kRows sigma' sums
    int jx[kRows];
    FASTRANK_UNROLL
    for (int i = 0; i < kRows; ++i) {
      jx[i] = c0 + i < np ? rows[c0 + i] : -1;  // padding: a row of score -inf, never read back
      yj[i] = jx[i] >= 0 ? w.y()[jx[i]] : ninf;
      sums[i] = sums[kRows + i] = A(0);
    }
    // pair loop: v2 sparse ranks
    for (int k = threadIdx.x; k < len; k += kThreads) {
      const A yk = w.y()[k];
      FASTRANK_UNROLL
      for (int i = 0; i < kRows; ++i) {
        const A e = exp2_approx(fmin((yj[i] - yk) * c2, cap));  // exp(-x), x = (s_k - s_j) / tau
        const A r = k != jx[i] ? rcp_approx(A(1) + e) : A(0);  // sigma(x); the self pair left out
        sums[i] += r;
        sums[kRows + i] = fma(e * r, r, sums[kRows + i]);  // sigma'(x)
      }
    }
    block_sums<kThreads>(sums, red, sums_out);
    const int i = threadIdx.x;
    if (i < kRows && c0 + i < np) {  // Eq. 17: the row's DCG term and its weight a = g f'(pi)
      const A pi = A(1) + sums_out[i], g = ndcg_gain(w.a()[c0 + i]);
      A f, fd;
      ndcg_discounts(pi, log1p(pi), &f, &fd);
      dcg += g * f;
      w.a()[c0 + i] = g * fd;
      if (with_grad) G[rows[c0 + i]] = -(g * fd) * sums_out[kRows + i];  // - a_m S1_m
    }
  }
  __syncthreads();            // sums_out (in red) is read above: block_sum rewrites red
  dcg = block_sum(dcg, red);  // its barriers also publish the weights
  if (!with_grad) return dcg;
  // the gradient pass: G_m += sum_{rows k != m} sigma'((s_k - s_m) / tau) a_k
  for (int c0 = 0; c0 < np; c0 += kRows) {
    A yk[kRows], ak[kRows];
    int kx[kRows];
    FASTRANK_UNROLL
    for (int i = 0; i < kRows; ++i) {
      kx[i] = c0 + i < np ? rows[c0 + i] : -1;
      yk[i] = kx[i] >= 0 ? w.y()[kx[i]] : ninf;
      ak[i] = kx[i] >= 0 ? w.a()[c0 + i] : A(0);
    }
    // pair loop: v2 sparse gradient
    for (int m = threadIdx.x; m < len; m += kThreads) {  // each thread adds into its own items
      const A ym = w.y()[m];
      A g = 0;
      FASTRANK_UNROLL
      for (int i = 0; i < kRows; ++i) {
        const A e = exp2_approx(fmin((ym - yk[i]) * c2, cap));
        const A r = rcp_approx(A(1) + e);
        g = fma(e * r * r, m != kx[i] ? ak[i] : A(0), g);  // sigma'(x) a_k; the self pair left out
      }
      G[m] += g;
    }
  }
  __syncthreads();  // G is read by other threads below
  return dcg;
}

template <typename T, typename R>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(4, 2))
forward_lists(const SmoothNdcgForward p, int t2i, int64_t cs, acc_t<T> c2, acc_t<T> inv_tau,
              acc_t<T>* __restrict__ ws, acc_t<T>* __restrict__ flags, acc_t<T>* scratch) {
  using A = acc_t<T>;
  __shared__ A buf[kWarps][64][2];
  __shared__ A red[kThreads];
  __shared__ int warp_count[kWarps];
  __shared__ A pois_list;  // the list's poison where the sparse pass adds it (not kept in registers over the passes)
  const T* sim = static_cast<const T*>(p.sim.data);
  const R* rel = static_cast<const R*>(p.rel.data);
  const uint8_t* mask = p.mask.data;
  const Layout L = smooth_rank_layout(p.lists.n, p.lists.m, p.lists.direction);
  const Scratch<A> w{scratch + 4 * (cs + 32) * blockIdx.x, static_cast<int>(cs + 32)};
  A (*wbuf)[2] = buf[threadIdx.x / 32];
  const A ninf = -std::numeric_limits<A>::infinity();
  const int64_t q_end = t2i ? L.nq2 : L.nq1, q_off = t2i ? L.nq1 : 0;  // this launch's direction
  for (int64_t q = blockIdx.x; q < q_end; q += gridDim.x) {
    const int64_t qg = q_off + q;
    const ListRef list = list_ref(p, t2i, q);
    auto valid = [&](int64_t c) { return in_list(list, mask, c); };
    int64_t cl = 32;  // this list's span: its length rounded up to a power of two >= 32
    while (cl < list.len) cl <<= 1;
    // 1. setup (graded_list.cuh): y = the scores, -inf outside the list and in the padding up to
    // cl + 32 (the pair passes test no mask); r = the relevance, 0 outside; the rows
    const ListCounts<A> k = gather_list<kThreads, T, R, A>(list, sim, rel, t2i ? p.rel_t2i : p.rel_i2t, mask, cl + 32,
                                                           ninf, A(0), w.y(), w.r(), w.rows(), w.a(), red, warp_count);
    if (threadIdx.x == 0) flags[qg] = k.nv > A(0) ? A(1) : A(0);
    const bool sparse = takes_sparse_pass(p.paths, k.np, list.len);
    if (threadIdx.x == 0) pois_list = sparse ? k.pois : A(0);  // the sparse pass adds it at the end
    A ideal, dcg;
    if (sparse) {
      int64_t span = 1;  // the nonzero gains, sorted in r (free now)
      while (span < k.np) span <<= 1;
      for (int64_t i = threadIdx.x; i < span; i += kThreads) {
        const A g = i < k.np ? ndcg_gain(w.a()[i]) : ninf;
        w.r()[i] = g == g ? g : ninf;  // a NaN gain is counted, not sorted
      }
      ideal = ideal_dcg(w.r(), span, k.np, k.nans, red);
      dcg = sparse_list(static_cast<int>(list.len), k.np, c2, p.with_grad, w, red) + pois_list;
    } else {
      for (int64_t c = threadIdx.x; c < cl; c += kThreads) {  // the gains, sorted in acc
        const A g = valid(c) ? ndcg_gain(w.r()[c]) : ninf;
        w.acc()[c] = g == g ? g : ninf;  // a NaN gain is counted, not sorted
      }
      ideal = ideal_dcg(w.acc(), cl, static_cast<int64_t>(k.nv), k.nans, red);
      const int tiles = static_cast<int>((list.len + 31) / 32);
      for (int64_t c = threadIdx.x; c < cl + 32; c += kThreads) w.acc()[c] = A(0);
      __syncthreads();
      pair_pass<false>(tiles, c2, w, wbuf);
      // Eq. 17: DCG = sum_j g_j / log2(1 + pi_j); a_j = g_j * d/dpi [1 / log2(1 + pi)](pi_j)
      dcg = 0;
      for (int64_t c = threadIdx.x; c < cl + 32; c += kThreads) {
        A a = 0;
        if (valid(c)) {
          const A s = w.y()[c], r = w.r()[c];
          const A g = ndcg_gain(r), pi = A(1) + w.acc()[c], z = poison(s + r);
          A f, fd;
          ndcg_discounts(pi, log1p(pi), &f, &fd);
          dcg += g * f + z;
          a = g * fd + z;
        }
        w.a()[c] = a;
      }
      dcg = block_sum(dcg, red);  // its barriers also publish a
      if (p.with_grad) {
        for (int64_t c = threadIdx.x; c < cl + 32; c += kThreads) w.acc()[c] = A(0);
        __syncthreads();
        pair_pass<true>(tiles, c2, w, wbuf);
      }
    }
    // Eq. 18, 20-21: loss = 1 - DCG / IDCG, 0 when IDCG <= 0 (still poisoned by a NaN)
    const A loss = (ideal > A(0) ? A(1) - dcg / ideal : A(0)) + poison(dcg);
    if (threadIdx.x == 0) {
      ws[L.idcg + qg] = ideal;
      ws[L.qloss + qg] = loss;
      if (p.lists.reduction == kNone) static_cast<A*>(p.out)[qg] = loss;
    }
    if (p.with_grad) {
      // d loss / d s_j = -(1 / (tau IDCG)) G_j (0 for a constant loss, unless non-finite); the sparse
      // pass adds the list's poison here (the dense one carried it in a)
      const A coef = -inv_tau / ideal, pois = pois_list;
      const A* sum = sparse ? w.r() : w.acc();
      A* G = ws + (t2i ? L.a2 : L.a1) + q * list.len;  // row q of G_i2t, or of G_t2i^T
      for (int64_t c = threadIdx.x; c < list.len; c += kThreads)
        G[c] = valid(c) ? (ideal > A(0) ? coef * sum[c] : poison(sum[c])) + pois : A(0);
    }
    __syncthreads();  // the next list reuses the scratch
  }
}

// The reduction (one block, the engine's reduce_queries): a list counts when it has a valid item.
template <typename A>
__global__ void __launch_bounds__(kFinalThreads)
finalize_lists(Lists lists, const A* __restrict__ flags, A* __restrict__ ws, A* __restrict__ out) {
  __shared__ A scratch[kFinalThreads];
  rank::reduce_queries(smooth_rank_layout(lists.n, lists.m, lists.direction), lists.reduction, flags, scratch, ws,
                       out);
}

template <typename T, typename R>
int launch_forward(const SmoothNdcgForward& p, Graded<T, R>) {
  using A = acc_t<T>;
  const int64_t n = p.lists.n, m = p.lists.m;
  const int64_t q = query_count(n, m, p.lists.direction);
  if (q == 0) return static_cast<int>(cudaErrorInvalidConfiguration);
  const cudaStream_t st = static_cast<cudaStream_t>(p.stream);
  A* ws = static_cast<A*>(p.ws);
  A* flags = static_cast<A*>(p.partials);
  const double log2e = 1.4426950408889634;
  // one launch a direction (each its lists' span; the second reuses the scratch)
  for (int d = 0; d < 2; ++d) {
    if (!(p.lists.direction & (d == 0 ? kI2T : kT2I))) continue;
    const int64_t lists = d == 0 ? n : m, len = d == 0 ? m : n;
    const int e = launch(forward_lists<T, R>, static_cast<unsigned>(smooth_ndcg_list_blocks(lists)), kThreads, 0, st,
                         p, d, smooth_ndcg_list_span(len), static_cast<A>(log2e / p.tau), static_cast<A>(1.0 / p.tau),
                         ws, flags, flags + q);
    if (e != 0) return e;
  }
  return launch(finalize_lists<A>, 1, kFinalThreads, 0, st, p.lists, flags, ws, static_cast<A*>(p.out));
}

}  // namespace

int smooth_ndcg_forward(const SmoothNdcgForward& p) {
  if (p.version == 1)  // version 1 reads the relevance matrix only (smooth_ndcg.h)
    return p.rel_i2t.offsets != nullptr ? static_cast<int>(cudaErrorNotSupported) : v1::smooth_ndcg_forward(p);
  return dispatch_graded(p.lists.dt, p.rel_dt, [&](auto types) { return launch_forward(p, types); });
}

// version 2: the forward left G, complete but for the upstream weight: the engine's
// elementwise backward (smooth_rank.cuh), G_t2i transposed
int smooth_ndcg_backward(const SmoothNdcgBackward& p) {
  if (p.version == 1) return v1::smooth_ndcg_backward(p);
  const SmoothRankBackward b{{p.lists, p.mask, p.grad_out, p.ws, p.grad}, p.stream};
  FASTRANK_DISPATCH_CUDA(p.lists.dt, T, { return rank::subset_backward<T>(b); });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
