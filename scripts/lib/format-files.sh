# The files and tools of scripts/format.sh and scripts/check-format.sh (one
# definition of each).
CXX_GLOBS=('*.cc' '*.h' '*.cu' '*.cuh')
CLANG_FORMAT=${CLANG_FORMAT:-clang-format-14}
RUFF=${RUFF:-.venv/bin/ruff}
for tool in "$CLANG_FORMAT" "$RUFF"; do
  if ! command -v "$tool" >/dev/null; then
    echo "format: $tool not found (bash scripts/install-deps.sh installs clang-format-14 and .venv's ruff)" >&2
    exit 2
  fi
done
