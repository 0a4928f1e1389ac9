#!/usr/bin/env bash
# The main job, end to end on this machine. On a fresh Debian 12 machine it
# installs what is missing and builds first.
#
# Today: imports the bundled tiny MoE model, plans it with the seed and the
# balanced policies and compares them. (Grows into coordinator + 4 CPU
# workers once the worker binary lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BIN=${BUILD_DIR:-build}/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== import the bundled model (examples/configs/tiny-moe.config.json)" >&2
"$BIN/muonshardctl" import-hf examples/configs/tiny-moe.config.json > "$work/manifest.json"
echo "== plan: seed policy, 8 ranks, ep 2" >&2
"$BIN/muonshardctl" plan --manifest "$work/manifest.json" --world-size 8 --ep 2
echo "== seed vs balanced" >&2
"$BIN/muonshardctl" compare --manifest "$work/manifest.json" --world-size 8 --ep 2
