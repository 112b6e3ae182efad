#!/usr/bin/env bash
# One command for a CUDA machine (no package registry needed), under 9 minutes on an H100:
#   1. the machine and the tools (preflight);
#   2. build and install fastrank with its CUDA kernels (pip install --no-build-isolation .,
#      sm_90 only unless FASTRANK_CUDA_ARCHS says otherwise), at most GPU_CHECK_BUILD_S (300) s;
#   3. python -m fastrank info; then python -m fastrank check (every native op against the
#      pure-PyTorch reference on the CPU at each level and on the GPU under each kernel version,
#      float32, float64, bfloat16: what a user runs after installing), at most GPU_CHECK_CHECK_S
#      (default 120) s, its lines in check.log;
#   4. the CUDA tests first (pytest -k cuda, less the CPU-side emulator and ptxas checks that CI
#      runs anyway), at most GPU_CHECK_TESTS_S (default 180) s; their counts, the commit and the GPU
#      as cuda-<date>-tests.json (benchmarks/gpu_tests.py, from pytest's JUnit XML: none when the
#      tests were cut), the evidence the docs' CUDA status is drawn from (benchmarks/cuda_status.py);
#      then the kernel versions side by side (benchmarks/kernel_versions.py: v1 and v2 of each op
#      alternated in one process, their agreement, the issue-time model's prediction beside
#      each), at most GPU_CHECK_VERSIONS_S (default 150) s: did v2 win, by how much, was the
#      model right;
#   5. the floors and per-call cases (python -m benchmarks floors percall --device cuda: the
#      GPU's copy, exp, FMA and matmul rates; one forward+backward call at N = 4 .. 512, native /
#      trivial / reference / CUDA graph), at most GPU_CHECK_PERCALL_S (default 100) s;
#      then N = 128 alone for smooth_ndcg, kendall and kendall_sw against torch.compile (their
#      per-call targets; each compilation takes 35 to 75 s on an H100 machine's host), at most
#      GPU_CHECK_COMPILED_S (default 150) s;
#   6. kernel profiles: Nsight Compute (ncu, when present) over one call of the ops furthest
#      from their floors (benchmarks/profile_call.py; speed of light, memory workload,
#      occupancy), one CSV each, at most GPU_CHECK_PROFILE_S (default 120) s in all;
#   7. the smooth-rank engine in float32 and bfloat16 (python -m benchmarks sweep --impls native
#      --ops smooth_ap,smooth_ap_classes,recall_at_k, once per dtype), at most GPU_CHECK_DTYPE_S
#      (default 40) s each;
#      then smooth_ndcg forward+backward at N = 4096 alone (its large-N target), at most 60 s;
#   8. the slate case (python -m benchmarks slate --device cuda), at most GPU_CHECK_SLATE_S
#      (default 60) s;
#      then the graded loss alone against the batch size (python -m benchmarks loss_scale
#      --device cuda: every pair, the sparse path, a TopKRelevance and from the embeddings, up
#      to n = 65,536), at most GPU_CHECK_LOSS_SCALE_S (default 60) s;
#   9. the size sweep on the GPU (python -m benchmarks sweep --device cuda --order breadth --huge):
#      breadth-first, every op at its small sizes, then medium, then large, so that the time
#      limit cuts the largest sizes and never a whole op; with the time that is left.
# Every step is time-limited so that the script ends before GPU_CHECK_BUDGET_S (default 540 s
# = 9 min) have passed; a step that is cut still leaves what it measured, as
# <name>.partial.json (complete: false; the result name is only for a finished run).
# Everything (logs, results JSON, markdown, PNG plots) goes under one folder:
#   benchmarks/gpu_check.sh [OUT_DIR]      (default benchmarks/gpu-check-<date>)
# The result files (cuda-<date>-<case>.json, .md, .png) are in the one layout: copy them to
# benchmarks/results/ to publish them (python -m benchmarks report then draws the README tables, and
# the CUDA status of the README and docs: which sources ran on a GPU as they are now),
# and the profiles (cuda-<date>-ncu-<op>-<n>-<direction>-<dtype>.csv) to benchmarks/results/profiles/.
# Needs: python with a CUDA build of torch, nvcc, cmake, ninja (optional), setuptools, pybind11.
# On a machine whose python is python3 and that returns few files (the device tool: 8 at most):
#   PYTHON=python3 PYTHONUNBUFFERED=1 bash benchmarks/gpu_check.sh /tmp/gc; tar czf "$OUT/gc.tgz" -C /tmp gc
# Exit status: 0 when every step passed (a step cut by its time limit is reported as cut, not
# failed: it keeps what it measured); otherwise the number of the first failed step
# (the step numbers above); after a failure from step 2 on, later steps still run where they can, so the folder holds as much
# as possible.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/benchmarks/gpu-check-$(date +%Y-%m-%d)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUDGET="${GPU_CHECK_BUDGET_S:-540}"
TESTS_S="${GPU_CHECK_TESTS_S:-180}"
PERCALL_S="${GPU_CHECK_PERCALL_S:-100}"
SLATE_S="${GPU_CHECK_SLATE_S:-60}"
PY="${PYTHON:-python}"
START=$SECONDS
FAILED=0
exec > >(tee "$OUT/gpu_check.log") 2>&1

step() { echo; echo "=== [$((SECONDS - START)) s] $*"; }
fail() { echo "!!! step $1 failed: $2"; [ "$FAILED" -eq 0 ] && FAILED=$1; }
# check STEP RC WHAT: a failure, unless RC is timeout's 124 (the step was cut by its limit)
check() { if [ "$2" -eq 124 ]; then echo "--- step $1 cut by its time limit: $3"; elif [ "$2" -ne 0 ]; then fail "$1" "$3"; fi; }
left() { echo $(( BUDGET - (SECONDS - START) )); }          # seconds left of the budget
clamp() { local v=$1; [ "$v" -gt "$2" ] && v=$2; [ "$v" -lt "$3" ] && v=$3; echo "$v"; }  # clamp V MAX MIN
# timed_case STEP CASE MAX: one benchmark case on the GPU, limited to half the time left less 60 s
# (at most MAX, at least 20 s; +20 s for its files), its log CASE.log
timed_case() {
  local t; t=$(clamp $(( ($(left) - 60) / 2 )) "$3" 20)
  echo "time limit: $t s (+20 s)"
  timeout $(( t + 20 )) "$PY" "$ROOT/benchmarks" "$2" --device cuda --out "$OUT" --time-limit "$t" \
    2>&1 | tee "$OUT/$2.log"
  check "$1" "${PIPESTATUS[0]}" "$2 case (see $2.log)"
}

step "1. machine and tools"
date -u
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 && head -15 "$OUT/nvidia-smi.txt" || echo "nvidia-smi not available"
"$PY" - <<'EOF' || fail 1 "preflight: a tool is missing"
import importlib, shutil, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| torch CUDA", torch.version.cuda,
      "| cuda available", torch.cuda.is_available())
missing = [m for m in ("setuptools", "pybind11") if importlib.util.find_spec(m) is None]
missing += [b for b in ("cmake",) if shutil.which(b) is None]
nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if shutil.which("/usr/local/cuda/bin/nvcc") else None)
print("nvcc:", nvcc, "| ninja:", shutil.which("ninja"))
if missing or not nvcc or not torch.cuda.is_available():
    sys.exit(f"missing: {missing + ([] if nvcc else ['nvcc']) + ([] if torch.cuda.is_available() else ['a CUDA device for torch'])}")
EOF
[ "$FAILED" -ne 0 ] && exit "$FAILED"

step "2. build + install (FASTRANK_CUDA=1, archs ${FASTRANK_CUDA_ARCHS:-90})"
# a CMake cache made in another folder cannot be reused
for cache in "$ROOT"/build/temp*/cmake/CMakeCache.txt; do
  [ -f "$cache" ] && ! grep -q "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT\$" "$cache" && rm -rf "$(dirname "$cache")"
done
(
  cd "$ROOT" &&
  FASTRANK_CUDA=1 FASTRANK_CUDA_ARCHS="${FASTRANK_CUDA_ARCHS:-90}" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  timeout "${GPU_CHECK_BUILD_S:-300}" "$PY" -m pip install --no-build-isolation --no-deps --no-index -v . > "$OUT/build.log" 2>&1
) || { tail -40 "$OUT/build.log"; fail 2 "pip install (see build.log)"; }
tail -3 "$OUT/build.log"

# From here on, run outside the source tree so that the installed package (with its
# CUDA module) is imported, not the source folder next to it.
cd "$OUT"

step "3. fastrank info"
"$PY" -m fastrank info | tee "$OUT/info.txt"
"$PY" -c "import fastrank, sys; b = fastrank.backends(); print(fastrank.__file__); sys.exit(0 if b['cuda_available'] else 1)" \
  || fail 3 "fastrank does not see a CUDA device (cuda_available False)"

step "3b. fastrank check (every native op against the reference, every device)"
timeout "${GPU_CHECK_CHECK_S:-120}" "$PY" -m fastrank check 2>&1 | tee "$OUT/check.log"
check 3 "${PIPESTATUS[0]}" "fastrank check: a native op off its reference (see check.log)"

step "4. CUDA tests (first)"
T=$(clamp $(( $(left) - 150 )) "$TESTS_S" 30)
echo "time limit: $T s"
# -k cuda: the tests with cuda in their names, and the CUDA test matrix (-k matches marker names
# too: the cases marked cuda_matrix in tests/test_<op>.py, which tests/conftest.py keeps with a GPU)
rm -f "$OUT/cuda-tests.xml"   # a cut run writes none: an older one must not stand in for it
timeout "$T" "$PY" -m pytest -q -p no:cacheprovider "$ROOT/tests" -k cuda -rs \
  --ignore="$ROOT/tests/test_emulated.py" --ignore="$ROOT/tests/test_cuda_resources.py" \
  --junitxml="$OUT/cuda-tests.xml" 2>&1 | tee "$OUT/cuda-tests.log"
RC=${PIPESTATUS[0]}
[ "$RC" -eq 124 ] && echo "!!! CUDA tests cut after $T s"
[ "$RC" -eq 0 ] || fail 4 "CUDA tests (see cuda-tests.log)"
if [ -f "$OUT/cuda-tests.xml" ]; then
  "$PY" "$ROOT/benchmarks" gpu_tests --junit "$OUT/cuda-tests.xml" --out "$OUT" \
    --selection "pytest -q tests -k cuda, less tests/test_emulated.py and tests/test_cuda_resources.py (gpu_check.sh, step 4)" \
    || fail 4 "the tests result file (gpu_tests)"
fi

step "4b. kernel versions side by side (v1 / v2)"
V=$(clamp $(( $(left) - 240 )) "${GPU_CHECK_VERSIONS_S:-150}" 30)
echo "time limit: $V s (+60 s for the case in flight)"
timeout $(( V + 60 )) "$PY" "$ROOT/benchmarks/kernel_versions.py" --out "$OUT" --time-limit "$V" 2>&1 \
  | tee "$OUT/kernel-versions.log"
check 4 "${PIPESTATUS[0]}" "kernel versions (see kernel-versions.log)"

step "5. floors and per-call cases"
P=$(clamp $(( ($(left) - 60) / 3 )) "$PERCALL_S" 20)
echo "time limit: $P s (+30 s for a compilation in flight)"
timeout $(( P + 30 )) "$PY" "$ROOT/benchmarks" floors percall --device cuda --out "$OUT" --time-limit "$P" \
  --impls native,trivial,reference,cuda_graph --samples 15 2>&1 | tee "$OUT/percall.log"
check 5 "${PIPESTATUS[0]}" "floors / per-call case (see percall.log)"

step "5b. per call against torch.compile at N = 128"
P=$(clamp $(( ($(left) - 150) / 2 )) "${GPU_CHECK_COMPILED_S:-150}" 20)
echo "time limit: $P s (+40 s for a compilation in flight)"
timeout $(( P + 40 )) "$PY" "$ROOT/benchmarks" percall --device cuda --out "$OUT" --time-limit "$P" \
  --ops smooth_ndcg,kendall,kendall_sw --impls native,compiled,cuda_graph --min-n 128 --max-n 128 \
  --samples 15 --tag compiled-128 2>&1 | tee "$OUT/percall-compiled.log"
check 5 "${PIPESTATUS[0]}" "per-call case against torch.compile (see percall-compiled.log)"

step "6. kernel profiles (ncu)"
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
PROF_END=$(( SECONDS + $(clamp $(( ($(left) - 120) / 2 )) "${GPU_CHECK_PROFILE_S:-120}" 20) ))
if [ -z "$NCU" ]; then
  echo "ncu not found: no kernel profiles"
else
  # op N direction dtype: the smooth-rank engine per direction (is the strided t2i walk the
  # cost?), smooth-NDCG's kernels at a small and a large N, Kendall's
  for spec in "smooth_ap 4096 i2t float32" "smooth_ap 4096 t2i float32" "smooth_ap 4096 t2i bfloat16" \
              "smooth_ndcg 512 i2t float32" "smooth_ndcg 2048 i2t float32" "kendall 1024 i2t float32"; do
    T=$(( PROF_END - SECONDS ))
    [ "$T" -lt 10 ] && { echo "profile time used up before: $spec"; break; }
    set -- $spec
    echo "ncu: $spec (at most $T s)"
    timeout "$T" "$NCU" --profile-from-start off --clock-control none --csv --page details \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      "$PY" "$ROOT/benchmarks/profile_call.py" "$1" "$2" --direction "$3" --dtype "$4" \
      > "$OUT/cuda-$(date +%Y-%m-%d)-ncu-$1-$2-$3-$4.csv" 2> "$OUT/ncu-$1-$2-$3-$4.log" \
      || echo "!!! ncu $spec: exit $? (see its .log)"
  done
fi

step "7. smooth-rank engine: float32 and bfloat16"
D=$(clamp $(( ($(left) - 90) / 4 )) "${GPU_CHECK_DTYPE_S:-40}" 15)
for dt in float32 bfloat16; do
  echo "$dt: time limit $D s (+20 s)"
  timeout $(( D + 20 )) "$PY" "$ROOT/benchmarks" sweep --device cuda --out "$OUT" --time-limit "$D" \
    --ops smooth_ap,smooth_ap_classes,recall_at_k --impls native --modes forward+backward --dtype "$dt" \
    --tag "engine-$dt" --order breadth 2>&1 | tee "$OUT/engine-$dt.log"
  check 7 "${PIPESTATUS[0]}" "smooth-rank $dt sweep (see engine-$dt.log)"
done

step "7b. smooth_ndcg at N = 4096 (its large-N target)"
timeout 60 "$PY" "$ROOT/benchmarks" sweep --device cuda --out "$OUT" --time-limit 30 \
  --ops smooth_ndcg --impls native --modes forward+backward --min-n 4096 --max-n 4096 \
  --tag ndcg-4096 2>&1 | tee "$OUT/ndcg-4096.log"
check 7 "${PIPESTATUS[0]}" "smooth_ndcg N = 4096 (see ndcg-4096.log)"

step "8. slate case"
timed_case 8 slate "$SLATE_S"

step "8b. loss_scale: every pair, the sparse path, from the embeddings"
timed_case 8 loss_scale "${GPU_CHECK_LOSS_SCALE_S:-60}"

step "9. size sweep (breadth-first)"
LEFT=$(( $(left) - 60 ))   # 60 s for the --huge case, plots and files
[ "$LEFT" -lt 30 ] && LEFT=30
echo "sweep time limit: $LEFT s"
timeout $(( LEFT + 55 )) "$PY" "$ROOT/benchmarks" sweep --device cuda --out "$OUT" --time-limit "$LEFT" --huge \
  --order breadth 2>&1 | tee "$OUT/benchmarks.log"
check 9 "${PIPESTATUS[0]}" "size sweep (see benchmarks.log)"

step "done in $((SECONDS - START)) s (budget $BUDGET s); files in $OUT"
ls -la "$OUT"
exit "$FAILED"
