#!/usr/bin/env bash
# GPU check for the kernels module (issue 4): builds the kernel targets with
# CUDA for sm_90, runs the gpu-labelled kernel tests (CUDA vs CPU reference)
# and the GPU benchmark (NS5 bf16 vs the cuBLAS bf16 GEMM rate, symmetric vs
# plain), and writes logs plus results.txt under $OUT.
#
# Usage, from a checkout on a machine with an NVIDIA GPU and CUDA at
# /usr/local/cuda:
#   scripts/gpu/kernels.sh
# Environment:
#   OUT                     where logs and results.txt go (default: a temp dir)
#   BUILD_DIR               build directory (default /tmp/muonshard-gpu-kernels)
#   MUONSHARD_GPU_DEPS      folder of Debian 12 .deb files to use when the
#                           machine lacks abseil/GoogleTest/OpenBLAS headers
#                           (default build-gpu-deps; see --fetch-deps)
#   MUONSHARD_GPU_KERNELS_ONLY  1: skip trying the whole project first
#   MUONSHARD_GPU_SANITIZE  1: also run the NS/Muon/AdamW GPU tests under
#                           compute-sanitizer memcheck (slower)
#
#   scripts/gpu/kernels.sh --fetch-deps
# run on a Debian 12 machine with network access, downloads those .deb files
# into $MUONSHARD_GPU_DEPS (git-ignored as build*), to be carried to a bare
# GPU machine.
#
# Build: the whole project is configured when its dependencies are present;
# otherwise a kernels-only project (abseil, GoogleTest, OpenBLAS and CUDA
# only, no NCCL/gRPC) is generated under $BUILD_DIR. Either way only the
# kernel targets are built. Exit status: 0 when the build and the GPU tests
# pass, 1 otherwise.

set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
DEPS_DIR=${MUONSHARD_GPU_DEPS:-$REPO/build-gpu-deps}
DEB_PACKAGES=(libabsl-dev libabsl20220623 libgtest-dev libgmock-dev
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
  libgfortran5 libquadmath0)

if [[ "${1:-}" == "--fetch-deps" ]]; then
  mkdir -p "$DEPS_DIR" && cd "$DEPS_DIR" && apt-get download "${DEB_PACKAGES[@]}"
  exit $?
fi

OUT=${OUT:-$(mktemp -d /tmp/muonshard-gpu-kernels-out.XXXXXX)}
BUILD_DIR=${BUILD_DIR:-/tmp/muonshard-gpu-kernels}
mkdir -p "$OUT" "$BUILD_DIR"
RESULTS="$OUT/results.txt"
: >"$RESULTS"
export PATH="/usr/local/cuda/bin:$PATH"
JOBS=$(nproc)
status=0

note() { echo "$*" | tee -a "$RESULTS"; }

# Unpacks carried .deb files into a private prefix (never into /).
use_carried_debs() {
  compgen -G "$DEPS_DIR/*.deb" >/dev/null || return 0
  if ! command -v dpkg >/dev/null; then
    note "deps: $DEPS_DIR has .deb files but there is no dpkg to unpack them"
    return 0
  fi
  local prefix="$BUILD_DIR/deps"
  mkdir -p "$prefix"
  for deb in "$DEPS_DIR"/*.deb; do dpkg -x "$deb" "$prefix"; done
  local lib="$prefix/usr/lib/x86_64-linux-gnu"
  # Debian's openblas.pc holds absolute /usr paths.
  sed -i "s#=/usr/#=$prefix/usr/#" "$lib/openblas-pthread/pkgconfig/openblas.pc"
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$lib/openblas-pthread/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "deps: carried .deb files from $DEPS_DIR unpacked into $prefix"
}

# A project with only the kernel targets and what they use from the tree.
write_kernels_only_project() {
  local src="$BUILD_DIR/kernels-only-src"
  mkdir -p "$src"
  cat >"$src/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.22)
project(muonshard_kernels_gpu_check LANGUAGES C CXX CUDA)
# The helpers take include roots and test paths from PROJECT_SOURCE_DIR.
set(PROJECT_SOURCE_DIR "$REPO")
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_CUDA_STANDARD 17)
option(MUONSHARD_WERROR "Treat warnings as errors" OFF)
list(APPEND CMAKE_MODULE_PATH "$REPO/cmake")
include(MuonshardHelpers)
find_package(CUDAToolkit REQUIRED)
set(MUONSHARD_WITH_CUDA ON)
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(GTest REQUIRED)
find_package(PkgConfig)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)
endif()
if(NOT TARGET PkgConfig::OPENBLAS)
  find_library(OPENBLAS_LIBRARY openblas PATH_SUFFIXES openblas-pthread REQUIRED)
  find_path(OPENBLAS_INCLUDE_DIR cblas.h
            PATH_SUFFIXES x86_64-linux-gnu/openblas-pthread openblas REQUIRED)
  add_library(PkgConfig::OPENBLAS INTERFACE IMPORTED)
  target_link_libraries(PkgConfig::OPENBLAS INTERFACE \${OPENBLAS_LIBRARY})
  target_include_directories(PkgConfig::OPENBLAS INTERFACE \${OPENBLAS_INCLUDE_DIR})
endif()
include(GoogleTest)
enable_testing()
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY \${PROJECT_BINARY_DIR}/bin)
muonshard_cc_library(muonshard_file_util SRCS "$REPO/common/file_util.cc"
  DEPS absl::status absl::statusor absl::strings)
muonshard_cc_library(muonshard_common
  SRCS "$REPO/common/clock.cc" "$REPO/common/flags.cc" "$REPO/common/half_float.cc"
  DEPS absl::status absl::statusor absl::strings absl::time)
muonshard_cc_library(muonshard_gpu_plugin_loader SRCS "$REPO/common/gpu_plugin.cc"
  DEPS absl::status absl::statusor absl::strings \${CMAKE_DL_LIBS})
target_compile_definitions(muonshard_gpu_plugin_loader PRIVATE MUONSHARD_BUILD_ID="kernels-only")
# status_matchers.h is header-only; the real muonshard_testing needs protobuf.
add_library(muonshard_testing INTERFACE)
target_link_libraries(muonshard_testing INTERFACE GTest::gmock)
add_subdirectory("$REPO/kernels" kernels)
add_subdirectory("$REPO/tests/kernels" tests/kernels)
add_subdirectory("$REPO/bench/kernels" bench/kernels)
EOF
  echo "$src"
}

configure() {
  local common=(-G Ninja -DMUONSHARD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
    -DCMAKE_BUILD_TYPE=Release -DMUONSHARD_WERROR=ON)
  : >"$OUT/configure.log"
  if [[ "${MUONSHARD_GPU_KERNELS_ONLY:-0}" != "1" ]] &&
    cmake -S "$REPO" -B "$BUILD_DIR/full" "${common[@]}" >>"$OUT/configure.log" 2>&1; then
    BUILD="$BUILD_DIR/full"
    note "configure: whole project ($BUILD)"
    return 0
  fi
  local src
  src=$(write_kernels_only_project)
  echo "--- whole project failed; kernels-only project ---" >>"$OUT/configure.log"
  if cmake -S "$src" -B "$BUILD_DIR/kernels-only" "${common[@]}" >>"$OUT/configure.log" 2>&1; then
    BUILD="$BUILD_DIR/kernels-only"
    note "configure: kernels-only project ($BUILD); whole project: see configure.log"
    return 0
  fi
  note "configure: FAILED (configure.log):"
  tail -n 30 "$OUT/configure.log" | tee -a "$RESULTS"
  return 1
}

note "# muonshard kernels GPU check, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
note "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi unavailable')"
note "nvcc: $(nvcc --version 2>/dev/null | tail -n 1)"
use_carried_debs
configure || exit 1

start=$SECONDS
if timeout 480 ninja -C "$BUILD" -j "$JOBS" kernels_gpu_test kernels_backend_test \
    muonshard-bench-kernels-gpu >"$OUT/build.log" 2>&1; then
  note "build: ok in $((SECONDS - start)) s"
else
  note "build: FAILED after $((SECONDS - start)) s (build.log):"
  grep -E -A8 'error|FAILED' "$OUT/build.log" | head -n 60 | tee -a "$RESULTS"
  exit 1
fi

timeout 240 ctest --test-dir "$BUILD" -L gpu -R 'CudaKernelsTest|CublasLtGemmTest' --output-on-failure \
  --output-junit "$OUT/gpu_tests.xml" >"$OUT/gpu_tests.log" 2>&1
tests_rc=$?
timeout 60 "$BUILD/bin/kernels_backend_test" >>"$OUT/gpu_tests.log" 2>&1
backend_rc=$?
note "gpu tests: $(grep -E 'tests passed|tests failed' "$OUT/gpu_tests.log" | tail -n 1)"
# On the GPU machine a skipped test means the device was not usable: a failure.
not_run=$(grep -cE '^\s*[0-9]+ - .*(Failed|Skipped|Not Run)' "$OUT/gpu_tests.log")
grep -E '^\s*[0-9]+ - .*(Failed|Skipped|Not Run)' "$OUT/gpu_tests.log" | tee -a "$RESULTS"
note "backend test: $([[ $backend_rc == 0 ]] && echo passed || echo FAILED)"
[[ $tests_rc == 0 && $backend_rc == 0 && $not_run == 0 ]] || status=1

if [[ "${MUONSHARD_GPU_SANITIZE:-0}" == "1" ]] && command -v compute-sanitizer >/dev/null; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/bin/kernels_gpu_test" \
    --gtest_filter='*Fp32MatchesCpu:*Bf16MatchesCpuEmulation:*MuonUpdate*:*AdamW*' \
    >"$OUT/sanitizer.log" 2>&1
  note "memcheck: exit $? (0 = clean; sanitizer.log)"
fi

if timeout 300 "$BUILD/bin/muonshard-bench-kernels-gpu" >"$OUT/bench.log" 2>&1; then
  note "bench (TFLOP/s; ratio = NS / cuBLAS bf16 GEMM on B·X; goal >= 0.75):"
  grep -E '^(case=|ns_gpu_tflops=)' "$OUT/bench.log" | tee -a "$RESULTS"
else
  note "bench: FAILED (bench.log):"
  tail -n 20 "$OUT/bench.log" | tee -a "$RESULTS"
  status=1
fi
note "status: $([[ $status == 0 ]] && echo PASS || echo FAIL); logs in $OUT"
exit $status
