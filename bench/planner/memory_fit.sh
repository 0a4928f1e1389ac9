#!/usr/bin/env bash
# Will it fit? The whole training memory per rank of the importer's models
# (docs/planner.md, "Memory") on devices of DEVICE (default 80GiB): the
# busiest rank's need and largest term, and the smallest world size that fits
# at that pp / ep / tp (muonshardctl's hint), per (model, W, pp, ep).
# Usage: [DEVICE=80GiB] bench/planner/memory_fit.sh [BUILD_DIR] > table.md
set -euo pipefail
cd "$(dirname "$0")/../.."
CTL="${1:-build}/bin/muonshardctl"
DEVICE="${DEVICE:-80GiB}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# model W pp ep
cases=(
  "Llama-3.1-8B 8 1 1" "Llama-3.1-8B 2 1 1"
  "Qwen3-30B-A3B 8 1 8" "Qwen3-30B-A3B 8 1 1"
  "Mixtral-8x7B-v0.1 16 2 8" "Mixtral-8x7B-v0.1 8 1 8"
  "gpt-oss-120b 64 4 16"
  "Kimi-K2-Instruct 8 1 1" "Kimi-K2-Instruct 1024 8 64"
)
echo "| model | W | pp | ep | max MiB per rank (rank) | largest term | fits $DEVICE | hint |"
echo "|---|---|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
  read -r name w pp ep <<< "$c"
  "$CTL" import-hf "tests/importer/configs/$name.config.json" > "$tmp/m.json" 2> /dev/null
  base=(plan --manifest "$tmp/m.json" --world-size "$w" --pp "$pp" --ep "$ep" --policy balanced)
  "$CTL" "${base[@]}" --output json > "$tmp/p.json"
  if "$CTL" "${base[@]}" --device-memory "$DEVICE" --output json > /dev/null 2> "$tmp/err"; then
    fits=yes hint=""
  else
    fits=no hint=$(grep '^hint:' "$tmp/err" | sed 's/^hint: //; s/|/\//g' | cut -c1-110)
  fi
  /usr/bin/python3 - "$tmp/p.json" "$name" "$w" "$pp" "$ep" "$fits" "$hint" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
name, w, pp, ep, fits, hint = sys.argv[2:8]
s = plan["stats"]
rank = int(s.get("max_memory_rank", 0))
m = plan["ranks"][rank]["memory"]
terms = ["model", "grad", "master", "muon_momentum", "adamw_moment", "comm_buffer", "ns_workspace"]
big = max(terms, key=lambda t: int(m[t + "_bytes"]))
print("| %s | %s | %s | %s | %s (%d) | %s %s MiB | %s | %s |" % (
    name, w, pp, ep, format(int(s["max_memory_bytes"]) / 2**20, ",.0f"), rank, big,
    format(int(m[big + "_bytes"]) / 2**20, ",.0f"), fits, hint))
PY
done
