// Recall@k surrogate kernels (docs/spec.md §2.9; Patel, Tolias, Matas, CVPR 2022): entry points,
// a head of the smooth-rank engine (smooth_ap.h).
//
// As smooth_ap.h (sim, positives, mask, directions, reductions, workspace), with, per query,
// for j in P: r_j = R_all(j) and, for each of the n_k values k (ks[i], temperature tk[i]):
//   h_k  = sum_{j in P} sigma((k - r_j) / tk)
//   R@k  = min(k, h_k) / min(k, |P|)
//   loss = 1 - (1 / n_k) sum_k R@k; 0 when P is empty.
// (the derivative of min(k, h) is taken as 1 where h <= k, as torch.clamp's.) ks and tk hold
// n_k <= kMaxKs values (host memory on the CPU; passed by value to the CUDA kernels).
#pragma once
#include <cstdint>

#include "fastrank/common.h"
#include "fastrank/smooth_ap.h"

namespace fastrank {

constexpr int kMaxKs = 32;  // the most ks one call takes (exported to Python: MAX_KS)

// Smooth-AP's fields, then the ks (host memory; CUDA copies them into the kernel's arguments).
struct RecallAtKForward : SmoothApForward {
  const double* ks;  // n_k values each, host memory
  const double* tk;
  int n_k;
};
FASTRANK_FIELDS_AFTER(RecallAtKForward, SmoothApForward, ks, tk, n_k)

namespace cpu {
void recall_at_k_forward(const RecallAtKForward& p);
}  // namespace cpu

namespace cuda {
using RecallAtKForward = OnStream<::fastrank::RecallAtKForward>;
int recall_at_k_forward(const RecallAtKForward& p);
}  // namespace cuda
}  // namespace fastrank
