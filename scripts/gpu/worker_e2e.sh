#!/usr/bin/env bash
# End-to-end GPU run of muonshard-worker --backend nccl on prebuilt
# binaries: muonshard-coordinator on 127.0.0.1 (free port, data in
# $OUT/e2e), the manifest submitted for world size 1 with muonshardctl (as
# scripts/demo.sh does), then
#   1. nccl-fp32: ONE muonshard-worker --backend nccl, synthetic workload,
#      --ns-precision fp32, WORKER_STEPS steps, --dump-params; the same run
#      with --reference (CPU, unsharded); muonshard-compare-params with rtol
#      1e-3 (NOTE [GPU tolerance] in tests/worker/worker_nccl_test.cc: fp32
#      on both sides, different summation orders; the gradients do not
#      depend on the parameters). This comparison gates the exit status.
#   2. nccl-default: the same worker at the default precision (bf16
#      Newton-Schulz matmuls on the GPU) on the regression workload (a loss
#      that falls), compared with the fp32 CPU reference for information
#      only: bf16 rounding fed back through the bf16 model copy sets the
#      error, which no fixed tolerance bounds.
#   3. gloo: the same regression run on the CPU (--backend gloo), for the
#      step-time comparison.
# Run by scripts/gpu/worker.sh after its build, and by scripts/gpu/bundle.sh
# on binaries built elsewhere.
#
#   BIN=build/bin OUT=/some/dir scripts/gpu/worker_e2e.sh
#
# Environment: BIN (folder of the binaries, required), OUT (required),
# WORKER_STEPS (default 10), WORKER_MANIFEST (default
# examples/manifests/tiny-moe.json), WORKER_LR (the regression runs' lr,
# default 0.01).
# Writes to $OUT: e2e/ (coordinator, worker and reference logs, dumps),
# compare-fp32.txt (gating), compare-default.txt (information),
# step-times.txt (per-step times and their medians) and appends to
# summary.txt. Exit status: 0 when the nccl workers finished and the fp32
# comparison passed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

: "${BIN:?BIN: folder of the muonshard binaries}" "${OUT:?OUT: where the logs go}"
STEPS=${WORKER_STEPS:-10}
MANIFEST=${WORKER_MANIFEST:-examples/manifests/tiny-moe.json}
FP32_RTOL=1e-3
# The regression runs use scripts/demo.sh's lr: Paddle's default (0.02)
# overshoots on tiny-moe, and its loss rises for the first ten steps.
REGRESSION_LR=${WORKER_LR:-0.01}
E2E=$OUT/e2e
mkdir -p "$E2E"
status=0

note() { echo "$*" | tee -a "$OUT/summary.txt"; }
fail() { note "worker_e2e.sh: $*"; exit 1; }

# Stops the coordinator (and anything else still running) on exit.
# shellcheck source=scripts/lib/stop_jobs.sh
source scripts/lib/stop_jobs.sh
trap stop_jobs EXIT
trap 'exit 130' INT TERM

# shellcheck source=scripts/lib/wait_for.sh
source scripts/lib/wait_for.sh  # (the working directory is the repository root)
json_int() { sed -n "s/.*\"$2\": \(-\?[0-9]\+\).*/\1/p" "$1" 2>/dev/null; }

"$BIN/muonshard-coordinator" --listen 127.0.0.1:0 --data-dir "$E2E/data" --metrics-port 0 \
  --port-file "$E2E/coordinator.port" 2>"$E2E/coordinator.log" &
wait_for 30 "the coordinator" test -s "$E2E/coordinator.port" || fail "no coordinator (e2e/coordinator.log)"
COORD=127.0.0.1:$(json_int "$E2E/coordinator.port" grpc_port)
"$BIN/muonshardctl" submit --coordinator "$COORD" --manifest "$MANIFEST" --world-size 1 >"$E2E/submit.txt" 2>&1 \
  || fail "submit failed (e2e/submit.txt)"
VERSION=$(awk '/^version/ {print $2; exit}' "$E2E/submit.txt")
[[ -n "$VERSION" ]] || fail "no plan version in e2e/submit.txt"
note "e2e: $MANIFEST, world 1, plan version $VERSION, $STEPS steps, coordinator $COORD"

# run_worker NAME ARGS...: one rank of job NAME (exit status of the worker;
# bounded). Its log is e2e/NAME.log.
run_worker() {
  local name=$1
  shift
  timeout 600 "$BIN/muonshard-worker" --coordinator "$COORD" --job "$name" --plan-version "$VERSION" \
    --steps "$STEPS" --metrics-port 0 --log-every 1 --comm-timeout 120 "$@" >"$E2E/$name.log" 2>&1
}
# run_reference NAME ARGS...: the unsharded CPU run, e2e/NAME.log.
run_reference() {
  local name=$1
  shift
  timeout 600 "$BIN/muonshard-worker" --reference --coordinator "$COORD" --plan-version "$VERSION" \
    --steps "$STEPS" --log-every 1 "$@" >"$E2E/$name.log" 2>&1
}

# 1. Gating: fp32 Newton-Schulz on both sides.
if run_worker nccl-fp32 --backend nccl --workload synthetic --ns-precision fp32 \
    --dump-params "$E2E/nccl-fp32.safetensors"; then
  note "nccl-fp32 worker: ok ($(grep -m1 -o '[0-9]* NCCL communicator(s).*' "$E2E/nccl-fp32.log"))"
else
  note "nccl-fp32 worker: FAILED (e2e/nccl-fp32.log):"
  tail -n 20 "$E2E/nccl-fp32.log" | tee -a "$OUT/summary.txt"
  status=1
fi
if run_reference reference-fp32 --workload synthetic --ns-precision fp32 \
    --dump-params "$E2E/reference-fp32.safetensors"; then
  "$BIN/muonshard-compare-params" "$E2E/nccl-fp32.safetensors" "$E2E/reference-fp32.safetensors" \
    --rtol "$FP32_RTOL" >"$OUT/compare-fp32.txt" 2>&1
  compare_rc=$?
  note "compare nccl-fp32 vs reference (rtol $FP32_RTOL, gating): $(tail -n 1 "$OUT/compare-fp32.txt")"
  grep -E '^compared' "$OUT/compare-fp32.txt" | sed 's/^/  /' | tee -a "$OUT/summary.txt"
  [[ $compare_rc -eq 0 ]] || status=1
else
  note "reference-fp32: FAILED (e2e/reference-fp32.log)"
  status=1
fi

# 2. Information: the default (bf16) precision on the regression workload.
if run_worker nccl-default --backend nccl --workload regression --lr "$REGRESSION_LR" \
    --dump-params "$E2E/nccl-default.safetensors"; then
  note "nccl-default worker: ok; last loss $(grep -oE 'loss [0-9.e+-]+' "$E2E/nccl-default.log" | tail -n 1)"
  if run_reference reference-default --workload regression --lr "$REGRESSION_LR" --dump-params "$E2E/reference-default.safetensors"; then
    "$BIN/muonshard-compare-params" "$E2E/nccl-default.safetensors" "$E2E/reference-default.safetensors" \
      --rtol 1 >"$OUT/compare-default.txt" 2>&1
    note "compare nccl-default (bf16 NS) vs reference (fp32), information only:" \
      "$(grep -E '^compared' "$OUT/compare-default.txt")"
  fi
else
  note "nccl-default worker: FAILED (e2e/nccl-default.log):"
  tail -n 20 "$E2E/nccl-default.log" | tee -a "$OUT/summary.txt"
  status=1
fi

# 3. The same regression run on the CPU, for the step times.
run_worker gloo --backend gloo --workload regression --lr "$REGRESSION_LR" || note "gloo worker: FAILED (e2e/gloo.log)"

# Step times from the progress lines (scripts/lib/step_times.sh); the
# median leaves out step 1 (CUDA/cuBLAS warm-up, first allocations).
# shellcheck source=scripts/lib/step_times.sh
source scripts/lib/step_times.sh
{
  echo "# run  step  ms  (reduce orthogonalise adamw sync ms); median over steps 2..$STEPS"
  for run in nccl-fp32 nccl-default gloo; do
    [[ -f "$E2E/$run.log" ]] || continue
    step_rows "$E2E/$run.log" | awk -v run="$run" '{ printf "%-13s step %3d  %9.3f  (%s %s %s %s)\n", run, $1, $2, $3, $4, $5, $6 }'
    median=$(median_step_ms "$E2E/$run.log")
    if [[ -n "$median" ]]; then
      printf "%-13s median %s ms\n" "$run" "$median"
    else
      printf "%-13s median: no steps\n" "$run"
    fi
  done
} >"$OUT/step-times.txt"
grep ' median' "$OUT/step-times.txt" | sed 's/^/step time: /' | tee -a "$OUT/summary.txt"

exit $status
