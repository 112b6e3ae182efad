// Smooth-AP on the CPU (docs/spec.md §2.8): the smooth-rank engine's subset pass (subset_heads.h)
// with the positives as rows, each ranked among the whole list (R_all) and among the
// positives (R_pos), and this head: AP from the two ranks, and their coefficients
//   u_j = d loss / d R_all(j) = R_pos(j) / (|P| R_all(j)^2)
//   v_j = d loss / d R_pos(j) = -1 / (|P| R_all(j)).
// The backward (shared with Recall@k) is the engine's elementwise pass over the saved G.
#include "fastrank/smooth_ap.h"

#include "subset_heads.h"

namespace fastrank {
namespace cpu {
namespace {

using namespace rank;

template <typename T> struct ApHead {
  static constexpr bool kFlagged = true;  // needs R_pos
  T loss(int64_t np, const T* A, const T* B, T* u, T* v) const {
    T sum = 0;  // sum_j R_pos(j) / R_all(j), in row order
    for (int64_t r = 0; r < np; ++r) sum += B[r] / A[r];
    const T inv_p = T(1) / static_cast<T>(np);
    for (int64_t r = 0; r < np; ++r) {
      u[r] = B[r] * inv_p / (A[r] * A[r]);
      v[r] = -inv_p / A[r];
    }
    return T(1) - sum * inv_p;  // 1 - AP
  }
};

}  // namespace

void smooth_ap_forward(const SmoothApForward& p) {
  FASTRANK_DISPATCH_CPU(p.lists.dt, T, subset_forward<T>(ApHead<T>{}, p));
}

void smooth_rank_backward(const SmoothRankBackward& p) {
  const int64_t n = p.lists.n, m = p.lists.m;
  FASTRANK_DISPATCH_CPU(p.lists.dt, T,
      backward_elementwise<T>(smooth_rank_layout(n, m, p.lists.direction), p.mask.data, p.mask.s0, p.mask.s1, n, m,
                              p.lists.reduction, static_cast<const T*>(p.grad_out.data), p.grad_out.s,
                              static_cast<const T*>(p.ws), static_cast<T*>(p.grad),
                              [](int, int64_t) { return T(1); }));
}

}  // namespace cpu
}  // namespace fastrank
