#!/usr/bin/env bash
# Fails when any file of the repository refers to a path outside it: a user
# clones only this repository, so a test, script, benchmark or doc that reads
# the developers' reference folder beside the checkout (a sibling "shared"
# folder reached through "..") or an
# absolute path of a developer's machine breaks in a bare clone.
# Usage: self_contained_test.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"
self=tests/repo/self_contained_test.sh
# Tracked and untracked-but-not-ignored files when this is a git checkout,
# every regular file outside build trees otherwise.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -d '' files < <(git ls-files -z --cached --others --exclude-standard)
else
  mapfile -d '' files < <(find . -type f -not -path './build*' -not -path './.git/*' -print0)
fi
pattern='\.\./shared/|/work/shared|/work/main'
bad=0
for f in "${files[@]}"; do
  f=${f#./}
  [[ "$f" == "$self" || ! -f "$f" ]] && continue
  if hits=$(grep -nIE "$pattern" -- "$f"); then
    while IFS= read -r line; do
      echo "outside reference: $f:${line:0:200}" >&2
    done <<<"$hits"
    bad=1
  fi
done
if ((bad)); then
  echo "FAIL: files above refer to paths outside the repository; copy what they need into it" >&2
  exit 1
fi
echo "ok: ${#files[@]} files, none refers to a path outside the repository"
