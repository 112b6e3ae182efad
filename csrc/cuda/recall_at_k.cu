// The Recall@k surrogate on CUDA (docs/spec.md §2.9): the smooth-rank engine's positive-row
// kernels (smooth_rank.cuh: tiling, memory plan, launches) with this head: per k the smooth
// count h_k = sum_j sigma((k - r_j) / tk) of the positives in the top k, R@k =
// min(k, h_k) / min(k, |P|), and each rank's coefficient
//   u_j = (1 / n_k) sum_{k : h_k <= k} sigma'((k - r_j) / tk) / (tk min(k, |P|)).
// ks and their temperatures travel by value in the head (at most kMaxKs): no host-device
// copy. The backward is Smooth-AP's (smooth_ap.cu: smooth_rank_backward).
#include <cuda_runtime.h>

#include "fastrank/recall_at_k.h"
#include "smooth_rank.cuh"

namespace fastrank {
namespace cuda {
namespace {

struct RecallHead {
  static constexpr bool kFlagged = false;  // the ranks among the whole list only
  static constexpr int kStats = kMaxKs;    // h_k for each k
  double ks[kMaxKs];
  double tk[kMaxKs];
  int n_k;
  __device__ int n_stats() const { return n_k; }
  template <typename A> __device__ A stat(int i, A a, A) const { return logistic_pos((A(ks[i]) - a) / A(tk[i])); }
  template <typename A> __device__ A loss(const A* h, A np) const {
    A recall = 0;
    for (int i = 0; i < n_k; ++i) {
      const A k = A(ks[i]);
      recall += (h[i] < k ? h[i] : k) / (np < k ? np : k);
    }
    return A(1) - recall / A(n_k);
  }
  template <typename A> __device__ void coef(A a, A, const A* h, A np, A* u, A* v) const {
    A g = 0;
    for (int i = 0; i < n_k; ++i) {
      const A k = A(ks[i]), t = A(tk[i]);
      if (h[i] <= k) g += logistic_deriv((k - a) / t) / (t * (np < k ? np : k));  // the clip passes at h == k
    }
    *u = g / A(n_k);
    *v = A(0);
  }
};

}  // namespace

int recall_at_k_forward(const RecallAtKForward& p) {
  if (p.n_k < 1 || p.n_k > kMaxKs) return static_cast<int>(cudaErrorInvalidValue);
  RecallHead head{};
  for (int i = 0; i < p.n_k; ++i) {
    head.ks[i] = p.ks[i];
    head.tk[i] = p.tk[i];
  }
  head.n_k = p.n_k;
  FASTRANK_DISPATCH_CUDA(p.lists.dt, T, { return rank::subset_forward<T>(head, p); });
  return 0;
}

}  // namespace cuda
}  // namespace fastrank
