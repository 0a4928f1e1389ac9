#!/usr/bin/env bash
# A short, bounded libFuzzer run of one target for ctest (MUONSHARD_FUZZ builds):
#   run_short_fuzz.sh TARGET_BINARY CORPUS_DIR ARTIFACT_DIR SECONDS
# Starts from the seed corpus, writes what it finds to a temporary directory
# (never into the repository's corpus) and stops after SECONDS or 10^6 runs.
# Fails on a crash, leak, timeout (30 s per input) or out-of-memory (2 GiB);
# the input is left in ARTIFACT_DIR for `TARGET_BINARY FILE` to replay.
set -euo pipefail
binary=$1 corpus=$2 artifacts=$3 seconds=${4:-5}
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$binary" -max_total_time="$seconds" -runs=1000000 -timeout=30 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$artifacts/$(basename "$binary")-" "$work" "$corpus"
