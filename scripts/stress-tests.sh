#!/usr/bin/env bash
# Runs the multi-process tests (ctest labels integration and python: real
# coordinator, worker and torch processes on loopback) many times in a row
# under CPU load, to find tests whose outcome depends on which process is
# faster. Every run must pass: ctest stops a test at its first failure
# (--repeat until-fail:N).
#
#   bash scripts/stress-tests.sh [REPEATS] [ctest arguments...]
#
# REPEATS (default 20) runs of each selected test, one test at a time, beside
# STRESS_LOAD (default 2) busy loops, one per core of the machines this
# project is tested on. Extra arguments narrow the selection, e.g.
# `bash scripts/stress-tests.sh 20 -R DifferentStepOptions`. Builds nothing:
# run scripts/build.sh (or scripts/test.sh) first. BUILD_DIR as for the
# other scripts. The result of each test is in the last lines printed.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
REPEATS=${1:-20}
[[ $# -gt 0 ]] && shift
LOAD=${STRESS_LOAD:-2}
if [[ ! -f "$BUILD/CTestTestfile.cmake" ]]; then
  echo "stress-tests: no build in $BUILD (run bash scripts/build.sh first)" >&2
  exit 2
fi
if ! [[ "$REPEATS" =~ ^[1-9][0-9]*$ ]]; then
  echo "stress-tests: REPEATS must be a positive integer, got \"$REPEATS\"" >&2
  exit 2
fi

busy=()
stop_load() { ((${#busy[@]} == 0)) || kill "${busy[@]}" 2>/dev/null || true; }
trap stop_load EXIT
for ((i = 0; i < LOAD; i++)); do
  (while :; do :; done) &
  busy+=($!)
done
echo "stress-tests: $REPEATS run(s) of each multi-process test beside $LOAD busy loop(s)" >&2
started=$(date +%s)
rc=0
ctest --test-dir "$BUILD" -L 'integration|python' -LE gpu --repeat "until-fail:$REPEATS" -j 1 \
  --output-on-failure "$@" || rc=$?
echo "stress-tests: $(($(date +%s) - started)) s, ctest exit $rc" >&2
exit "$rc"
