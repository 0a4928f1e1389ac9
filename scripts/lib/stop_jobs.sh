# shellcheck shell=bash
# Sourced by the scripts that start background processes.
#
# stop_jobs: SIGTERM to every background job of the calling script that is
# still running, then waits for them. For an EXIT trap.
stop_jobs() {
  local pids
  pids=$(jobs -pr)
  if [[ -n "$pids" ]]; then
    # shellcheck disable=SC2086  # one pid per word
    kill $pids 2>/dev/null || true
    wait 2>/dev/null || true
  fi
}
