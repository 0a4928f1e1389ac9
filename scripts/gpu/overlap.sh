#!/usr/bin/env bash
# The pipelined GPU step against its two halves (issue 34, item 3(c)): N
# muonshard-worker --backend nccl ranks on this machine's N >= 2 GPUs (one
# each), synthetic workload, one plan, run four times:
#   sequential  --step-schedule sequential
#   pipelined   --step-schedule pipelined (NOTE [Stream-pipelined step]:
#               Newton-Schulz on the backend's stream overlaps the NCCL
#               collectives on the communicators' streams)
#   comm        --step-schedule pipelined --step-phases comm     (collectives only)
#   compute     --step-schedule pipelined --step-phases compute  (kernels only)
# and reports each run's median step time (rank 0; steps after the first)
# and pipelined / max(comm, compute): 1.0 is perfect overlap, (comm +
# compute) / max(comm, compute) none. NCCL refuses two ranks on one GPU, so
# with fewer than two GPUs the script says so and exits 0 without a figure.
#
#   BIN=build/bin OUT=/some/dir scripts/gpu/overlap.sh
#
# Environment: OUT (required), BIN (default $BUILD_DIR/bin: scripts/gpu/all.sh
# runs it on worker.sh's build); OVERLAP_CONFIG (a HuggingFace
# config.json for muonshardctl import-hf; default
# tests/importer/configs/gemma-3-1b-it.config.json), OVERLAP_STEPS (default
# 6), OVERLAP_GPUS (default: every GPU nvidia-smi lists).
# Writes $OUT/overlap/ (logs), $OUT/overlap.txt and appends to
# $OUT/summary.txt. Exit status: 0 when every run finished (or there were
# fewer than two GPUs), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

: "${OUT:?OUT: where the logs go}"
BIN=${BIN:-${BUILD_DIR:?BIN or BUILD_DIR: where the muonshard binaries are}/bin}
CONFIG=${OVERLAP_CONFIG:-tests/importer/configs/gemma-3-1b-it.config.json}
STEPS=${OVERLAP_STEPS:-6}
GPUS=${OVERLAP_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
DIR=$OUT/overlap
mkdir -p "$DIR"

note() { echo "$*" | tee -a "$OUT/summary.txt"; }
fail() { note "overlap.sh: $*"; exit 1; }

if ((GPUS < 2)); then
  note "overlap: skipped: the pipelined NCCL step needs 2 or more GPUs (one rank each), $GPUS here"
  exit 0
fi

# Stops the coordinator (and anything else still running) on exit.
# shellcheck source=scripts/lib/stop_jobs.sh
source scripts/lib/stop_jobs.sh
trap stop_jobs EXIT
trap 'exit 130' INT TERM

# shellcheck source=scripts/lib/wait_for.sh
source scripts/lib/wait_for.sh
# shellcheck source=scripts/lib/step_times.sh
source scripts/lib/step_times.sh
json_int() { sed -n "s/.*\"$2\": \(-\?[0-9]\+\).*/\1/p" "$1" 2>/dev/null; }

"$BIN/muonshard-coordinator" --listen 127.0.0.1:0 --data-dir "$DIR/data" --metrics-port 0 \
  --port-file "$DIR/coordinator.port" 2>"$DIR/coordinator.log" &
wait_for 30 "the coordinator" test -s "$DIR/coordinator.port" || fail "no coordinator (overlap/coordinator.log)"
COORD=127.0.0.1:$(json_int "$DIR/coordinator.port" grpc_port)
"$BIN/muonshardctl" import-hf "$CONFIG" >"$DIR/manifest.json" 2>"$DIR/import.log" || fail "import-hf $CONFIG failed"
"$BIN/muonshardctl" submit --coordinator "$COORD" --manifest "$DIR/manifest.json" --world-size "$GPUS" \
  >"$DIR/submit.txt" 2>&1 || fail "submit failed (overlap/submit.txt)"
VERSION=$(awk '/^version/ {print $2; exit}' "$DIR/submit.txt")
[[ -n "$VERSION" ]] || fail "no plan version in overlap/submit.txt"
note "overlap: $CONFIG, world $GPUS (one GPU each), plan version $VERSION, $STEPS steps"

# run NAME ARGS...: the GPUS ranks of job NAME (rank r on GPU r); 0 when
# every rank finished. Logs: overlap/NAME.RANK.log.
run() {
  local name=$1 status=0 pids=() r
  shift
  for ((r = 0; r < GPUS; r++)); do
    timeout 900 "$BIN/muonshard-worker" --coordinator "$COORD" --job "$name" --plan-version "$VERSION" \
      --rank "$r" --cuda-device "$r" --backend nccl --workload synthetic --steps "$STEPS" --log-every 1 \
      --metrics-port 0 --comm-timeout 300 "$@" >"$DIR/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  return $status
}

status=0
declare -A MS
for mode in sequential pipelined comm compute; do
  case $mode in
    sequential) flags=(--step-schedule sequential) ;;
    pipelined) flags=(--step-schedule pipelined) ;;
    comm) flags=(--step-schedule pipelined --step-phases comm) ;;
    compute) flags=(--step-schedule pipelined --step-phases compute) ;;
  esac
  if run "$mode" "${flags[@]}"; then
    MS[$mode]=$(median_step_ms "$DIR/$mode.0.log")
    note "overlap: $mode: median step ${MS[$mode]:-?} ms (rank 0)"
  else
    note "overlap: $mode: FAILED (overlap/$mode.*.log):"
    tail -n 5 "$DIR/$mode".*.log | tee -a "$OUT/summary.txt"
    status=1
  fi
done

if [[ -n "${MS[pipelined]:-}" && -n "${MS[comm]:-}" && -n "${MS[compute]:-}" && -n "${MS[sequential]:-}" ]]; then
  awk -v p="${MS[pipelined]}" -v s="${MS[sequential]}" -v c="${MS[comm]}" -v k="${MS[compute]}" 'BEGIN {
    m = (c > k) ? c : k
    printf "overlap: pipelined %.3f ms, sequential %.3f, comm %.3f, compute %.3f: pipelined / max(comm, compute) = %.2f (no overlap: %.2f), sequential / pipelined = %.2f\n",
      p, s, c, k, p / m, (c + k) / m, s / p
  }' | tee "$OUT/overlap.txt" | tee -a "$OUT/summary.txt"
fi
exit $status
