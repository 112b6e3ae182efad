// Fused smooth-NDCG on CUDA, version 2 (docs/spec.md §2.1, 2.1a; Listwise ITR, Eq. 16-21).
//
// One call = 1 launch a direction + 1 reduction forward, 1 elementwise backward, for
// every N and direction; no host sync, no atomics, bit-identical run to run. Version 1 (the
// thread-per-element tiles, smooth_ndcg_v1.cu) stays in the build: FASTRANK_CUDA_KERNELS=v1
// selects it per call (launch.h, kernel_version), so one run times both.
//
// forward_lists: one launch a direction, a block of 8 warps per list (grid-strided over the
// direction's lists, at most kSmoothNdcgListBlocks blocks, each with its own scratch sized by
// the direction's list length). Per list, of C items (C = m for a row, n for a column):
//  1. setup (list_setup, reusable by a sparse-gain path beside the dense pair pass): the
//     list's scores gathered into the scratch `y` (one strided pass over its row or column;
//     -inf for a masked item and for the padding up to the power of two Cs, so that the pair
//     passes test no mask), its gains into `acc`, then the ideal DCG from the gains sorted in
//     the scratch (a bitonic sort of Cs values, Cs log^2 Cs / 4 compare-exchanges; the IDCG is
//     a function of the relevance alone, out of the pair loops);
//  2. the rank pass over the unordered pairs (pair_pass): pi_j = 1 + sum_k sigma((s_k - s_j) / tau);
//  3. per item f(pi), f'(pi): the DCG (a block sum), the loss, and a_j = g_j f'(pi_j) in `a`;
//  4. with a gradient, the gradient pass over the unordered pairs:
//     G_j = sum_k sigma'((s_k - s_j) / tau) (a_k - a_j), written to ws already scaled by the
//     list's factor -1 / (tau IDCG): the backward only multiplies by the upstream weight
//     (the smooth-rank engine's elementwise backward, smooth_rank.cuh; G_t2i stored
//     transposed, (m, n), so that a column's writes are contiguous).
// The unordered pairs: the list is cut into tiles of 32 items; every unordered pair of
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
// Memory: per block of the grid a scratch of 3 (Cs + 32) accumulation-type values (y, acc,
// a; L1/L2-resident), partials = Q list flags + that; ws = G per direction (n * m each),
// idcg, qloss, counts (smooth_rank.h). Shared memory: 8 warps x 64 (score, a) pairs.
// NaN (docs/spec.md §1): poison(s + r) of every item is added to the DCG and to a_j, so it
// reaches the loss and every gradient entry of the list; a NaN gain makes the IDCG NaN.
#include <cuda_runtime.h>

#include <limits>

#include "fastrank/launch.h"
#include "fastrank/smooth_ndcg.h"
#include "smooth_rank.cuh"

namespace fastrank {
namespace cuda {
namespace v1 {
int smooth_ndcg_forward(const SmoothNdcgForward& p);  // smooth_ndcg_v1.cu
int smooth_ndcg_backward(const SmoothNdcgBackward& p);
}  // namespace v1

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kFinalThreads = 256;

using Layout = SmoothRankLayout;  // offsets into ws (smooth_rank.h)

// The clamp of the exponent (log2 units): 2^126 is finite in float, 2^1000 in double.
template <typename A> __device__ __forceinline__ A exp2_cap();
template <> __device__ __forceinline__ float exp2_cap<float>() { return 126.0f; }
template <> __device__ __forceinline__ double exp2_cap<double>() { return 1000.0; }

// One list of the call: item c of list q is element (q, c) of sim (a row) or (c, q) (a column).
struct ListRef {
  int64_t q, s_q, s_c, r_q, r_c, m_q, m_c, len, out_q, out_c;
};

// The scratch of one block: y (the scores), acc (the gains, then the sums), a (the weights).
template <typename A> struct Scratch {
  A* y;
  A* acc;
  A* a;
};

// 1. The list's setup: y = the scores (-inf outside the list and in the padding), the ideal
// DCG. Returns the IDCG (NaN when a valid gain is NaN); *nv = the list's valid items.
template <typename T, typename R, typename A>
__device__ A list_setup(const ListRef& L, const T* sim, const R* rel, const uint8_t* mask, int64_t cs,
                        const Scratch<A>& w, A* red, A* nv) {  // cs: the list's span (a power of two)
  const A ninf = -std::numeric_limits<A>::infinity();
  A count = 0, nan_gain = 0;
  for (int64_t c = threadIdx.x; c < cs + 32; c += kThreads) {
    const bool ok = c < L.len && (mask == nullptr || mask[L.q * L.m_q + c * L.m_c] != 0);
    const A g = ok ? ndcg_gain(load(rel[L.q * L.r_q + c * L.r_c])) : ninf;
    w.y[c] = ok ? load(sim[L.q * L.s_q + c * L.s_c]) : ninf;
    if (c < cs) w.acc[c] = g == g ? g : ninf;  // sorted below (a NaN gain is counted, not sorted)
    count += ok ? A(1) : A(0);
    nan_gain += g != g ? A(1) : A(0);
  }
  *nv = block_sum(count, red);
  const A nans = block_sum(nan_gain, red);  // its barriers also end the gather
  // bitonic sort of acc[0, cs) into descending order (cs a power of two)
  for (int64_t k = 2; k <= cs; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = threadIdx.x; i < cs; i += kThreads) {
        const int64_t l = i ^ j;
        if (l > i) {
          const A x = w.acc[i], z = w.acc[l];
          if (((i & k) == 0) == (x < z)) {  // descending where (i & k) == 0
            w.acc[i] = z;
            w.acc[l] = x;
          }
        }
      }
      __syncthreads();
    }
  }
  // IDCG = sum_p g_(p) / log2(1 + p), p = 1 .. nv (Eq. 18)
  A ideal = 0;
  const int64_t n_valid = static_cast<int64_t>(*nv);
  for (int64_t p = threadIdx.x; p < n_valid; p += kThreads) ideal += w.acc[p] * ndcg_discount(static_cast<A>(p + 1));
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
  const A yj = w.y[j];
  const A aj = kGrad ? w.a[j] : A(0);
  buf[lane][0] = buf[lane + 32][0] = w.y[k];
  if (kGrad) buf[lane][1] = buf[lane + 32][1] = w.a[k];
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
    w.acc[j] += sj + sk;
  } else {
    w.acc[j] += sj;
    w.acc[k] += sk;
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

template <typename T, typename R>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(4, 2))
forward_lists(const SmoothNdcgForward p, int t2i, int64_t cs, acc_t<T> c2, acc_t<T> inv_tau,
              acc_t<T>* __restrict__ ws, acc_t<T>* __restrict__ flags, acc_t<T>* scratch) {
  using A = acc_t<T>;
  __shared__ A buf[kWarps][64][2];
  __shared__ A red[kThreads];
  const T* sim = static_cast<const T*>(p.sim.data);
  const R* rel = static_cast<const R*>(p.rel.data);
  const uint8_t* mask = p.mask.data;
  const int64_t n = p.lists.n, m = p.lists.m;
  const Layout L = smooth_rank_layout(n, m, p.lists.direction);
  const int64_t stride = cs + 32;
  const Scratch<A> w{scratch + 3 * stride * blockIdx.x, scratch + 3 * stride * blockIdx.x + stride,
                     scratch + 3 * stride * blockIdx.x + 2 * stride};
  A (*wbuf)[2] = buf[threadIdx.x / 32];
  const int64_t q_end = t2i ? L.nq2 : L.nq1, q_off = t2i ? L.nq1 : 0;  // this launch's direction
  for (int64_t q = blockIdx.x; q < q_end; q += gridDim.x) {
    const int64_t qg = q_off + q;
    const ListRef list = t2i ? ListRef{q, p.sim.s1, p.sim.s0, p.rel.s1, p.rel.s0, p.mask.s1, p.mask.s0, n, n, 1}
                             : ListRef{q, p.sim.s0, p.sim.s1, p.rel.s0, p.rel.s1, p.mask.s0, p.mask.s1, m, m, 1};
    auto valid = [&](int64_t c) { return c < list.len && (mask == nullptr || mask[q * list.m_q + c * list.m_c] != 0); };
    int64_t cl = 32;  // this list's span: its length rounded up to a power of two >= 32
    while (cl < list.len) cl <<= 1;
    A nv;
    const A ideal = list_setup<T, R, A>(list, sim, rel, mask, cl, w, red, &nv);
    const int tiles = static_cast<int>((list.len + 31) / 32);
    for (int64_t c = threadIdx.x; c < cl + 32; c += kThreads) w.acc[c] = A(0);
    __syncthreads();
    pair_pass<false>(tiles, c2, w, wbuf);
    // 3. Eq. 17: DCG = sum_j g_j / log2(1 + pi_j); a_j = g_j * d/dpi [1 / log2(1 + pi)](pi_j)
    A dcg = 0;
    for (int64_t c = threadIdx.x; c < cl + 32; c += kThreads) {
      A a = 0;
      if (valid(c)) {
        const A s = load(sim[q * list.s_q + c * list.s_c]), r = load(rel[q * list.r_q + c * list.r_c]);
        const A g = ndcg_gain(r), pi = A(1) + w.acc[c], z = poison(s + r);
        A f, fd;
        ndcg_discounts(pi, log1p(pi), &f, &fd);
        dcg += g * f + z;
        a = g * fd + z;
      }
      w.a[c] = a;
    }
    dcg = block_sum(dcg, red);  // its barriers also publish a
    // Eq. 18, 20-21: loss = 1 - DCG / IDCG, 0 when IDCG <= 0 (still poisoned by a NaN)
    const A loss = (ideal > A(0) ? A(1) - dcg / ideal : A(0)) + poison(dcg);
    if (threadIdx.x == 0) {
      ws[L.idcg + qg] = ideal;
      ws[L.qloss + qg] = loss;
      flags[qg] = nv > A(0) ? A(1) : A(0);
      if (p.lists.reduction == kNone) static_cast<A*>(p.out)[qg] = loss;
    }
    if (p.with_grad) {
      for (int64_t c = threadIdx.x; c < cl + 32; c += kThreads) w.acc[c] = A(0);
      __syncthreads();
      pair_pass<true>(tiles, c2, w, wbuf);
      // d loss / d s_j = -(1 / (tau IDCG)) G_j (0 for a constant loss, unless non-finite)
      const A coef = -inv_tau / ideal;
      A* G = ws + (t2i ? L.a2 : L.a1) + q * list.len;  // row q of G_i2t, or of G_t2i^T
      for (int64_t c = threadIdx.x; c < list.len; c += kThreads) {
        const A sum = w.acc[c];
        G[c] = valid(c) ? (ideal > A(0) ? coef * sum : poison(sum)) : A(0);
      }
    }
    __syncthreads();  // the next list reuses the scratch
  }
}

// The reduction (one block): per direction the count of the lists with a valid item and, for
// mean / sum, the loss. Fixed summation order.
template <typename A>
__global__ void __launch_bounds__(kFinalThreads)
finalize_lists(Lists lists, const A* __restrict__ flags, A* __restrict__ ws, A* __restrict__ out) {
  __shared__ A scratch[kFinalThreads];
  const Layout L = smooth_rank_layout(lists.n, lists.m, lists.direction);
  A total = 0;
  const int64_t off[2] = {0, L.nq1}, len[2] = {L.nq1, L.nq2};
  for (int d = 0; d < 2; ++d) {
    A sum = 0, cnt = 0;
    for (int64_t q = off[d] + threadIdx.x; q < off[d] + len[d]; q += blockDim.x) {
      sum += ws[L.qloss + q];
      cnt += flags[q];
    }
    add_direction(sum, cnt, lists.reduction, scratch, ws + L.counts + d, total);
  }
  if (threadIdx.x == 0 && lists.reduction != kNone) out[0] = total;
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
  if (kernel_version() == 1) return v1::smooth_ndcg_forward(p);
  return dispatch_graded(p.lists.dt, p.rel_dt, [&](auto types) { return launch_forward(p, types); });
}

// version 2: the forward left G, complete but for the upstream weight: the engine's
// elementwise backward (smooth_rank.cuh), G_t2i transposed
int smooth_ndcg_backward(const SmoothNdcgBackward& p) {
  if (kernel_version() == 1) return v1::smooth_ndcg_backward(p);
  const SmoothRankBackward b{p.lists, p.grad_out, p.ws, p.grad, p.stream};
  FASTRANK_DISPATCH_CUDA(p.lists.dt, T, { return rank::subset_backward<T>(b); });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
