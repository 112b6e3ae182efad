#!/usr/bin/env bash
# One command for a CUDA machine (no package registry needed), under 10 minutes on an H100:
#   1. build and install fastrank with its CUDA kernels (pip install --no-build-isolation .,
#      sm_90 only unless FASTRANK_CUDA_ARCHS says otherwise);
#   2. python -m fastrank info;
#   3. the CUDA tests (pytest -k cuda);
#   4. the whole benchmark on the GPU (python -m benchmarks --device cuda --huge), time-limited
#      so that the script ends before GPU_CHECK_BUDGET_S (default 570 s) have passed.
# Everything (logs, results JSON, markdown, PNG plots) goes under one folder:
#   benchmarks/gpu_check.sh [OUT_DIR]      (default benchmarks/results/gpu-<date>)
# Needs: python with a CUDA build of torch, nvcc, cmake, ninja (optional), setuptools, pybind11.
# Exit status: 0 when every step passed; otherwise the number of the first failed step
# (1 preflight, 2 build, 3 info, 4 CUDA tests, 5 benchmarks); after a failure from step 2 on,
# later steps still run where they can, so the folder holds as much as possible.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/benchmarks/results/gpu-$(date +%Y-%m-%d)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUDGET="${GPU_CHECK_BUDGET_S:-570}"
PY="${PYTHON:-python}"
START=$SECONDS
FAILED=0
exec > >(tee "$OUT/gpu_check.log") 2>&1

step() { echo; echo "=== [$((SECONDS - START)) s] $*"; }
fail() { echo "!!! step $1 failed: $2"; [ "$FAILED" -eq 0 ] && FAILED=$1; }

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
  "$PY" -m pip install --no-build-isolation --no-deps --no-index -v . > "$OUT/build.log" 2>&1
) || { tail -40 "$OUT/build.log"; fail 2 "pip install (see build.log)"; }
tail -3 "$OUT/build.log"

# From here on, run outside the source tree so that the installed package (with its
# CUDA module) is imported, not the source folder next to it.
cd "$OUT"

step "3. fastrank info"
"$PY" -m fastrank info | tee "$OUT/info.txt"
"$PY" -c "import fastrank, sys; b = fastrank.backends(); print(fastrank.__file__); sys.exit(0 if b['cuda_available'] else 1)" \
  || fail 3 "fastrank does not see a CUDA device (cuda_available False)"

step "4. CUDA tests"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider "$ROOT/tests" -k cuda -rs \
  --junitxml="$OUT/cuda-tests.xml" 2>&1 | tee "$OUT/cuda-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail 4 "CUDA tests (see cuda-tests.log)"

step "5. benchmarks"
LEFT=$(( BUDGET - (SECONDS - START) - 60 ))   # 60 s for the --huge case, plots and files
[ "$LEFT" -lt 60 ] && LEFT=60
echo "sweep time limit: $LEFT s"
timeout $(( LEFT + 150 )) "$PY" "$ROOT/benchmarks" --device cuda --out "$OUT" --time-limit "$LEFT" --huge \
  2>&1 | tee "$OUT/benchmarks.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail 5 "benchmarks (see benchmarks.log)"

step "done in $((SECONDS - START)) s; files in $OUT"
ls -la "$OUT"
exit "$FAILED"
