#!/usr/bin/env bash
# GPU check of muonshard-worker --backend nccl (the sharded step on the GPU:
# CUDA kernels on device buffers, NCCL communicators): configures a CUDA
# build, builds the worker GPU test binary and the binaries of an
# end-to-end run, runs the gpu-labelled worker tests, then trains a real job
# on this machine and compares it with the unsharded CPU reference. Meant
# for a machine with at least one GPU (H100/H200) and CUDA + NCCL under
# /usr/local/cuda, with the Debian packages of scripts/install-deps.sh
# already installed (nothing is downloaded).
#
#   OUT=/some/dir scripts/gpu/worker.sh
#
# Environment: OUT (default: a fresh temp dir, printed at the end),
# BUILD_DIR (default build-gpu-worker; scripts/gpu/all.sh shares one with
# kernels.sh and comm.sh), JOBS (default nproc), WORKER_STEPS (default 10),
# WORKER_MANIFEST (default examples/manifests/tiny-moe.json).
#
# The end-to-end run is scripts/gpu/worker_e2e.sh (what it runs and
# checks is described there).
#
# Writes to $OUT:
#   env.txt                 nvidia-smi, nvcc and NCCL versions
#   configure.log           cmake output
#   build.log               ninja output
#   ctest.log               gpu worker tests (per-case pass/fail/skip)
#   ctest-junit.xml         the same as JUnit XML
#   e2e/                    coordinator, worker and reference logs, dumps
#   compare-fp32.txt        muonshard-compare-params (gating)
#   compare-default.txt     muonshard-compare-params (information)
#   step-times.txt          per-step times of each run (ms, from the
#                           workers' progress lines) and their medians
#   summary.txt             totals
# Exit status: 0 when the build passes, every gpu worker case passed with
# the single-GPU cases really run (not skipped), the nccl workers finished
# and the fp32 comparison passed; non-zero otherwise. With one GPU the
# two-rank case skips (NCCL refuses two ranks on one device).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

OUT=${OUT:-$(mktemp -d -t muonshard-worker-gpu-XXXXXX)}
BUILD_DIR=${BUILD_DIR:-build-gpu-worker}
JOBS=${JOBS:-$(nproc)}
STEPS=${WORKER_STEPS:-10}
MANIFEST=${WORKER_MANIFEST:-examples/manifests/tiny-moe.json}
mkdir -p "$OUT"
: >"$OUT/summary.txt"
status=0

note() { echo "$*" | tee -a "$OUT/summary.txt"; }
fail() { note "worker.sh: $*"; echo "logs: $OUT" >&2; exit 1; }

{
  echo "== nvidia-smi"; nvidia-smi 2>&1 || echo "nvidia-smi failed"
  echo "== nvcc"; /usr/local/cuda/bin/nvcc --version 2>&1 || true
  echo "== nccl.h"; grep -E '^#define NCCL_(MAJOR|MINOR|PATCH)' /usr/local/cuda/include/nccl.h 2>&1 || true
} >"$OUT/env.txt"

note "# muonshard worker GPU check, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DMUONSHARD_WERROR=ON -DMUONSHARD_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/configure.log" 2>&1 \
  || fail "configure failed (see configure.log)"

# gtest_discover_tests lists the cases by running the binary after linking.
start=$SECONDS
cmake --build "$BUILD_DIR" -j "$JOBS" --target worker_nccl_test worker_gpu_test muonshard-coordinator muonshard-worker \
  muonshardctl muonshard-compare-params >"$OUT/build.log" 2>&1 || fail "build failed (see build.log)"
note "build: ok in $((SECONDS - start)) s"
BIN=$BUILD_DIR/bin

# WorkerNcclTest.* (RunWorker in-process against a coordinator process,
# compared with RunReference) and WorkerNcclFactoryTest.* (the runner's NCCL
# seam). One process per case.
# -V: the cases print their measured errors, kept in the log.
ctest --test-dir "$BUILD_DIR" -L gpu -R '^(WorkerNcclTest|WorkerNcclFactoryTest)\.' -V \
  --timeout 300 --output-junit "$OUT/ctest-junit.xml" >"$OUT/ctest.log" 2>&1
ctest_rc=$?
ran_one_rank=$(grep -cE 'WorkerNcclTest\.OneRank_.* Passed' "$OUT/ctest.log" || true)
note "gpu tests: ctest exit $ctest_rc; $(grep -E '^[0-9]+% tests passed' "$OUT/ctest.log" || echo 'no totals')"
note "single-GPU worker cases passed: $ran_one_rank (of 2)"
grep -E '^\s*[0-9]+/[0-9]+ Test +#[0-9]+: .*(Skipped|Failed|Not Run)' "$OUT/ctest.log" | tee -a "$OUT/summary.txt"
grep -oE 'nccl \(ns .*' "$OUT/ctest.log" | sed 's/^/  /' | tee -a "$OUT/summary.txt"
[[ $ctest_rc -eq 0 ]] || status=1
[[ $ran_one_rank -eq 2 ]] || { note "the single-GPU worker cases did not all run (no usable CUDA device?)"; status=1; }

# ---- End to end: processes, as a deployment runs them.
BIN="$BIN" OUT="$OUT" WORKER_STEPS="$STEPS" WORKER_MANIFEST="$MANIFEST" \
  bash scripts/gpu/worker_e2e.sh || status=1

note "status: $([[ $status -eq 0 ]] && echo PASS || echo FAIL)"
echo "logs: $OUT"
exit $status
