// Fused Kendall ranking loss on the CPU (SPEC.md 2.2; paper 001, Eq. 17).
//
// Work: O(n_q * n_c^2 / 2): one pass over the unordered pairs (j, k > j) of each query
// gives the loss, the pair count and the whole gradient row. For a pair, at most one of
// r_j > r_k + a ("j above k") and r_k > r_j + a holds (a >= 0), so with
// sgn = [j above k] - [k above j] in {-1, 0, 1} the pair's term is [sgn * (s_k - s_j)]+
// and, when it is > 0, it adds +sgn to d/ds_k and -sgn to d/ds_j (subgradient 0 at a tie).
// The gradient entries are small integers (exact in float) until the final division by
// max(1, cnt). The gradient row is saved, so the backward is one multiply: forward +
// backward cost one pair pass instead of two.
// Memory plan: O(n_c) scratch per thread: the query's row of s, r and r + a copied
// contiguous (whatever the strides) and padded to a multiple of kPad, the gradient
// accumulator and the indices as floats; output dsim (n_q, n_c). Never (n_q, n_c, n_c).
// Vector loop: `#pragma omp simd` over k from j + 1 rounded down to a multiple of kPad
// to the padded end, so every trip is whole vectors (no scalar remainder loop, which
// would dominate at n_c ~ 100); the lanes k <= j and the padding are masked out (padding
// has r = -inf, r + a = +inf, so no pair with it is active). The masks are combined with
// `&`, not `&&`, so the loads are unconditional and GCC keeps the reduction accumulators
// in registers (with `&&` it spills them to the stack: 2x slower).
// Parallelism: OpenMP over queries when the work is large enough (each query is summed by one thread in a fixed order:
// bit-identical run to run).
// r + a is materialised in its own loop so the comparison r_j > (r_k + a) uses the same
// rounded value as the reference (the compiler cannot rewrite it as r_j - r_k > a).
#include "fastrank/kendall.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace fastrank {
namespace cpu {
namespace {

constexpr int64_t kPad = 16;  // a multiple of the float and double vector widths

template <typename T>
void forward_impl(const T* sim, int64_t sim_sq, int64_t sim_sc, const T* rel, int64_t rel_sq,
                  int64_t rel_sc, int64_t n_q, int64_t n_c, T alpha, T* loss, T* dsim) {
  const int64_t n_pad = (n_c + kPad - 1) / kPad * kPad;
  const T inf = std::numeric_limits<T>::infinity();
  // below ~50 us of work a parallel region costs more than it saves (and on a busy
  // machine it can wait a whole time slice for its second thread)
  const bool parallel = n_q > 1 && n_q * n_pad * n_pad / 2 >= (int64_t(1) << 18);
#pragma omp parallel if (parallel)
  {
    std::vector<T> s_buf(n_pad, T(0)), r_buf(n_pad, -inf), ra_buf(n_pad, inf), g_buf(n_pad), kf_buf(n_pad);
    for (int64_t k = 0; k < n_pad; ++k) kf_buf[k] = static_cast<T>(k);
#pragma omp for schedule(static)
    for (int64_t q = 0; q < n_q; ++q) {
      T* __restrict s = s_buf.data();
      T* __restrict r = r_buf.data();
      T* __restrict ra = ra_buf.data();
      T* __restrict g = g_buf.data();
      const T* __restrict kf = kf_buf.data();
      gather_row(sim + q * sim_sq, sim_sc, n_c, s);
      gather_row(rel + q * rel_sq, rel_sc, n_c, r);
      for (int64_t k = 0; k < n_c; ++k) ra[k] = r[k] + alpha;
      std::fill(g, g + n_pad, T(0));
      double total = 0;  // sum of the per-j partial sums
      int64_t cnt = 0;
      for (int64_t j = 0; j < n_c; ++j) {
        const T sj = s[j], rj = r[j], raj = ra[j], jf = kf[j];
        T l_acc = 0, c_acc = 0, g_acc = 0;
#pragma omp simd reduction(+ : l_acc, c_acc, g_acc)
        for (int64_t k = (j + 1) / kPad * kPad; k < n_pad; ++k) {
          const bool after = kf[k] > jf;                             // the pair (j, k > j)
          const T up = (after & (rj > ra[k])) ? T(1) : T(0);    // r_j > r_k + a: [s_k - s_j]+
          const T down = (after & (r[k] > raj)) ? T(1) : T(0);  // r_k > r_j + a: [s_j - s_k]+
          const T sgn = up - down;
          const T x = sgn * (s[k] - sj);
          const T act = x > T(0) ? sgn : T(0);
          l_acc += std::max(x, T(0));
          c_acc += up + down;
          g_acc += act;
          g[k] += act;
        }
        g[j] -= g_acc;
        total += static_cast<double>(l_acc);
        cnt += static_cast<int64_t>(c_acc);  // c_acc <= n_c: exact
      }
      const T denom = static_cast<T>(std::max<int64_t>(cnt, 1));
      loss[q] = static_cast<T>(total) / denom;
      T* out = dsim + q * n_c;
#pragma omp simd
      for (int64_t k = 0; k < n_c; ++k) out[k] = g[k] / denom;
    }
  }
}

}  // namespace

void kendall_forward(DType dt, const void* sim, int64_t sim_sq, int64_t sim_sc, const void* rel,
                     int64_t rel_sq, int64_t rel_sc, int64_t n_q, int64_t n_c, double alpha, void* loss,
                     void* dsim) {
  FASTRANK_DISPATCH_CPU(dt, T,
      forward_impl<T>(static_cast<const T*>(sim), sim_sq, sim_sc, static_cast<const T*>(rel), rel_sq,
                      rel_sc, n_q, n_c, static_cast<T>(alpha), static_cast<T*>(loss),
                      static_cast<T*>(dsim)));
}

}  // namespace cpu
}  // namespace fastrank
