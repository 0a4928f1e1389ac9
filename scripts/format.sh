#!/usr/bin/env bash
# Formats the tree in place: clang-format (.clang-format) on every tracked C++
# file, ruff (ruff.toml) on every Python file. scripts/check-format.sh is the
# check CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/format-files.sh
git ls-files -z "${CXX_GLOBS[@]}" | xargs -0 -r "$CLANG_FORMAT" -i
"$RUFF" check --fix --quiet .
"$RUFF" format --quiet .
