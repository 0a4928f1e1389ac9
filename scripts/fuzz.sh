#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, ASan + UBSan) in build-fuzz and
# runs each one (docs/hardening.md):
#
#   scripts/fuzz.sh [--runs N] [--time SECONDS] [--parallel P] [TARGET...]
#
#   --runs N        executions per target (default 1000000)
#   --time SECONDS  stop a target after this long instead (whichever first)
#   --parallel P    targets run at once (default 1)
#   --timeout S     seconds one input may take (default 30; on a loaded
#                   machine a fast input can take longer than that)
#   TARGET          e.g. plan_request_fuzzer (default: every fuzz/*_fuzzer.cc)
#
# Each target starts from its seeds (fuzz/corpus/<target>/, never written)
# and keeps what it finds in <build>/fuzz-corpus/<target>/, so later runs go
# on from there. Logs: <build>/fuzz-logs/<target>.log; a crash, leak,
# timeout (--timeout per input) or out-of-memory (2 GiB) leaves its input in
# <build>/fuzz-artifacts/ (replay: `<build>/fuzz/<target> FILE`). Prints a
# table (executions, seconds, exec/s, coverage, corpus, peak RSS, result),
# also written to <build>/fuzz-logs/summary.md; exits 1 when a target failed.
# BUILD_DIR (default build-fuzz), JOBS (build jobs, default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
runs=1000000
seconds=0
parallel=1
timeout=30
targets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --time) seconds=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [[ ${#targets[@]} -eq 0 ]]; then
  for f in fuzz/*_fuzzer.cc; do targets+=("$(basename "$f" .cc)"); done
fi

# clang with libFuzzer (Debian: the clang package brings libclang-rt).
if ! command -v clang++ >/dev/null; then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  echo "fuzz.sh: installing clang (libFuzzer)" >&2
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang >/dev/null
fi
if [[ ! -f $BUILD_DIR/build.ninja ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DMUONSHARD_FUZZ=ON \
    -DMUONSHARD_PYTHON_PACKAGE=OFF -DMUONSHARD_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" >&2
fi
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" >&2

logs=$root/$BUILD_DIR/fuzz-logs
artifacts=$root/$BUILD_DIR/fuzz-artifacts
mkdir -p "$logs" "$artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/scripts/sanitizers/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$root/scripts/sanitizers/ubsan.supp}

run_one() {
  local t=$1 corpus=$root/$BUILD_DIR/fuzz-corpus/$1 start rc=0
  mkdir -p "$corpus"
  start=$(date +%s)
  "$root/$BUILD_DIR/fuzz/$t" -runs="$runs" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "$corpus" "$root/fuzz/corpus/$t" \
    > "$logs/$t.log" 2>&1 || rc=$?
  echo "wall_seconds: $(($(date +%s) - start)) exit: $rc" >> "$logs/$t.log"
}

running=0
for t in "${targets[@]}"; do
  limit=""; ((seconds > 0)) && limit=", at most $seconds s"
  echo "fuzz.sh: $t ($runs runs$limit) -> $logs/$t.log" >&2
  run_one "$t" &
  running=$((running + 1))
  if ((running >= parallel)); then wait -n || true; running=$((running - 1)); fi
done
wait

failed=0
{
  echo "| target | executions | seconds | exec/s | cov | ft | corpus | peak RSS MB | result |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
  for t in "${targets[@]}"; do
    log=$logs/$t.log
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    wall=$(sed -n 's/^wall_seconds: \([0-9]*\) exit: .*/\1/p' "$log" | tail -1)
    rc=$(sed -n 's/^wall_seconds: .* exit: //p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
    result=ok
    if [[ $rc != 0 ]]; then
      failed=1
      result="FAILED: $(grep -m1 -oE 'ERROR: [A-Za-z]+: [^ ]+( [^ ]+)?|FUZZ_CHECK failed|deadly signal|Test unit written to .*' "$log" | head -1)"
    fi
    echo "| $t | ${execs:-?} | ${wall:-?} | ${eps:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | ${rss:-?} | $result |"
  done
} | tee "$logs/summary.md"
exit $failed
