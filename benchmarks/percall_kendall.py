"""Per-call cost of kendall_loss / kendall_sw_loss at small N, one CPU thread (issue 11):
forward+backward against `(sim * relevance).mean().backward()`. CPU time of this thread
(process_time), best of 7 rounds of `reps` calls: robust to a busy machine.

    OMP_NUM_THREADS=1 python benchmarks/percall_kendall.py [N=4] [reps=2000]
"""
import sys, time, torch
torch.set_num_threads(1)
import fastrank
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
g = torch.Generator().manual_seed(0)
sim = torch.randn(n, n, generator=g).requires_grad_(True)
rel = torch.rand(n, n, generator=g)
mask = torch.rand(n, n, generator=g) > 0.2
def best(f):
    for _ in range(50): f()
    out = []
    for _ in range(7):
        t0 = time.process_time()
        for _ in range(reps): f()
        out.append((time.process_time() - t0) / reps)
    return min(out)
def base(): (sim * rel).mean().backward()
cases = {
    "base (sim*rel).mean().backward()": base,
    "kendall_loss": lambda: fastrank.kendall_loss(sim, rel).backward(),
    "kendall_loss mask": lambda: fastrank.kendall_loss(sim, rel, mask=mask).backward(),
    "kendall_sw_loss": lambda: fastrank.kendall_sw_loss(sim, rel).backward(),
}
b = None
for k, f in cases.items():
    t = best(f)
    b = b or t
    print(f"N={n} {k:36s} {t*1e6:8.1f} us  {t/b:5.2f}x base")
