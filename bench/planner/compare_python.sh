#!/usr/bin/env bash
# Plan time of the C++ planner vs the same rules in Python
# (tests/plan/seed_reference.py), measured in the same run on the same
# Kimi-K2-size manifest (~70k tensors) at 1,024 ranks, ep 64, policy seed.
# Both run on the same core (taskset, where present): on a shared VM one
# core can run 1.5x slower than another for minutes, which moves either
# figure alone but not their ratio on one core.
# Usage: bench/planner/compare_python.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
BENCH="$BUILD/bin/muonshard-bench-planner"
PIN=()
if command -v taskset > /dev/null; then
  cpu=$(taskset -cp $$ | sed 's/.*: *//; s/[-,].*//')
  PIN=(taskset -c "$cpu")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BENCH" --dump-manifest "$tmp/manifest.json"
# Interleaved, best of three each, so that a slow spell of the machine
# falls on both.
py_best=1e9
cpp_best=1e9
for _ in 1 2 3; do
  s=$("${PIN[@]}" python3 tests/plan/seed_reference.py "$tmp/manifest.json" --world-size 1024 --ep 64 --time 2>&1 |
      sed -n 's/python_plan_seconds=//p')
  py_best=$(python3 -c "print(min($s, $py_best))")
  ms=$("${PIN[@]}" "$BENCH" --benchmark_filter='BM_PlanArena/seed/1024/64$' --benchmark_repetitions=3 \
         --benchmark_format=json 2>/dev/null |
       python3 -c "import json,sys; d=json.load(sys.stdin); print(min(b['cpu_time'] for b in d['benchmarks'] if b.get('run_type')=='iteration'))")
  cpp_best=$(python3 -c "print(min($ms, $cpp_best))")
done
python3 - "$py_best" "$cpp_best" <<'PY'
import sys
py, cpp_ms = float(sys.argv[1]), float(sys.argv[2])
print(f"python_plan_ms={py*1e3:.1f} cpp_plan_ms={cpp_ms:.1f} speedup={py*1e3/cpp_ms:.1f}x")
PY
