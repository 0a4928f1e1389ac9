#!/usr/bin/env bash
# Every GPU check in sequence on one build: scripts/gpu/kernels.sh (CUDA
# kernels vs the CPU, NS5 benchmark), comm.sh (NCCL conformance),
# worker.sh (muonshard-worker --backend nccl, end to end), torch.sh
# (muonshard.torch on CUDA tensors, with the checkout's .venv) and overlap.sh
# (the pipelined nccl step against its halves; 2+ GPUs). Each runs even
# when an earlier one failed, so one pass over a lent GPU machine reports
# everything.
#
#   OUT=/some/dir scripts/gpu/all.sh
#
# Environment: OUT (default: a fresh temp dir, printed at the end),
# BUILD_DIR (default /tmp/muonshard-gpu-build), JOBS (passed on).
#
# One build directory: kernels.sh configures the whole project under
# $BUILD_DIR/full (its layout: $BUILD_DIR also holds its fallback
# kernels-only project and unpacked carried .debs), and comm.sh and
# worker.sh reuse $BUILD_DIR/full, so what kernels.sh compiled is not
# compiled again (kernels.sh's Release build type stays in the cache: the
# others do not set one).
#
# Writes $OUT/kernels, $OUT/comm and $OUT/worker (each script's own files)
# and $OUT/summary.txt (each script's exit status and time). Exit status: 0
# when all passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO=$(pwd)

OUT=${OUT:-$(mktemp -d -t muonshard-gpu-all-XXXXXX)}
BUILD_DIR=${BUILD_DIR:-/tmp/muonshard-gpu-build}
mkdir -p "$OUT" "$BUILD_DIR"
OUT=$(cd "$OUT" && pwd)
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
: >"$OUT/summary.txt"
status=0

# run NAME BUILD: scripts/gpu/NAME.sh with OUT=$OUT/NAME and BUILD_DIR=BUILD,
# its output in $OUT/NAME.log.
run() {
  local name=$1 build=$2 start=$SECONDS rc
  mkdir -p "$OUT/$name"
  echo "== $name.sh (build dir $build)" >&2
  OUT="$OUT/$name" BUILD_DIR="$build" bash "$REPO/scripts/gpu/$name.sh" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: $([[ $rc -eq 0 ]] && echo PASS || echo "FAIL (exit $rc)") in $((SECONDS - start)) s" |
    tee -a "$OUT/summary.txt" >&2
  [[ $rc -eq 0 ]] || status=1
}

run kernels "$BUILD_DIR"
run comm "$BUILD_DIR/full"
run worker "$BUILD_DIR/full"
run torch "$BUILD_DIR/full"
run overlap "$BUILD_DIR/full"

echo "all: $([[ $status -eq 0 ]] && echo PASS || echo FAIL)" | tee -a "$OUT/summary.txt" >&2
echo "logs: $OUT" >&2
exit $status
