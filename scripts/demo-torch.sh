#!/usr/bin/env bash
# The sharded optimizer inside a real PyTorch training program, end to end on
# this machine. On a fresh Debian 12 machine it installs what is missing and
# builds first (the C++ libraries and the Python package in build/python), then:
#   1. launches examples/torch/train_gpt.py as 2 processes with torch's own
#      launcher (.venv/bin/python -m torch.distributed.run: the project's
#      virtual environment, its PyTorch pinned in python/requirements.txt,
#      made by scripts/install-deps.sh): a small GPT-style
#      MoE decoder (4 experts as 3-D stacks) trained on a synthetic language
#      task. Rank 0 starts a muonshard-coordinator on loopback, submits the
#      plan of the live module (muonshard.torch.manifest_from_module, policy
#      balanced) and every rank steps muonshard.torch.ShardedMuonAdamW: the
#      C++ step (Gloo reduce / reduce-scatter, Newton-Schulz + Muon, AdamW,
#      broadcast / all-gather) on the module's parameters;
#   2. checkpoints at step DEMO_TORCH_STEPS/2 in the project's sharded format,
#      then resumes from it in a second launch with ONE process (another plan
#      and world size: reshard on load) and trains to the end;
#   3. prints the loss curve, each rank's optimizer memory next to what
#      unsharded torch AdamW / Muon would hold, and the step time by phase;
#   4. trains the dense model with FSDP2 (--fsdp: fully_shard on a CPU mesh of
#      2 processes) and muonshard on its DTensor shards (NOTE [Sharded
#      parameters] in python/muonshard/torch/dtensor.py).
# Exit 0 only when both runs succeed, the loss on a held-out batch fell in
# each, and the resumed parameters are bit for bit the saved ones (SHA-256 of
# every parameter). Every wait is bounded.
#
# Environment: BUILD_DIR (default build), DEMO_TORCH_STEPS (60), DEMO_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD=$(cd "${BUILD_DIR:-build}" && pwd)
STEPS=${DEMO_TORCH_STEPS:-60}
HALF=$((STEPS / 2))
work=$(mktemp -d "${TMPDIR:-/tmp}/muonshard-demo-torch.XXXXXX")
if [[ "${DEMO_KEEP:-0}" == "1" ]]; then
  trap 'echo "demo-torch: work directory kept: $work" >&2' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi
say() { echo "== $*" >&2; }
PY=.venv/bin/python
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" MUONSHARD_BIN_DIR="$BUILD/bin" OMP_NUM_THREADS=1
# train_gpt.py logs from rank 0 (every rank's session notes its join); the
# launcher's files go to $work.
run_example() {
  local nproc=$1 name=$2
  shift 2
  timeout 600 "$PY" -m torch.distributed.run --nnodes 1 --nproc_per_node "$nproc" \
    --master_addr 127.0.0.1 --master_port "$(free_port)" --log_dir "$work/logs-$name" \
    examples/torch/train_gpt.py --optimizer muonshard --job "demo-torch-$name" "$@" >&2
}
launch() {
  local nproc=$1
  shift
  run_example "$nproc" "$nproc" --moe --stacked-experts --schedule-steps "$STEPS" --checkpoint-dir "$work/ckpt" "$@"
}

say "2 processes: train steps 1-$HALF, checkpoint at step $HALF"
launch 2 --steps "$HALF" --checkpoint-every "$HALF" --log-every 5 --summary-json "$work/first.json"
say "1 process: resume from the step-$HALF checkpoint (saved by 2 ranks: resharded on load), train to step $STEPS"
launch 1 --steps "$STEPS" --resume --log-every 5 --summary-json "$work/second.json"
"$PY" - "$work/first.json" "$work/second.json" <<'PY'
import json, sys
saved = json.load(open(sys.argv[1]))["parameter_digests"][1]
resumed = json.load(open(sys.argv[2]))["parameter_digests"][0]
print("parameters when saved   sha256 %s\nparameters when resumed sha256 %s" % (saved, resumed), file=sys.stderr)
if saved != resumed:
    sys.exit("demo-torch: FAILED: the resumed parameters differ from the saved ones")
PY
say "2 processes, FSDP2: fully_shard'ed parameters (DTensors), muonshard plans and steps their shards"
run_example 2 fsdp --fsdp --steps 20 --log-every 5
say "demo-torch: PASSED (checkpoint in the sharded format: build/bin/muonshardctl ckpt inspect <dir>)"
