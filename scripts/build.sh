#!/usr/bin/env bash
# Configures and builds muonshard into ./build (or $BUILD_DIR). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
WERROR=OFF
if [[ -n "${CI:-}" ]]; then WERROR=ON; fi
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DMUONSHARD_WERROR=$WERROR ${CMAKE_ARGS:-} >&2
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" >&2
