// A C++ driver for the CPU kernels, without Python: for perf (symbols, source lines) and
// for A/B timings of a kernel change in one session. Build with the CPU module's flags
// (CMakeLists.txt) and -g:
//
//   g++ -std=c++17 -O3 -g -fno-math-errno -fassociative-math -fno-signed-zeros -fno-trapping-math
//       -march=native -fopenmp -Icsrc/include benchmarks/cpu_driver.cpp csrc/cpu/smooth_ndcg.cpp
//       csrc/cpu/kendall.cpp csrc/cpu/kendall_sw.cpp -o /tmp/cpu_driver        (one command line)
//
// A/B against an older commit: `git worktree add /tmp/old REV`, then the same command with
// /tmp/old/csrc in place of csrc (the kernel entry points have not changed since 469ffd5).
//   OMP_NUM_THREADS=1 /tmp/cpu_driver smooth_ndcg 128 [reps]   # forward with the gradient pass
//   OMP_NUM_THREADS=1 /tmp/cpu_driver kendall_sw 512 [reps]    # forward, then backward
//   perf record /tmp/cpu_driver smooth_ndcg 128 && perf report --sort srcline
//
// Input: N x N float32, sim ~ N(0, 1), relevance ~ U(0, 1) (seed 0), both directions,
// reduction mean; smooth_ndcg tau = 0.01, kendall_sw alpha = 0.1, beta = 0.05 (18
// windows). Prints the best of 5 rounds of `reps` calls, per call, and the loss.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "fastrank/kendall_sw.h"
#include "fastrank/smooth_ndcg.h"

namespace {

template <typename F>
double best_ms(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  return best * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  using fastrank::DType;
  const std::string op = argc > 1 ? argv[1] : "smooth_ndcg";
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 128;
  const int reps = argc > 3 ? std::atoi(argv[3]) : std::max<int>(1, static_cast<int>(200 * 128 * 128 * 128 / (n * n * n)));
  std::vector<float> sim(n * n), rel(n * n);
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform;
  for (auto& x : sim) x = normal(gen);
  for (auto& x : rel) x = uniform(gen);
  const int both = fastrank::kBoth, mean = fastrank::kMean;
  if (op == "smooth_ndcg") {
    std::vector<float> out(2 * n + 4), ws(fastrank::smooth_ndcg_ws_numel(n, n, both));
    const double ms = best_ms(reps, [&] {
      fastrank::cpu::smooth_ndcg_forward(DType::f32, sim.data(), n, 1, rel.data(), n, 1, nullptr, 0, 0, n, n, both,
                                         mean, 1, 0.01, out.data(), ws.data());
    });
    std::printf("smooth_ndcg n=%lld: %.3f ms per forward (gradient pass included); loss %.6g\n",
                static_cast<long long>(n), ms, out[0]);
  } else if (op == "kendall_sw") {
    const int64_t n_w = 18;
    std::vector<float> loss(2 * n + 4), aux(2 * 2 * n + 2), grad(n * n), go(1, 1.0f);
    std::vector<int32_t> idx(2 * n * n_w * 2);
    const double fwd = best_ms(reps, [&] {
      fastrank::cpu::kendall_sw_forward(DType::f32, DType::f32, sim.data(), n, 1, rel.data(), n, 1, n, n, 0.1, 0.05,
                                        1.0, n_w, both, mean, loss.data(), idx.data(), aux.data());
    });
    const double bwd = best_ms(reps, [&] {
      fastrank::cpu::kendall_sw_backward(DType::f32, sim.data(), n, 1, idx.data(), n_w, aux.data(), go.data(), n, n,
                                         both, mean, grad.data());
    });
    std::printf("kendall_sw n=%lld: forward %.3f ms, backward %.3f ms per call; loss %.6g\n",
                static_cast<long long>(n), fwd, bwd, loss[0]);
  } else {
    std::fprintf(stderr, "op must be smooth_ndcg or kendall_sw, got %s\n", op.c_str());
    return 2;
  }
  return 0;
}
