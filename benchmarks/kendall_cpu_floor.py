"""Kendall CPU kernel against a CPU floor of its per-pair arithmetic (issue 12, CPU half).

    python benchmarks/kendall_cpu_floor.py            # N = 512, one thread
    python benchmarks/kendall_cpu_floor.py --n 1024

The floor: the full Kendall loss needs, per unordered pair (j, k) and direction, at least
a compare (r_j > r_k + alpha), a select and an add. A tight C++ loop doing exactly that
(`acc += r_j > ra[k] ? s[k] : 0` over whole AVX vectors, four independent accumulators
so the add latency does not bound it, data in L1) is compiled with the CPU module's
flags and timed; its time per pair times the N*M*(M-1)/2 + M*N*(N-1)/2 unordered pairs
of both directions is the floor. The kernel (forward + backward, both directions,
reduction mean) is timed through the public fastrank.kendall_loss. Times are CPU time of
the calling thread (robust to other processes on a shared machine), best of 5.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

FLOOR_CPP = r"""
#include <cstdio>
#include <ctime>
#include <vector>
#include <random>
static double now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main() {
  const long np = 512, Q = np / 4, rows = 2048;
  std::mt19937 g(0);
  std::uniform_real_distribution<float> u;
  std::vector<float> s(np), ra(np);
  for (long i = 0; i < np; ++i) { s[i] = u(g) - 0.5f; ra[i] = u(g) + 0.1f; }
  double best = 1e9;
  float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now();
    for (long q = 0; q < rows; ++q) {
      for (long j = 0; j < np; ++j) {
        const float rj = ra[j] - 0.1f + q * 1e-7f;
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        const float* __restrict sp = s.data();
        const float* __restrict rp = ra.data();
#pragma omp simd reduction(+ : a0, a1, a2, a3)
        for (long k = 0; k < Q; ++k) {
          a0 += rj > rp[k] ? sp[k] : 0.0f;
          a1 += rj > rp[k + Q] ? sp[k + Q] : 0.0f;
          a2 += rj > rp[k + 2 * Q] ? sp[k + 2 * Q] : 0.0f;
          a3 += rj > rp[k + 3 * Q] ? sp[k + 3 * Q] : 0.0f;
        }
        sink += a0 + a1 + a2 + a3;
      }
    }
    const double t = now() - t0;
    best = t < best ? t : best;
  }
  std::printf("%.6e %g\n", best / (double(rows) * np * np), sink);
}
"""

FLAGS = ["-O3", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math",
         "-march=native", "-fopenmp", "-std=gnu++17"]


def floor_seconds_per_pair() -> float:
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "floor.cpp"), os.path.join(d, "floor")
        with open(src, "w") as f:
            f.write(FLOOR_CPP)
        subprocess.run([os.environ.get("CXX", "c++"), *FLAGS, src, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    return float(out.split()[0])


def kernel_seconds(n: int, m: int) -> float:
    import torch

    import fastrank
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    sim = torch.randn(n, m, generator=g).requires_grad_(True)
    rel = torch.rand(n, m, generator=g)

    def call():
        sim.grad = None
        fastrank.kendall_loss(sim, rel, impl="native").backward()

    call()
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        call()
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    n = m = args.n
    per_pair = floor_seconds_per_pair()
    pairs = n * m * (m - 1) // 2 + m * n * (n - 1) // 2
    floor = per_pair * pairs
    t = kernel_seconds(n, m)
    print(f"floor: {per_pair * 1e9:.3f} ns per pair (compare + select + add, AVX, L1) x {pairs} pairs "
          f"= {floor * 1e3:.2f} ms")
    print(f"kendall_loss fwd+bwd, both directions, N = M = {n}, one thread: {t * 1e3:.2f} ms "
          f"= {t / floor:.2f}x floor")


if __name__ == "__main__":
    main()
