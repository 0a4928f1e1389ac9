#!/usr/bin/env bash
# Seed vs balanced on every model the importer supports, W in {8, 64, 256, 1024}
# (ep 1 for dense models; ep 1, 8, 64 for MoE, capped by the expert count).
# Prints a markdown table: max/LB of optimizer-state bytes and NS FLOPs per
# policy (LB = max(mean, largest matrix)), and balanced against the tight
# bound LB* (Martello-Toth L2 bin packing, see plan_stats.h).
# Usage: bench/planner/policy_grid.sh [BUILD_DIR] > table.md
set -euo pipefail
cd "$(dirname "$0")/../.."
CTL="${1:-build}/bin/muonshardctl"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
configs=(tests/importer/configs/*.config.json)
echo "| model | W | ep | seed bytes max/LB | seed FLOPs max/LB | balanced bytes max/LB | balanced FLOPs max/LB | balanced bytes max/LB* | balanced FLOPs max/LB* | seed ms | balanced ms |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for config in "${configs[@]}"; do
  name=$(basename "$config" .config.json)
  "$CTL" import-hf "$config" > "$tmp/$name.json" 2>/dev/null
  experts=$(python3 -c "
import json,sys
m=json.load(open('$tmp/$name.json'))
e=[t.get('expert',-1) for t in m['tensors']]
s=[int(t['shape'][0]) for t in m['tensors'] if '.experts.' in t['name'] and len(t['shape'])==3]
print(max(max(e)+1, max(s) if s else 0))")
  for w in 8 64 256 1024; do
    for ep in 1 8 64; do
      [[ $ep -gt 1 && $experts -eq 0 ]] && continue
      [[ $ep -gt $w ]] && continue
      e=$ep
      (( e > experts && experts > 0 )) && e=$experts
      [[ $e -ne $ep && $ep -ne 8 && $ep -ne 64 ]] && continue
      [[ $ep -eq 64 && $e -ne 64 && $e -le 8 ]] && continue
      "$CTL" compare --manifest "$tmp/$name.json" --world-size "$w" --ep "$e" --output json > "$tmp/out.json"
      python3 - "$tmp/out.json" "$name" "$w" "$e" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
dec = json.JSONDecoder()
seed = dec.raw_decode(text[text.index('"seed": ') + 8:])[0]
bal = dec.raw_decode(text[text.index('"balanced": ') + 12:])[0]
extra = {k: float(v) for k, v in re.findall(r'"(\w+)": ([0-9.e+-]+)', text[text.index('"tight_lb_state_bytes"'):])}
f = lambda d, k: d.get(k, 0.0)
row = [sys.argv[2], sys.argv[3], sys.argv[4],
       "%.3f" % f(seed, "max_over_lb_state_bytes"), "%.3f" % f(seed, "max_over_lb_ns_flops"),
       "%.3f" % f(bal, "max_over_lb_state_bytes"), "%.3f" % f(bal, "max_over_lb_ns_flops"),
       "%.3f" % (float(bal.get("max_state_bytes", 0)) / extra["tight_lb_state_bytes"]),
       "%.3f" % (float(bal.get("max_ns_flops", 0)) / extra["tight_lb_ns_flops"]),
       "%.0f" % extra["seed_plan_ms"], "%.0f" % extra["balanced_plan_ms"]]
print("| " + " | ".join(row) + " |")
PY
    done
  done
done
