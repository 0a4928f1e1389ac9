#!/usr/bin/env bash
# Fails on format drift or a lint finding: clang-format (.clang-format) over
# every tracked C++ file, ruff's lint and format (ruff.toml) over every Python
# file. Runs as the ctest repo_format_test; `bash scripts/format.sh` fixes
# the format (lint findings are fixed by hand).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/format-files.sh
status=0
if ! drift=$(git ls-files -z "${CXX_GLOBS[@]}" | xargs -0 -r "$CLANG_FORMAT" --dry-run -Werror 2>&1); then
  head -40 <<<"$drift" >&2
  echo "check-format: C++ files drift from .clang-format (bash scripts/format.sh)" >&2
  status=1
fi
"$RUFF" check --quiet . || status=1
"$RUFF" format --check --quiet . || { echo "check-format: Python files drift from ruff format (bash scripts/format.sh)" >&2; status=1; }
exit $status
