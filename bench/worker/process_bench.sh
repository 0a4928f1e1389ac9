#!/usr/bin/env bash
# Process-level worker benchmark: a muonshard-coordinator and one
# muonshard-worker process per rank (Gloo over 127.0.0.1), on Qwen3-30B-A3B
# scaled down (every dimension / DIVISOR, the first LAYERS layers; expert
# counts kept), SyntheticWorkload gradients. Each worker's /metrics is
# scraped once WARMUP steps are done and again after the last step; the
# table shows, per rank, the means over the timed steps of the whole
# training step (gradients + optimizer step) and of the optimizer phases
# (muonshard_worker_step_seconds{phase}), and the comm bytes per step.
# A summary line gives the slowest rank's step (everyone waits for it) and
# the phases averaged over ranks, as muonshard-bench-worker reports them.
#
# Usage: bench/worker/process_bench.sh [--policy seed|balanced] [--ranks 4] [--ep 2]
#          [--divisor 16] [--layers 2] [--steps 10] [--warmup 2] [--hf-config PATH]
#          [--reduce-order ring|rank]
# Needs a build (BUILD_DIR, default build) with muonshard-coordinator,
# muonshardctl, muonshard-worker and muonshard-scale-manifest; curl.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BUILD_DIR:-build}/bin
POLICY=seed RANKS=4 EP=2 DIVISOR=16 LAYERS=2 STEPS=10 WARMUP=2 HF_CONFIG="" REDUCE_ORDER=ring
while (($#)); do
  case "$1" in
    --policy) POLICY=$2 ;;
    --ranks) RANKS=$2 ;;
    --ep) EP=$2 ;;
    --divisor) DIVISOR=$2 ;;
    --layers) LAYERS=$2 ;;
    --steps) STEPS=$2 ;;
    --warmup) WARMUP=$2 ;;
    --hf-config) HF_CONFIG=$2 ;;
    --reduce-order) REDUCE_ORDER=$2 ;;
    *) echo "usage: $0 [--policy P] [--ranks N] [--ep E] [--divisor D] [--layers L] [--steps N] [--warmup N] [--hf-config F] [--reduce-order O]" >&2; exit 2 ;;
  esac
  shift 2
done
work=$(mktemp -d "${TMPDIR:-/tmp}/muonshard-pbench.XXXXXX")
cleanup() {
  local pids
  pids=$(jobs -pr)
  [[ -n "$pids" ]] && kill $pids 2>/dev/null || true
  for _ in $(seq 50); do [[ -z "$(jobs -pr)" ]] && break; sleep 0.1; done
  pids=$(jobs -pr)
  [[ -n "$pids" ]] && kill -9 $pids 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=scripts/lib/wait_for.sh
source scripts/lib/wait_for.sh  # (the working directory is the repository root)
json_int() { sed -n "s/.*\"$2\": \(-\?[0-9]\+\).*/\1/p" "$1" 2>/dev/null; }

if [[ -z "$HF_CONFIG" ]]; then
  # Qwen3-30B-A3B's config.json, the parameter-shaping fields (as muonshard-bench-worker embeds it).
  HF_CONFIG=$work/qwen3-30b-a3b.config.json
  cat >"$HF_CONFIG" <<'EOF'
{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
 "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
 "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
 "tie_word_embeddings": false, "attention_bias": false, "num_experts": 128,
 "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
 "torch_dtype": "bfloat16", "_name_or_path": "Qwen/Qwen3-30B-A3B"}
EOF
fi
"$BIN/muonshardctl" import-hf "$HF_CONFIG" >"$work/full.json"
"$BIN/muonshard-scale-manifest" --manifest "$work/full.json" --divisor "$DIVISOR" --layers "$LAYERS" \
  >"$work/manifest.json"

"$BIN/muonshard-coordinator" --listen 127.0.0.1:0 --data-dir "$work/data" --metrics-port -1 \
  --port-file "$work/coordinator.port" 2>"$work/coordinator.log" &
wait_for 30 "the coordinator" test -s "$work/coordinator.port"
COORD=127.0.0.1:$(json_int "$work/coordinator.port" grpc_port)
"$BIN/muonshardctl" submit --coordinator "$COORD" --manifest "$work/manifest.json" --world-size "$RANKS" \
  --ep "$EP" --policy "$POLICY" >"$work/submit.txt"
VERSION=$(awk '/^version/ {print $2; exit}' "$work/submit.txt")
model=$(sed -n 's/.*model \([^ ]*\) .*/\1/p' "$work/submit.txt" | head -1)

for r in $(seq 0 $((RANKS - 1))); do
  "$BIN/muonshard-worker" --coordinator "$COORD" --job bench --plan-version "$VERSION" --rank "$r" \
    --workload synthetic --reduce-order "$REDUCE_ORDER" --steps $((WARMUP + STEPS)) --metrics-port 0 --port-file "$work/w$r.port" \
    --linger 120 --log-every 1000 2>"$work/w$r.log" &
done

steps_of() { awk '/^muonshard_worker_steps_total/ {print int($NF)}' "$1" 2>/dev/null; }
scrape() {  # RANK OUT
  curl -sf "http://127.0.0.1:$(json_int "$work/w$1.port" metrics_port)/metrics" >"$2" 2>/dev/null
}
reached() {  # STEPS SUFFIX: every rank's scrape shows >= STEPS steps
  local r
  for r in $(seq 0 $((RANKS - 1))); do
    test -s "$work/w$r.port" || return 1
    scrape "$r" "$work/w$r.$2" || return 1
    [[ $(steps_of "$work/w$r.$2") -ge $1 ]] || return 1
  done
}
failed() { grep -l "error:" "$work"/w*.log >/dev/null 2>&1; }
wait_for 600 "warm-up steps" reached "$WARMUP" before || { failed && cat "$work"/w*.log >&2; exit 1; }
wait_for 1200 "timed steps" reached $((WARMUP + STEPS)) after || { failed && cat "$work"/w*.log >&2; exit 1; }

echo "model $model (/$DIVISOR, $LAYERS layers), world $RANKS, ep $EP, policy $POLICY, reduce order $REDUCE_ORDER"
echo "per-rank means over the steps between the two scrapes (>= $WARMUP warm-up steps excluded)"
printf "%-5s %6s %10s %10s %15s %10s %10s %14s\n" rank timed step_ms reduce_ms orthogonalise_ms adamw_ms sync_ms comm_MB/step
for r in $(seq 0 $((RANKS - 1))); do
  awk -v r="$r" '
    FNR == NR { before[$1] = $NF; next }
    {
      d = $NF - before[$1]
      if ($1 ~ /^muonshard_worker_train_step_seconds_count/) n = d
      else if ($1 ~ /^muonshard_worker_train_step_seconds_sum/) step = d
      else if ($1 ~ /^muonshard_worker_step_seconds_sum/) {
        match($1, /phase="[a-z_]+"/); phase[substr($1, RSTART + 7, RLENGTH - 8)] = d
      } else if ($1 ~ /^muonshard_worker_comm_bytes_total/) comm += d
    }
    END {
      printf "%-5s %6d %10.1f %10.1f %15.1f %10.1f %10.1f %14.2f\n", r, n, 1e3 * step / n, 1e3 * phase["reduce"] / n,
             1e3 * phase["orthogonalise"] / n, 1e3 * phase["adamw"] / n, 1e3 * phase["sync"] / n, comm / n / 1e6
    }' "$work/w$r.before" "$work/w$r.after"
done | tee "$work/table.txt"
awk '{ if ($3 > max) max = $3; red += $4; ort += $5; adw += $6; syn += $7; n++ }
     END { printf "summary: step %.1f ms (slowest rank); phase means over ranks: reduce %.1f, orthogonalise %.1f, adamw %.1f, sync %.1f ms\n",
           max, red / n, ort / n, adw / n, syn / n }' "$work/table.txt"
