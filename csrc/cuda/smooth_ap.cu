// Smooth-AP on CUDA (docs/spec.md §2.8): the smooth-rank engine's positive-row kernels
// (smooth_rank.cuh: tiling, memory plan, launches) with this head: AP from each positive's
// rank among the list (A) and among the positives (B), and their coefficients
//   u_j = d loss / d A_j = B_j / (|P| A_j^2),   v_j = d loss / d B_j = -1 / (|P| A_j).
// The elementwise backward, shared with Recall@k, is defined here too.
#include <cuda_runtime.h>

#include "fastrank/smooth_ap.h"
#include "smooth_rank.cuh"

namespace fastrank {
namespace cuda {
namespace {

struct ApHead {
  static constexpr bool kFlagged = true;  // needs B, the ranks among the positives
  static constexpr int kStats = 1;        // sum_j B_j / A_j
  __device__ int n_stats() const { return 1; }
  template <typename A> __device__ A stat(int, A a, A b) const { return b / a; }
  template <typename A> __device__ A loss(const A* totals, A np) const { return A(1) - totals[0] / np; }
  template <typename A> __device__ void coef(A a, A b, const A*, A np, A* u, A* v) const {
    *u = b / (np * a * a);
    *v = -A(1) / (np * a);
  }
};

}  // namespace

int smooth_ap_forward(const SmoothApForward& p) {
  FASTRANK_DISPATCH_CUDA(p.lists.dt, T, { return rank::subset_forward<T>(ApHead{}, p); });
  return 0;
}

// masked entries of G are 0: the backward reads no mask
int smooth_rank_backward(const SmoothRankBackward& p) {
  FASTRANK_DISPATCH_CUDA(p.lists.dt, T, { return rank::subset_backward<T>(p); });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
