// Smooth-AP on the CPU (docs/spec.md §2.8): the smooth-rank engine's subset pass (smooth_rank.h)
// with the positives as rows, each ranked among the whole list (R_all) and among the
// positives (R_pos), and this head: AP from the two ranks, and their coefficients
//   u_j = d loss / d R_all(j) = R_pos(j) / (|P| R_all(j)^2)
//   v_j = d loss / d R_pos(j) = -1 / (|P| R_all(j)).
// The backward (shared with Recall@k) is the engine's elementwise pass over the saved G.
#include "fastrank/smooth_ap.h"

#include "smooth_rank.h"

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

template <typename T>
void forward_impl(const T* sim, int64_t ss0, int64_t ss1, const uint8_t* pos, int64_t ps0, int64_t ps1,
                  const uint8_t* mask, int64_t ms0, int64_t ms1, int64_t n, int64_t m, int direction,
                  int reduction, bool with_grad, T tau, T* out, T* ws) {
  subset_forward<T>(ApHead<T>{}, sim, ss0, ss1, pos, ps0, ps1, mask, ms0, ms1, n, m, direction, reduction,
                    with_grad, tau, out, ws);
}

}  // namespace

void smooth_ap_forward(DType dt, const void* sim, int64_t ss0, int64_t ss1, const uint8_t* pos, int64_t ps0,
                       int64_t ps1, const uint8_t* mask, int64_t ms0, int64_t ms1, int64_t n, int64_t m,
                       int direction, int reduction, int with_grad, double tau, void* out, void* ws) {
  FASTRANK_DISPATCH_CPU(dt, T,
      forward_impl<T>(static_cast<const T*>(sim), ss0, ss1, pos, ps0, ps1, mask, ms0, ms1, n, m, direction,
                      reduction, with_grad != 0, static_cast<T>(tau), static_cast<T*>(out), static_cast<T*>(ws)));
}

void smooth_rank_backward(DType dt, const uint8_t* mask, int64_t ms0, int64_t ms1, int64_t n, int64_t m,
                          int direction, int reduction, const void* grad_out, int64_t gs, const void* ws,
                          void* grad) {
  FASTRANK_DISPATCH_CPU(dt, T,
      backward_elementwise<T>(smooth_rank_layout(n, m, direction), mask, ms0, ms1, n, m, reduction,
                              static_cast<const T*>(grad_out), gs, static_cast<const T*>(ws),
                              static_cast<T*>(grad), [](int, int64_t) { return T(1); }));
}

}  // namespace cpu
}  // namespace fastrank
