#!/usr/bin/env bash
# Tensor-parallel plans on the importer's models: for each model (experts kept
# whole, ep 1), tp in {2, 4, 8} and W in {16, 64, 256}, the balanced plan's
# max/LB of optimizer-state bytes and NS FLOPs per rank (LB = max(mean,
# largest indivisible item): a Muon matrix's shard for bytes, the whole matrix
# for FLOPs), and the TP bytes per step of the distributed mode against
# Megatron's `duplicated` mode (every tp rank all-gathers and orthogonalises).
# Usage: [EP=N] [WORLDS="16 64 256"] bench/planner/tp_grid.sh [BUILD_DIR [MODEL...]] > table.md
#   MODEL: config names of tests/importer/configs (default: all of them)
#   EP: expert parallelism (default 1; with EP > 1 experts are spread over
#       the tp ranks whole, ep rank = d * tp + t, and the table gains an ep column)
set -euo pipefail
cd "$(dirname "$0")/../.."
CTL="${1:-build}/bin/muonshardctl"
shift || true
models=("$@")
if ((${#models[@]} == 0)); then
  for config in tests/importer/configs/*.config.json; do models+=("$(basename "$config" .config.json)"); done
fi
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
EP="${EP:-1}"
WORLDS="${WORLDS:-16 64 256}"
echo "| model | W | ep | tp | bytes max/LB | FLOPs max/LB | NS FLOPs busiest / replica's | TP MiB/step distributed | duplicated | ratio |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for name in "${models[@]}"; do
  config=tests/importer/configs/$name.config.json
  for tp in 2 4 8; do
    if ! "$CTL" import-hf "$config" --tp "$tp" > "$tmp/m.json" 2> "$tmp/err"; then
      echo "| $name | | $EP | $tp | $(tr '\n|' ' /' < "$tmp/err" | cut -c1-90) | | | | | |"
      continue
    fi
    for w in $WORLDS; do
      for mode in distributed duplicated; do
        "$CTL" plan --manifest "$tmp/m.json" --world-size "$w" --ep "$EP" --tp "$tp" --tp-muon "$mode" \
          --policy balanced --output json > "$tmp/$mode.json" 2> "$tmp/err" || break
      done
      if [[ -s "$tmp/err" ]]; then
        echo "| $name | $w | $EP | $tp | $(tr '\n|' ' /' < "$tmp/err" | cut -c1-90) | | | | | |"
        continue
      fi
      "$PY" - "$tmp/distributed.json" "$tmp/duplicated.json" "$name" "$w" "$tp" "$EP" <<'PY'
import json, sys
dist, dup = (json.load(open(p)) for p in sys.argv[1:3])
name, w, tp, ep = sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
s = dist["stats"]
ranks = dist["ranks"]
flops = [float(r.get("ns_flops", 0)) for r in ranks]
replica = max(sum(flops[q * tp:(q + 1) * tp]) for q in range(len(ranks) // tp))
tp_bytes = lambda plan: sum(int(r.get("tp_recv_bytes", 0)) for r in plan["ranks"]) / 2**20
d, u = tp_bytes(dist), tp_bytes(dup)
print("| %s | %s | %s | %d | %.3f | %.3f | %.3f | %.1f | %.1f | %.2f |" % (
    name, w, ep, tp, float(s["max_over_lb_state_bytes"]), float(s["max_over_lb_ns_flops"]),
    max(flops) / replica if replica else 0, d, u, u / d if d else 0))
PY
    done
  done
done
