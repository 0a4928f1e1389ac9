#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every test (GPU tests
# skip cleanly without a device). Extra arguments go to ctest, e.g. -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
