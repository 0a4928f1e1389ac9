#!/usr/bin/env bash
# muonshard.torch on CUDA tensors over NCCL (issue 34), on one GPU:
#   parity  the CUDA cases of tests/python/test_torch_parity.py: the model on
#           cuda:0, ShardedMuonAdamW(backend="nccl") at world 1 (NCCL refuses
#           two ranks on one GPU) against torch's own Muon + AdamW on the same
#           GPU within 1e-5 relative, no host copy in any step, with and
#           without overlap_backward
#   step    bench/python/gpu_step.py: the optimizer step against plain
#           single-GPU torch (torch.optim.Muon, bf16 Newton-Schulz, + fused
#           AdamW) on the same model in the same run
#
#   OUT=/some/dir BUILD_DIR=build scripts/gpu/torch.sh
#
# Environment: PYTHON (default: the checkout's .venv/bin/python, else
# python3), MUONSHARD_PYTHONPATH (default $BUILD_DIR/python: the package
# built for that interpreter), MUONSHARD_BIN_DIR (default $BUILD_DIR/bin),
# GPU_STEP_ARGS (passed to gpu_step.py). scripts/gpu/bundle.sh run sets them
# for the bundle's package.
#
# Writes $OUT/pytest.log, $OUT/gpu_step.json and $OUT/gpu_step.log. Exit
# status: 0 when both CUDA cases passed (none skipped) and the benchmark ran.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
REPO=$(pwd)
OUT=${OUT:-$(mktemp -d -t muonshard-gpu-torch-XXXXXX)}
BUILD_DIR=${BUILD_DIR:-build}
mkdir -p "$OUT"
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
[[ -x "$PYTHON" ]] || PYTHON=python3
export MUONSHARD_PYTHONPATH=${MUONSHARD_PYTHONPATH:-$BUILD_DIR/python}
export MUONSHARD_BIN_DIR=${MUONSHARD_BIN_DIR:-$BUILD_DIR/bin}
export PYTHONPATH=$MUONSHARD_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}
status=0

timeout 600 "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/python/test_torch_parity.py -k cuda \
  >"$OUT/pytest.log" 2>&1 || status=1
echo "parity: $(tail -n 1 "$OUT/pytest.log")"
if ! grep -qE '(^| )2 passed' "$OUT/pytest.log" || grep -qE 'skipped|failed|error' "$OUT/pytest.log"; then
  echo "parity: the two CUDA cases did not both pass (pytest.log)"
  status=1
fi

# shellcheck disable=SC2086  # GPU_STEP_ARGS is a list of arguments
if timeout 600 "$PYTHON" bench/python/gpu_step.py ${GPU_STEP_ARGS:-} >"$OUT/gpu_step.out" 2>"$OUT/gpu_step.log"; then
  grep -E '^\{' "$OUT/gpu_step.out" >"$OUT/gpu_step.json"
  echo "step: $(cat "$OUT/gpu_step.json")"
else
  echo "step: FAILED (gpu_step.log)"
  status=1
fi
cat "$OUT/gpu_step.out" >>"$OUT/gpu_step.log" 2>/dev/null
rm -f "$OUT/gpu_step.out"
echo "torch: $([[ $status -eq 0 ]] && echo PASS || echo FAIL)"
exit $status
