#!/usr/bin/env bash
# GPU check of the worker's communication layer (NCCL): configures a CUDA
# build, builds only the comm GPU test binary and runs its ctest cases
# (label "gpu"). Meant for a machine with at least one GPU (H100/H200) and
# CUDA + NCCL under /usr/local/cuda, with the Debian packages of
# scripts/install-deps.sh already installed (nothing is downloaded).
#
#   OUT=/some/dir scripts/gpu/comm.sh
#
# Writes to $OUT (default: a fresh temp dir, printed at the end):
#   env.txt           nvidia-smi, nvcc and NCCL versions
#   configure.log     cmake output
#   build.log         ninja output
#   ctest.log         ctest output (per-case pass/fail/skip, failure output)
#   ctest-junit.xml   the same as JUnit XML
#   summary.txt       totals
# Exit status: 0 when every case passed and the single-GPU conformance cases
# really ran (not skipped); non-zero otherwise. With one GPU the n = 2..4
# conformance cases skip (NCCL refuses two ranks on one device); with k GPUs
# the cases for n <= k run too, rank i on device i.
set -uo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-$(mktemp -d -t muonshard-comm-gpu-XXXXXX)}
BUILD_DIR=${BUILD_DIR:-build-gpu-comm}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"

fail() { echo "comm.sh: $*" | tee -a "$OUT/summary.txt" >&2; echo "logs: $OUT" >&2; exit 1; }

{
  echo "== nvidia-smi"; nvidia-smi 2>&1 || echo "nvidia-smi failed"
  echo "== nvcc"; /usr/local/cuda/bin/nvcc --version 2>&1 || true
  echo "== nccl.h"; grep -E '^#define NCCL_(MAJOR|MINOR|PATCH)' /usr/local/cuda/include/nccl.h 2>&1 || true
} > "$OUT/env.txt"

cmake -S . -B "$BUILD_DIR" -G Ninja -DMUONSHARD_WERROR=ON -DMUONSHARD_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 \
  || fail "configure failed (see configure.log)"

# gtest_discover_tests lists the cases by running the binary after linking.
cmake --build "$BUILD_DIR" -j "$JOBS" --target worker_comm_gpu_test \
  > "$OUT/build.log" 2>&1 || fail "build failed (see build.log)"

# Every case of the binary: the NCCL conformance instantiation
# (Nccl/CommunicatorConformanceTest.*) and the NcclUniqueIdTest,
# NcclStatusTest and NcclCommunicatorTest cases. One process per case, so a
# hung or crashed case cannot take the others with it.
ctest --test-dir "$BUILD_DIR" -L gpu -R '^Nccl' --output-on-failure \
  --timeout 120 --output-junit "$OUT/ctest-junit.xml" > "$OUT/ctest.log" 2>&1
ctest_rc=$?

ran_n1=$(grep -cE 'Nccl/CommunicatorConformanceTest\..*/Nccl_n1 .*Passed' "$OUT/ctest.log" || true)
skipped=$(grep -c '(Skipped)' "$OUT/ctest.log" || true)
{
  echo "ctest exit: $ctest_rc"
  grep -E 'tests passed|tests failed' "$OUT/ctest.log" || true
  echo "single-GPU conformance cases passed: $ran_n1"
  echo "skipped cases (n > GPUs, or no GPU): $skipped"
} >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
echo "logs: $OUT"

[[ $ctest_rc -eq 0 ]] || exit 1
[[ $ran_n1 -gt 0 ]] || fail "no CUDA device visible: the NCCL cases were skipped"
exit 0
