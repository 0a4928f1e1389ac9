#!/usr/bin/env bash
# The simulated optimizer step of muonshard against the peers
# (docs/simulator.md, "The peers"; docs/benchmarks.md, "Simulated optimizer
# step vs the peers"): every workload x scale row through
# `muonshardctl simulate --strategies all --format json`, printed as the
# Markdown table the docs hold.
#
#   bash scripts/peers-table.sh                 # all rows, cluster h200
#   CLUSTER=gb300 bash scripts/peers-table.sh   # another preset
#   ROWS="llama-256" bash scripts/peers-table.sh
#
# MUONSHARD_BIN_DIR (default build/bin) holds muonshardctl.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MUONSHARD_BIN_DIR:-build/bin}/muonshardctl
CLUSTER=${CLUSTER:-h200}
CONFIGS=tests/importer/configs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name: config, world, plan flags (TP / EP / PP as the model's trainers
# describe them; docs/simulator.md gives the sources).
# llama and llamash: the same model, muonshard with each of its TP modes.
declare -A CONFIG=([kimi]=Kimi-K2-Instruct [dsv3]=DeepSeek-V3 [qwen]=Qwen3-235B-A22B [llama]=Llama-3.1-405B
  [llamash]=Llama-3.1-405B)
# The MoE rows (tp 1) with Muon scatter rounds (NOTE [Muon scatter rounds] in
# plan/muon_rounds.h), where a round pays; the Llama rows run tp 8.
R="--muon-reduce scatter-rounds"
declare -A FLAGS=(
  [kimi-256]="--pp 16 --ep 16 $R" [kimi-1024]="--pp 16 --ep 16 $R" [kimi-8192]="--pp 16 --ep 16 $R"
  [dsv3-256]="--pp 8 --ep 32 $R" [dsv3-1024]="--pp 16 --ep 64 $R" [dsv3-8192]="--pp 16 --ep 64 $R"
  [qwen-256]="--pp 8 --ep 32 $R" [qwen-1024]="--pp 16 --ep 64 $R" [qwen-8192]="--pp 16 --ep 64 $R"
  [llama-256]="--tp 8 --pp 16 --tp-muon distributed" [llama-1024]="--tp 8 --pp 16 --tp-muon distributed"
  [llama-8192]="--tp 8 --pp 16 --tp-muon distributed"
  [llamash-256]="--tp 8 --pp 16 --tp-muon sharded" [llamash-1024]="--tp 8 --pp 16 --tp-muon sharded"
  [llamash-8192]="--tp 8 --pp 16 --tp-muon sharded"
)
ROWS=${ROWS:-"kimi-256 kimi-1024 kimi-8192 dsv3-256 dsv3-1024 dsv3-8192 qwen-256 qwen-1024 qwen-8192 llama-256 llama-1024
  llama-8192 llamash-256 llamash-1024 llamash-8192"}

import_args() {  # Llama's Megatron TP split marks; the MoE rows run tp 1
  if [[ $1 == llama* ]]; then echo "--tp 8"; fi
}

echo "| workload | GPUs | TP/EP/PP | muonshard best (ms) | best peer (ms) | ratio | every strategy (ms) |"
echo "|---|---|---|---|---|---|---|"
for row in $ROWS; do
  model=${row%-*}
  world=${row#*-}
  manifest="$work/$model.json"
  if [[ ! -f $manifest ]]; then
    # shellcheck disable=SC2046
    "$BIN" import-hf $(import_args "$model") "$CONFIGS/${CONFIG[$model]}.config.json" >"$manifest"
  fi
  # shellcheck disable=SC2086
  "$BIN" simulate --cluster "$CLUSTER" --manifest "$manifest" --world-size "$world" ${FLAGS[$row]} \
    --strategies all --format json >"$work/$row.json"
  python3 - "$work/$row.json" "${CONFIG[$model]}" "$world" "${FLAGS[$row]}" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ours, peer = d["best_muonshard"], d["best_peer"]
ms = lambda r: "%.1f" % (r["step_seconds"] * 1e3)
def label(r):
    sched = "/" + r["schedule"][:3] if r["muonshard"] else ""
    return "%s%s%s %s" % (r["strategy"], sched, "" if r["whole_matrices"] else "*", ms(r))
every = ", ".join(label(r) for r in d["strategies"] if r["strategy"] != "paddle-seed")
print("| %s | %s | %s | %s (%s %s) | %s (%s) | %.2f | %s |" % (
    sys.argv[2], sys.argv[3], sys.argv[4], ms(ours), ours["strategy"], ours["schedule"], ms(peer), peer["strategy"],
    d["ratio"], every))
PY
done
