# Sourced by the scripts that start processes and wait for them.
#
# wait_for SECONDS DESCRIPTION COMMAND...: runs COMMAND every 0.1 s until it
# succeeds (return 0) or SECONDS pass (a message naming DESCRIPTION on
# stderr, return 1). Bounded, so a process that never comes up cannot hang
# the caller.
wait_for() {
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq $((seconds * 10))); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  echo "$(basename "$0" .sh): timed out after ${seconds}s waiting for $what" >&2
  return 1
}
