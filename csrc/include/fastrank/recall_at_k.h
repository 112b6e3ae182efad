// Recall@k surrogate kernels (docs/spec.md §2.9; Patel, Tolias, Matas, CVPR 2022): entry points,
// a head of the smooth-rank engine (smooth_rank.h).
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
#include "fastrank/smooth_rank.h"

namespace fastrank {

constexpr int kMaxKs = 32;  // the most ks one call takes (exported to Python: MAX_KS)

namespace cpu {
struct RecallAtKForward : SmoothApForward {
  const double* ks;  // n_k values each, host memory
  const double* tk;
  int n_k;
};
void recall_at_k_forward(const RecallAtKForward& p);
}  // namespace cpu

namespace cuda {
// The CPU forward's fields (ks: host memory, copied into the kernel's arguments), then
// smooth_ap's CUDA ones: derived from the CPU struct, not from cuda::SmoothApForward, so
// that the stream stays the last field (the bindings take the fields in declaration order
// and Python passes the stream last).
struct RecallAtKForward : cpu::RecallAtKForward {
  void* partials;
  void* stream;
};
int recall_at_k_forward(const RecallAtKForward& p);
}  // namespace cuda
}  // namespace fastrank
