// The CPU kernels without Python, for the cpu_kernels case (benchmarks/cases/cpu_kernels.py),
// which builds this file with the CPU module's flags and -g and runs it: kernel-only times, and
// A/B of a kernel change against another source tree (--kernel-src) in one run. Also for perf:
//   perf record BINARY smooth_ndcg 128 && perf report --sort srcline
//
// Usage: BINARY OP N [reps] [rounds]   (OP: smooth_ndcg or kendall_sw; OMP_NUM_THREADS as wanted)
// Input: N x N float32, sim ~ N(0, 1), relevance ~ U(0, 1) (seed 0), both directions,
// reduction mean; smooth_ndcg tau = 0.01 (its forward includes the gradient pass),
// kendall_sw alpha = 0.1, beta = 0.05 (18 windows), forward then backward.
// Prints one line per timed pass: "OP PASS N ms_per_call_round1 ms_round2 ...", then "loss X".
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
std::vector<double> round_ms(int reps, int rounds, F&& f) {
  std::vector<double> out;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps * 1e3);
  }
  return out;
}

void print(const char* op, const char* pass, int64_t n, const std::vector<double>& ms) {
  std::printf("%s %s %lld", op, pass, static_cast<long long>(n));
  for (double m : ms) std::printf(" %.6g", m);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  using fastrank::DType;
  const std::string op = argc > 1 ? argv[1] : "smooth_ndcg";
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 128;
  const int reps = argc > 3 ? std::atoi(argv[3]) : std::max<int>(1, static_cast<int>(200 * 128 * 128 * 128 / (n * n * n)));
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  std::vector<float> sim(n * n), rel(n * n);
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform;
  for (auto& x : sim) x = normal(gen);
  for (auto& x : rel) x = uniform(gen);
  const int both = fastrank::kBoth, mean = fastrank::kMean;
  if (op == "smooth_ndcg") {
    std::vector<float> out(2 * n + 4), ws(fastrank::smooth_rank_ws_numel(n, n, both));
    fastrank::SmoothNdcgForward p{};  // no top-k lists, version and pair pass by default, no partials
    p.lists = {DType::f32, n, n, both, mean};
    p.rel_dt = DType::f32;
    p.sim = {sim.data(), n, 1};
    p.rel = {rel.data(), n, 1};
    p.mask = {nullptr, 0, 0};
    p.tau = 0.01;
    p.with_grad = true;
    p.out = out.data();
    p.ws = ws.data();
    print("smooth_ndcg", "forward", n, round_ms(reps, rounds, [&] { fastrank::cpu::smooth_ndcg_forward(p); }));
    std::printf("loss %.6g\n", out[0]);
  } else if (op == "kendall_sw") {
    const int64_t n_w = 18;
    std::vector<float> loss(2 * n + 4), aux(2 * 2 * n + 2), grad(n * n), go(1, 1.0f);
    std::vector<int32_t> idx(2 * n * n_w * 2);
    fastrank::KendallSwForward f;
    f.lists = {DType::f32, n, n, both, mean};
    f.rel_dt = DType::f32;
    f.sim = {sim.data(), n, 1};
    f.rel = {rel.data(), n, 1};
    f.alpha = 0.1;
    f.beta = 0.05;
    f.hi = 1.0;
    f.n_w = n_w;
    f.loss = loss.data();
    f.idx = idx.data();
    f.aux = aux.data();
    fastrank::KendallSwBackward b;
    b.lists = f.lists;
    b.sim = f.sim;
    b.idx = idx.data();
    b.n_w = n_w;
    b.aux = aux.data();
    b.grad_out = go.data();
    b.grad = grad.data();
    print("kendall_sw", "forward", n, round_ms(reps, rounds, [&] { fastrank::cpu::kendall_sw_forward(f); }));
    print("kendall_sw", "backward", n, round_ms(reps, rounds, [&] { fastrank::cpu::kendall_sw_backward(b); }));
    std::printf("loss %.6g\n", loss[0]);
  } else {
    std::fprintf(stderr, "op must be smooth_ndcg or kendall_sw, got %s\n", op.c_str());
    return 2;
  }
  return 0;
}
