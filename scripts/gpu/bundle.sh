#!/usr/bin/env bash
# The GPU checks on binaries built on another machine: for a GPU machine
# that has a driver and CUDA but none of the project's Debian packages and
# no network (this workplace's lent device machines), where compiling the
# project would spend the lease and scripts/gpu/all.sh cannot configure.
#
#   scripts/gpu/bundle.sh pack [BUILD_DIR]    # on the build machine
#   OUT=/some/dir scripts/gpu/bundle.sh run   # on the GPU machine, in a checkout
#
# pack (Debian 12 with scripts/install-deps.sh's packages and CUDA): builds,
# in BUILD_DIR (default build; a CUDA build), the gpu-labelled test
# binaries, the GPU kernel benchmark and the binaries of the end-to-end
# run, and writes build-gpu-bundle/bundle.tar.gz: those binaries stripped,
# the GPU plugin, and every shared library they load from the build
# machine except glibc, libstdc++ and libgcc (any newer system has them)
# and CUDA's own (the GPU machine's toolkit must match its driver).
#
# run: unpacks the bundle into a temp dir, finds cudart, cuBLAS, cuBLASLt
# and NCCL on this machine (the toolkit, ldconfig, or a Python package's
# copy), then runs, each bounded and each even when an earlier one failed:
#   kernels   kernels_gpu_test (CUDA kernels against the CPU, device memory
#             conformance) and kernels_backend_test
#   comm      worker_comm_gpu_test (NCCL conformance; n > GPUs skips)
#   worker    worker_nccl_test (the nccl worker in-process against the CPU
#             reference; two ranks need two GPUs) and worker_gpu_test (the
#             optimizer on the CUDA backend, the runner's NCCL seam)
#   e2e       scripts/gpu/worker_e2e.sh (coordinator + nccl worker processes
#             against the unsharded CPU reference)
#   bench     muonshard-bench-kernels-gpu (NS5 against the cuBLAS GEMM rate)
#   torch     scripts/gpu/torch.sh under this machine's python3 with the
#             bundle's package: muonshard.torch on CUDA tensors over NCCL
#             (issue 34) against torch's own Muon + AdamW on the same GPU,
#             and its step against plain single-GPU torch
#   overlap   scripts/gpu/overlap.sh: the pipelined nccl step (CUDA streams
#             and events) against its comm-only and compute-only halves, one
#             rank per GPU; needs 2 or more GPUs (says so and passes on one)
# MUONSHARD_GPU_PARTS (default "kernels comm worker e2e bench torch overlap") picks parts.
#   memcheck  with MUONSHARD_GPU_SANITIZE=1: the kernel tests under
#             compute-sanitizer memcheck
#
# The Python package (torch part): the GPU machine's python3 is another
# version than the build machine's .venv (3.12 there), so pack also builds
# the extension for Python 3.12 -- $MUONSHARD_BUNDLE_PYTHON, else python3.12
# on PATH or pyenv's -- in BUILD_DIR-py312 (pybind11 pinned as
# python/requirements.txt, in a venv there), and carries it with the
# package's Python files, the libraries it loads, and the wheels of numpy and
# pytest for 3.12 (installed there only when its python3 lacks them). The
# extension needs no torch headers: it hands PyTorch the optimizer's buffers
# as DLPack capsules, so one build serves any torch of that Python.
#
# Writes at most 10 files to $OUT: summary.txt, env.txt, kernels.log,
# comm.log, worker.log, bench.log, torch.log, e2e.tar.gz, overlap.txt and
# sanitizer.log. Exit status: 0 when every
# part passed and the single-GPU cases really ran; 1 otherwise.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO" || exit 1
BUNDLE="$REPO/build-gpu-bundle/bundle.tar.gz"

BINARIES=(kernels_gpu_test kernels_backend_test worker_comm_gpu_test worker_nccl_test worker_gpu_test
  muonshard-bench-kernels-gpu muonshard-coordinator muonshard-worker muonshardctl
  muonshard-compare-params)
PLUGIN=libmuonshard_gpu.so
CUDA_LIBS=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2)

# Libraries every target system provides, or that must come from its CUDA.
is_system_lib() {
  [[ "$1" =~ /(ld-linux[^/]*|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s)\.so[^/]*$ ||
    "$1" == /usr/local/cuda* ]]
}

pack() {
  local build=${1:-build}
  local stage
  stage=$(mktemp -d -t muonshard-gpu-bundle-XXXXXX)
  ninja -C "$build" "${BINARIES[@]}" muonshard_gpu || return 1
  mkdir -p "$stage/bin" "$stage/lib" "$(dirname "$BUNDLE")"
  local b lib
  for b in "${BINARIES[@]}" "$PLUGIN"; do
    strip --strip-debug -o "$stage/bin/$b" "$build/bin/$b" || return 1
  done
  local carried=("${BINARIES[@]/#/$build/bin/}" "$build/bin/$PLUGIN")
  pack_python "$build" "$stage" || return 1
  [[ -d "$stage/python" ]] && carried+=("$stage"/python/muonshard/_muonshard*.so)
  for lib in $(for b in "${carried[@]}"; do ldd "$b"; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do
    is_system_lib "$lib" || cp -L "$lib" "$stage/lib/"
  done
  # The commit the binaries were built from (the GPU machine's copy of the
  # tree may carry another .git, or none).
  echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo +changes)" \
    >"$stage/commit"
  local contents=(bin lib commit)
  [[ -d "$stage/python" ]] && contents+=(python wheels)
  tar -C "$stage" -czf "$BUNDLE" "${contents[@]}" || return 1
  rm -rf "$stage"
  echo "bundle: $BUNDLE ($(du -h "$BUNDLE" | cut -f1); carry build-gpu-bundle)"
}

# pin NAME: NAME's version in python/requirements.txt.
pin() { sed -n "s/^$1==//p" "$REPO/python/requirements.txt"; }

# pack_python BUILD STAGE: the extension for Python 3.12 with the package's
# files into STAGE/python, the wheels of numpy and pytest into STAGE/wheels;
# nothing (and a note) without a Python 3.12 here.
pack_python() {
  local build=$1 stage=$2 py="" candidate candidates
  if [[ -n "${MUONSHARD_BUNDLE_PYTHON:-}" ]]; then
    candidates=("$MUONSHARD_BUNDLE_PYTHON")
  else
    candidates=(python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12)
  fi
  for candidate in "${candidates[@]}"; do  # the first that runs as 3.12 (a pyenv shim may not)
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      py=$candidate
      break
    fi
  done
  if [[ -z "$py" ]]; then
    echo "bundle: no Python 3.12 here (set MUONSHARD_BUNDLE_PYTHON): no Python package in the bundle" >&2
    return 0
  fi
  local pybuild=$build-py312
  local venv=$pybuild/venv
  [[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv" || return 1
  "$venv/bin/python" -m pip install -q "pybind11==$(pin pybind11)" || return 1
  if [[ ! -f "$pybuild/build.ninja" ]]; then
    cmake -S "$REPO" -B "$pybuild" -G Ninja -DMUONSHARD_PYTHON="$venv/bin/python" >/dev/null || return 1
  fi
  ninja -C "$pybuild" muonshard_python || return 1  # the extension and the package's files
  mkdir -p "$stage/python" "$stage/wheels"
  cp -r "$pybuild/python/muonshard" "$stage/python/" || return 1
  find "$stage/python" -name __pycache__ -prune -exec rm -rf {} +
  strip --strip-debug "$stage"/python/muonshard/_muonshard*.so || return 1
  "$venv/bin/python" -m pip download -q --only-binary=:all: -d "$stage/wheels" \
    "numpy==$(pin numpy)" "pytest==$(pin pytest)" || return 1
}

# ---- run

note() { echo "$*" | tee -a "$OUT/summary.txt"; }

# find_cuda_lib NAME: the folder holding NAME on this machine.
find_cuda_lib() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
      /usr/lib/x86_64-linux-gnu; do
    [[ -e "$d/$1" ]] && { echo "$d"; return 0; }
  done
  d=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }')
  [[ -n "$d" ]] && { dirname "$d"; return 0; }
  d=$(find /opt /usr/local /usr/lib -name "$1" -print -quit 2>/dev/null)
  [[ -n "$d" ]] && { dirname "$d"; return 0; }
  return 1
}

# gtest_count LOG WORD: gtest's total for WORD (PASSED, SKIPPED, FAILED),
# 0 when it printed none. gtest_counts LOG: the three as one line.
gtest_count() {
  local n
  n=$(sed -nE "s/^\[ +$2 +\] ([0-9]+) tests?.*/\1/p" "$1" | tail -n 1)
  echo "${n:-0}"
}
gtest_counts() {
  echo "passed $(gtest_count "$1" PASSED), skipped $(gtest_count "$1" SKIPPED)," \
    "failed $(gtest_count "$1" FAILED)"
}

# run_gtest NAME SECONDS BINARY...: each binary in turn into $OUT/NAME.log;
# returns non-zero when one failed or timed out.
run_gtest() {
  local name=$1 seconds=$2 rc=0 b one
  shift 2
  : >"$OUT/$name.log"
  for b in "$@"; do
    timeout "$seconds" "$BIN/$b" --gtest_color=no >"$OUT/$name.one.log" 2>&1
    one=$?
    [[ $one -eq 0 ]] || rc=1
    note "$name: $b $([[ $one -eq 0 ]] && echo ok || echo "FAILED (exit $one)"); $(gtest_counts "$OUT/$name.one.log")"
    # The names of failed cases (the list after gtest's totals).
    grep -E '^\[ +FAILED +\] [^ ]+$' "$OUT/$name.one.log" | sed 's/^/  /' | tee -a "$OUT/summary.txt"
    { echo "==== $b (exit $one)"; cat "$OUT/$name.one.log"; } >>"$OUT/$name.log"
  done
  rm -f "$OUT/$name.one.log"
  return $rc
}

# The parts of `run`, in its environment (OUT, BIN, work); each returns
# non-zero when it failed.
part_kernels() {
  local rc=0
  run_gtest kernels 150 kernels_gpu_test kernels_backend_test || rc=1
  [[ $(grep -cE '^\[ +SKIPPED +\] [0-9]+ test' "$OUT/kernels.log") -eq 0 ]] ||
    { note "kernels: cases skipped on a GPU machine"; rc=1; }
  return $rc
}

part_comm() {
  local rc=0
  run_gtest comm 150 worker_comm_gpu_test || rc=1
  grep -qE '^\[ +OK +\] Nccl/CommunicatorConformanceTest\..*/Nccl_n1' "$OUT/comm.log" ||
    { note "comm: no single-GPU conformance case ran"; rc=1; }
  return $rc
}

part_worker() {
  local rc=0
  run_gtest worker 200 worker_nccl_test worker_gpu_test || rc=1
  grep -oE 'nccl \(ns .*' "$OUT/worker.log" | sed 's/^/  /' | tee -a "$OUT/summary.txt"
  [[ $(grep -cE '^\[ +OK +\] WorkerNcclTest\.OneRank_' "$OUT/worker.log") -eq 2 ]] ||
    { note "worker: the single-GPU worker cases did not both run"; rc=1; }
  return $rc
}

part_e2e() {
  local rc=0
  note "e2e:"
  BIN=$BIN OUT=$work/e2e timeout 240 bash scripts/gpu/worker_e2e.sh >"$work/e2e.out" 2>&1 || rc=1
  sed 's/^/  /' "$work/e2e/summary.txt" 2>/dev/null | tee -a "$OUT/summary.txt"
  cp "$work/e2e.out" "$work/e2e/worker_e2e.out" 2>/dev/null
  tar -C "$work" --exclude='*.safetensors' --exclude='data' -czf "$OUT/e2e.tar.gz" e2e
  return $rc
}

part_overlap() {
  local rc=0
  BIN=$BIN OUT=$work/overlap timeout 900 bash scripts/gpu/overlap.sh >"$work/overlap.out" 2>&1 || rc=1
  sed 's/^/  /' "$work/overlap/summary.txt" 2>/dev/null | tee -a "$OUT/summary.txt"
  [[ -f "$work/overlap/overlap.txt" ]] && cp "$work/overlap/overlap.txt" "$OUT/overlap.txt"
  return $rc
}

part_bench() {
  if timeout 150 "$BIN/muonshard-bench-kernels-gpu" >"$OUT/bench.log" 2>&1; then
    note "bench (TFLOP/s; ratio = NS / cuBLAS bf16 GEMM on B·X; goal >= 0.75):"
    grep -E '^(case=|ns_gpu_tflops=)' "$OUT/bench.log" | tee -a "$OUT/summary.txt"
  else
    note "bench: FAILED (bench.log)"
    return 1
  fi
}

part_torch() {
  local rc=0 site=$work/site
  if [[ ! -d "$work/python" ]]; then
    note "torch: the bundle carries no Python package (pack found no Python 3.12)"
    return 1
  fi
  if ! python3 -c 'import numpy, pytest' 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links "$work/wheels" --target "$site" numpy pytest \
      >"$work/pip.log" 2>&1 || { note "torch: cannot install the carried wheels: $(tail -n 1 "$work/pip.log")"; return 1; }
  fi
  PYTHON=python3 MUONSHARD_PYTHONPATH=$work/python MUONSHARD_BIN_DIR=$BIN OUT=$work/torch \
    PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} timeout 1300 bash scripts/gpu/torch.sh >"$work/torch.out" 2>&1 || rc=1
  sed 's/^/  /' "$work/torch.out" | tee -a "$OUT/summary.txt"
  cat "$work/torch.out" "$work"/torch/pytest.log "$work"/torch/gpu_step.log >"$OUT/torch.log" 2>/dev/null
  return $rc
}

part_memcheck() {
  command -v compute-sanitizer >/dev/null || { note "memcheck: no compute-sanitizer on this machine"; return 0; }
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/kernels_gpu_test" \
    --gtest_filter='*Fp32MatchesCpu:*Bf16MatchesCpuEmulation:*MuonUpdate*:*AdamW*:*Convert*:*InPlace*' \
    >"$OUT/sanitizer.log" 2>&1
  local rc=$?
  note "memcheck (kernels_gpu_test NS/Muon/AdamW/Convert/GEMM): exit $rc (0 = clean; sanitizer.log)"
  return $rc
}

run() {
  OUT=${OUT:-$(mktemp -d -t muonshard-gpu-bundle-out-XXXXXX)}
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  : >"$OUT/summary.txt"
  [[ -f "$BUNDLE" ]] || { note "no $BUNDLE: run 'scripts/gpu/bundle.sh pack' where the project builds"; return 1; }
  local status=0 lib dir
  work=$(mktemp -d -t muonshard-gpu-bundle-XXXXXX)  # global: the parts use it
  tar -C "$work" -xzf "$BUNDLE" || { note "cannot unpack $BUNDLE"; return 1; }
  BIN=$work/bin
  local ld_path=$work/lib
  {
    echo "== nvidia-smi"; nvidia-smi 2>&1 || echo "nvidia-smi failed"
    echo "== nvcc"; /usr/local/cuda/bin/nvcc --version 2>&1 || true
    echo "== os"; head -n 2 /etc/os-release 2>/dev/null; ldd --version 2>&1 | head -n 1
    echo "== CUDA libraries"
  } >"$OUT/env.txt"
  for lib in "${CUDA_LIBS[@]}"; do
    if dir=$(find_cuda_lib "$lib"); then
      echo "$lib: $dir" >>"$OUT/env.txt"
      [[ ":$ld_path:" == *":$dir:"* ]] || ld_path=$ld_path:$dir
    else
      note "$lib: not found on this machine"
      status=1
    fi
  done
  export LD_LIBRARY_PATH=$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export MUONSHARD_BIN_DIR=$BIN MUONSHARD_SOURCE_DIR=$REPO MUONSHARD_GPU_PLUGIN=$BIN/$PLUGIN
  echo "== unresolved libraries" >>"$OUT/env.txt"
  if ldd "$BIN"/* 2>&1 | grep 'not found' | sort -u | tee -a "$OUT/env.txt" | grep -q .; then
    note "unresolved shared libraries (env.txt)"
    status=1
  fi
  note "# muonshard GPU checks (bundle), $(date -u +%FT%TZ), binaries of commit $(cat "$work/commit" 2>/dev/null || echo unknown)"
  note "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi unavailable')"

  local part parts=${MUONSHARD_GPU_PARTS:-kernels comm worker e2e bench torch overlap}
  [[ "${MUONSHARD_GPU_SANITIZE:-0}" == "1" ]] && parts+=" memcheck"
  for part in $parts; do
    "part_$part" || status=1
  done
  rm -rf "$work"
  note "status: $([[ $status -eq 0 ]] && echo PASS || echo FAIL); logs in $OUT"
  return $status
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) run ;;
  *) echo "usage: $0 pack [BUILD_DIR] | run" >&2; exit 2 ;;
esac
