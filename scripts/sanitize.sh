#!/usr/bin/env bash
# Sanitizer builds of muonshard and their test runs (docs/hardening.md).
#
#   scripts/sanitize.sh [asan|tsan] [CTEST_REGEX] [-- CTEST_ARGS...]
#
#   asan  ASan + UBSan (-fsanitize=address,undefined, every UBSan check fatal)
#         in build-asan: the C++ unit and process tests, children included.
#   tsan  TSan in build-tsan, run on an instrumented abseil (see below).
#
# CTEST_REGEX "threads" stands for the tests of the project's concurrency:
# the worker's heartbeat thread (CoordinatorSession), the coordinator's watch
# reactors, maintenance thread and KV waiters (the service in-process and
# the real coordinator under gRPC), the rendezvous stores and the in-process
# communicator hub; only the executables holding them are built
# (worker_client_test coordinator_server_test coordinator_service_test
# worker_comm_test, and the binaries they start):
#   scripts/sanitize.sh tsan threads
#
# Runs ctest -LE "$SANITIZE_EXCLUDE_LABELS" (default python|deploy|gpu|fuzz:
# the Python extension would need the sanitizer runtime preloaded into
# python3, the deploy checks run no project code, the fuzz targets have
# their own build) and -R CTEST_REGEX when given. Every process a test
# starts (coordinators, workers, muonshardctl) is the sanitized build too and
# writes its reports to <build>/sanitizer-logs/; the run fails when a test
# fails or any report was written, and prints the reports.
#
# Environment:
#   BUILD_DIR           default build-asan / build-tsan
#   SANITIZE_TESTS      instead of ctest: these test executables only (gtest
#                       binaries, each run whole in one process from the
#                       repository root, and fuzz targets, which replay their
#                       seed corpus); only they (and what they depend on) are
#                       built. CI's ASan pass uses this (.ci/run).
#   SANITIZE_TARGETS    with ctest: build these targets only (default all)
#   SANITIZE_NO_BUILD=1 run what is built, build nothing
#   SANITIZE_EXCLUDE_LABELS, JOBS (default nproc)
#   SANITIZE_OPT        optimisation level of a new build dir (default -O1)
#
# TSan and abseil: Debian's libabsl is not instrumented, so absl::Mutex and
# absl::Notification (the project's locks) are invisible to TSan and every
# guarded field would look racy. The first tsan run therefore fetches the
# source of the installed abseil from Debian (apt-get source, with a private
# apt state in <build>/absl: no change to the system's apt configuration),
# builds it with -fsanitize=thread as shared libraries with Debian's SONAMEs
# and runs the tests with LD_LIBRARY_PATH on them, so the project, gRPC and
# protobuf all use the instrumented copy (~15 min on 2 cores, once).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; }
mode=${1:-asan}
[[ $# -gt 0 ]] && shift
regex=""
if [[ $# -gt 0 && $1 != -- ]]; then regex=$1; shift; fi
if [[ $# -gt 0 && $1 == -- ]]; then shift; fi
case $mode in
  asan) sanitizer=address; BUILD_DIR=${BUILD_DIR:-build-asan} ;;
  tsan) sanitizer=thread; BUILD_DIR=${BUILD_DIR:-build-tsan} ;;
  -h|--help|help) usage; exit 0 ;;
  *) usage; exit 2 ;;
esac
JOBS=${JOBS:-$(nproc)}
opt=${SANITIZE_OPT:--O1}
THREAD_TESTS="worker_client_test coordinator_server_test coordinator_service_test worker_comm_test"
if [[ $regex == threads ]]; then
  regex='^(CoordinatorSessionTest|GrpcRendezvousStoreTest|GrpcPlanSourceTest|RunWorkerInProcessTest|Coordinator/RendezvousStoreConformanceTest|CoordinatorServerTest|TlsTest|CoordinatorServiceTest|Stores/RendezvousStoreConformanceTest|PrefixedRendezvousStoreTest|InProcessCommunicatorTest|InProcess/CommunicatorConformanceTest|CountingCommunicatorTest)\.'
  SANITIZE_TARGETS=${SANITIZE_TARGETS:-$THREAD_TESTS}
fi
exclude=${SANITIZE_EXCLUDE_LABELS:-python|deploy|gpu|fuzz}
supp=$root/scripts/sanitizers
now() { date +%s; }

# --- abseil with TSan ---------------------------------------------------------
absl_lib=""
build_tsan_abseil() {
  local dir=$root/$BUILD_DIR/absl
  absl_lib=$dir/lib
  if [[ -f $absl_lib/.complete ]]; then return; fi
  local version
  version=$(dpkg-query -W -f='${Version}' libabsl-dev)
  echo "sanitize: building abseil $version with -fsanitize=thread in $dir (once)" >&2
  rm -rf "$dir" && mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache" "$dir/src"
  local suite
  suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
  {
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite-updates main"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security $suite-security main"
  } > "$dir/apt/sources.list"
  local apt=(apt-get -q -o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
             -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache" -o APT::Sandbox::User=root)
  "${apt[@]}" update >/dev/null
  (cd "$dir/src" && { "${apt[@]}" source --download-only "abseil=$version" ||
    { echo "sanitize: abseil $version is no longer in the archive; taking the suite's current one" >&2
      "${apt[@]}" source --download-only abseil; }; } >/dev/null)
  (cd "$dir/src" && dpkg-source -x --no-check ./*.dsc tree >/dev/null)
  # As debian/rules configures the shared build, plus TSan.
  cmake -S "$dir/src/tree" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF -DABSL_PROPAGATE_CXX_STD=ON \
    -DCMAKE_INSTALL_PREFIX="$dir/install" >/dev/null
  cmake --build "$dir/build" -j "$JOBS" >&2
  cmake --install "$dir/build" >/dev/null
  mkdir -p "$absl_lib"
  cp -a "$dir/install"/lib*/libabsl_*.so* "$absl_lib/"
  rm -rf "$dir/build" "$dir/src" "$dir/apt"
  touch "$absl_lib/.complete"
}

# --- configure and build -----------------------------------------------------
# -g1: line tables are all a report's stack needs; ~30% faster to compile than
# -g. SANITIZE_OPT (default -O1) is the optimisation level: CI's ASan pass
# uses -O0, which compiles the heaviest tests 2.6x faster; its tests run
# about a minute either way.
t0=$(now)
if [[ $mode == tsan ]]; then build_tsan_abseil; fi
if [[ ! -f $BUILD_DIR/build.ninja ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DMUONSHARD_SANITIZE=$sanitizer -DMUONSHARD_PYTHON_PACKAGE=OFF \
    -DMUONSHARD_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DMUONSHARD_TEST_OPT=$opt" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$opt -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$opt -g1 -DNDEBUG" >&2
fi
# shellcheck disable=SC2086  # a list of targets
targets=${SANITIZE_TESTS:-${SANITIZE_TARGETS:-}}
if [[ -z ${SANITIZE_NO_BUILD:-} ]]; then
  cmake --build "$BUILD_DIR" -j "$JOBS" ${targets:+--target $targets} >&2
fi
t1=$(now)

# --- run ---------------------------------------------------------------------
logs=$root/$BUILD_DIR/sanitizer-logs
rm -rf "$logs" && mkdir -p "$logs"
common="log_path=$logs/report:print_stacktrace=1"
export ASAN_OPTIONS="$common:detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export LSAN_OPTIONS="$common:suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="$common:halt_on_error=1:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="$common:halt_on_error=0:second_deadlock_stack=1:history_size=4:suppressions=$supp/tsan.supp"
if [[ -n $absl_lib ]]; then export LD_LIBRARY_PATH=$absl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi

# One test executable run whole (SANITIZE_TESTS); its output goes to a log,
# printed when it fails.
run_executable() {
  local t=$1 log=$root/$BUILD_DIR/test-logs/$1.log
  local cmd=("$root/$BUILD_DIR/bin/$t" --gtest_brief=1)
  [[ $t == *_fuzzer ]] && cmd=("$root/$BUILD_DIR/fuzz/$t" "$root/fuzz/corpus/$t")
  if MUONSHARD_BIN_DIR=$root/$BUILD_DIR/bin "${cmd[@]}" >"$log" 2>&1; then
    echo "sanitize: passed $t" >&2
  else
    echo "sanitize: FAILED $t (exit $?), its output:" >&2
    tail -n 200 "$log" >&2
    return 1
  fi
}

status=0
if [[ -n ${SANITIZE_TESTS:-} ]]; then
  mkdir -p "$BUILD_DIR/test-logs"
  passed=0 failed=0 running=0
  finish_one() {
    if wait -n; then passed=$((passed + 1)); else failed=$((failed + 1)); status=1; fi
    running=$((running - 1))
  }
  for t in $SANITIZE_TESTS; do
    ((running >= JOBS)) && finish_one
    run_executable "$t" &
    running=$((running + 1))
  done
  while ((running > 0)); do finish_one; done
  echo "sanitize: $passed passed, $failed failed"
else
  (cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" -LE "$exclude" ${regex:+-R "$regex"} "$@") || status=$?
fi
t2=$(now)

reports=("$logs"/report.*)
if [[ -e ${reports[0]} ]]; then
  echo "sanitize: ${#reports[@]} sanitizer report(s) in $logs:" >&2
  for r in "${reports[@]}"; do echo "=== $r" >&2; cat "$r" >&2; done
  status=1
fi
echo "sanitize: $mode: build $((t1 - t0)) s, tests $((t2 - t1)) s, $( ((status == 0)) && echo clean || echo FAILED)" >&2
exit $status
