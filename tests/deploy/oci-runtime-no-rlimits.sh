#!/usr/bin/env bash
# OCI runtime wrapper for THIS TEST ENVIRONMENT ONLY (the deploy_containers
# test passes it as `podman --runtime PATH`); nothing a user deploys uses it.
#
# Why: in the sandbox the tests run in, an OCI runtime may not set rlimits on
# a container's process: crun and runc both fail with "setrlimit
# RLIMIT_NOFILE: Operation not permitted" (the sandbox forbids raising them).
# Podman always writes process.rlimits into the bundle's config.json, so every
# container fails to start. This wrapper deletes process.rlimits from the
# bundle of `create` / `run` (and from the process file of `exec`: health
# checks, `podman exec`) and then execs runc with the unchanged arguments;
# every other runtime command goes to runc as is. The containers then run with
# the limits of the podman process (inherited), which is what the tests need.
set -euo pipefail

RUNC=${MUONSHARD_TEST_RUNC:-$(command -v runc || echo /usr/sbin/runc)}
if [[ ! -x "$RUNC" ]]; then
  echo "oci-runtime-no-rlimits: runc not found (apt-get install runc)" >&2
  exit 1
fi

bundle=""
process=""
cmd=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  a=${args[i]}
  case "$a" in
    --bundle | -b) bundle=${args[i + 1]:-} ;;
    --bundle=*) bundle=${a#--bundle=} ;;
    --process | -p) process=${args[i + 1]:-} ;;
    --process=*) process=${a#--process=} ;;
    create | run | exec) [[ -z "$cmd" ]] && cmd=$a ;;
  esac
done

drop_rlimits() { # SPEC_FILE [process]: process.rlimits, or rlimits of a process file
  python3 - "$@" <<'PY'
import json, os, sys
path = sys.argv[1]
with open(path) as f:
    spec = json.load(f)
proc = spec if len(sys.argv) > 2 else spec.get("process", {})
if proc.pop("rlimits", None) is not None:
    tmp = path + ".norlimits"
    with open(tmp, "w") as f:
        json.dump(spec, f)
    os.replace(tmp, path)
PY
}
if [[ ("$cmd" == create || "$cmd" == run) && -f "${bundle:-.}/config.json" ]]; then
  drop_rlimits "${bundle:-.}/config.json"
elif [[ "$cmd" == exec && -n "$process" && -f "$process" ]]; then
  drop_rlimits "$process" process
fi
exec "$RUNC" "$@"
