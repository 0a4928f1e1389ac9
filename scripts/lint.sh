#!/usr/bin/env bash
# clang-tidy (.clang-tidy: bug patterns, needless copies, override, the
# house's names) over C++ source files, with the compile commands of
# ${BUILD_DIR:-build}. Fails on any finding.
#
#   bash scripts/lint.sh                  # the folders CI lints (LINT_DIRS)
#   bash scripts/lint.sh plan/memory.cc   # these files
#   bash scripts/lint.sh --changed [REV]  # the .cc files changed since REV (default HEAD)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
CLANG_TIDY=${CLANG_TIDY:-clang-tidy-14}
# The layers CI lints on every run (the bottom of the stack: everything
# builds on them); scripts/lint.sh --changed covers a change anywhere.
LINT_DIRS=${LINT_DIRS:-"common plan importer sim"}
if [[ ! -f "$BUILD_DIR/compile_commands.json" ]]; then
  echo "lint: $BUILD_DIR/compile_commands.json is missing (bash scripts/build.sh)" >&2
  exit 2
fi
if [[ "${1:-}" == "--changed" ]]; then
  mapfile -t files < <(git diff --name-only "${2:-HEAD}" -- '*.cc' | while read -r f; do [[ -f $f ]] && echo "$f"; done)
elif (($# > 0)); then
  files=("$@")
else
  # shellcheck disable=SC2086
  mapfile -t files < <(git ls-files $(for d in $LINT_DIRS; do echo "$d/*.cc"; done))
fi
if ((${#files[@]} == 0)); then
  echo "lint: no files" >&2
  exit 0
fi
echo "lint: clang-tidy on ${#files[@]} file(s)" >&2
printf '%s\0' "${files[@]}" | xargs -0 -n 4 -P "$(nproc)" "$CLANG_TIDY" -p "$BUILD_DIR" --quiet 2>/dev/null
