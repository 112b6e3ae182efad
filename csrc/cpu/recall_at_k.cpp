// The Recall@k surrogate on the CPU (docs/spec.md §2.9): the smooth-rank engine's subset pass
// (subset_heads.h) with the positives as rows, each ranked among the whole list, and this
// head: per k, the smooth count h_k = sum_j sigma((k - r_j) / tk) of the positives in the top
// k, R@k = min(k, h_k) / min(k, |P|), and each rank's coefficient
//   u_j = d loss / d r_j = (1 / n_k) sum_{k : h_k <= k} sigma'((k - r_j) / tk) / (tk min(k, |P|)).
// The backward is Smooth-AP's (smooth_ap.cpp: smooth_rank_backward).
#include "fastrank/recall_at_k.h"

#include "subset_heads.h"

namespace fastrank {
namespace cpu {
namespace {

using namespace rank;

template <typename T> struct RecallHead {
  static constexpr bool kFlagged = false;  // the ranks among the whole list only
  const double* ks;
  const double* tk;
  int n_k;
  T loss(int64_t np, const T* A, const T*, T* u, T*) const {
    for (int64_t r = 0; r < np; ++r) u[r] = 0;
    T recall = 0;
    for (int i = 0; i < n_k; ++i) {
      const T k = static_cast<T>(ks[i]), inv_t = T(1) / static_cast<T>(tk[i]);
      T h = 0;  // in row order
      for (int64_t r = 0; r < np; ++r) h += logistic_pos((k - A[r]) * inv_t);
      const T denom = std::min(k, static_cast<T>(np));
      recall += std::min(k, h) / denom;
      if (h <= k) {  // the clip at k passes the gradient (torch.clamp's convention at h == k)
        const T c = inv_t / denom;
        for (int64_t r = 0; r < np; ++r) u[r] += logistic_deriv((k - A[r]) * inv_t) * c;
      }
    }
    const T inv_n = T(1) / static_cast<T>(n_k);
    for (int64_t r = 0; r < np; ++r) u[r] *= inv_n;
    return T(1) - recall * inv_n;
  }
};

}  // namespace

void recall_at_k_forward(const RecallAtKForward& p) {
  FASTRANK_DISPATCH_CPU(p.lists.dt, T, subset_forward<T>(RecallHead<T>{p.ks, p.tk, p.n_k}, p));
}

}  // namespace cpu
}  // namespace fastrank
