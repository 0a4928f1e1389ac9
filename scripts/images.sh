#!/usr/bin/env bash
# Builds muonshard's runtime images with podman from binaries already built
# (a build tree's bin/), with no image registry: the Debian 12 base is made
# from Debian's packages (deploy/images/base-image.sh: debootstrap + podman
# import, cached by content), then deploy/docker/*.Dockerfile's prebuilt
# targets add only the runtime packages, a non-root user and the binaries:
#
#   muonshard/coordinator:VERSION   coordinator.Dockerfile --target prebuilt
#   muonshard/tools:VERSION         coordinator.Dockerfile --target tools-prebuilt
#   muonshard/worker:VERSION-cpu    worker.Dockerfile --target cpu-prebuilt
#   muonshard/prometheus:debian12   prometheus.Dockerfile (Debian's prometheus)
#
# The names are the ones docker-compose.yml and deploy/k8s use (VERSION: the
# project's, from CMakeLists.txt). Each image is smoke-tested: its binaries
# run (`--help`) in it, so no runtime library is missing. Prints the sizes.
#
#   scripts/images.sh [--bin-dir DIR] [--runtime OCI_RUNTIME] [--no-prometheus]
#
# --bin-dir: the binaries (default $MUONSHARD_BIN_DIR, else build/bin);
# --runtime: an OCI runtime for the build's RUN steps and smoke tests (podman's
# default otherwise; the container test passes its sandbox wrapper). Layers are
# cached by podman: a second run with the same binaries takes seconds. Docker
# image format (--format docker): OCI images have no HEALTHCHECK.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

bin_dir=${MUONSHARD_BIN_DIR:-$REPO/build/bin}
runtime=${MUONSHARD_OCI_RUNTIME:-}
prometheus=1
while (($#)); do
  case "$1" in
    --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
    --runtime) runtime=${2:?--runtime needs a path}; shift 2 ;;
    --no-prometheus) prometheus=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "images: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if ! command -v podman >/dev/null; then
  echo "images: podman is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
for b in muonshard-coordinator muonshard-worker muonshardctl; do
  if [[ ! -x "$bin_dir/$b" ]]; then
    echo "images: $bin_dir/$b is not built (cmake --build BUILD --target $b)" >&2
    exit 1
  fi
done
version=$(sed -n 's/^project(muonshard VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[[ -n "$version" ]] || { echo "images: no project VERSION in CMakeLists.txt" >&2; exit 1; }

podman=(podman)
build_opts=()
if [[ -n "$runtime" ]]; then
  podman+=(--runtime "$runtime")
  build_opts+=(--runtime "$runtime")
fi

start=$SECONDS
base=$(deploy/images/base-image.sh)

# The build context: the binaries alone (stripped copies: symbols stay in the
# build tree).
ctx=$(mktemp -d "${TMPDIR:-/tmp}/muonshard-images.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/bin"
for b in muonshard-coordinator muonshard-worker muonshardctl; do
  cp "$bin_dir/$b" "$ctx/bin/$b"
  if command -v strip >/dev/null; then strip --strip-unneeded "$ctx/bin/$b"; fi
done

build() { # TAG DOCKERFILE TARGET|"" CONTEXT
  local tag=$1 file=$2 target=$3 context=$4 t0=$SECONDS
  local log=$ctx/build-${tag//[\/:]/_}.log
  local args=(build "${build_opts[@]}" --format docker --layers -f "$file" --build-arg "RUNTIME_BASE=$base" -t "$tag")
  [[ -n "$target" ]] && args+=(--target "$target")
  if ! podman "${args[@]}" "$context" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "images: building $tag failed (podman ${args[*]} $context; log above)" >&2
    return 1
  fi
  echo "images: $tag built in $((SECONDS - t0)) s" >&2
}
smoke() { # TAG ENTRYPOINT ARGS...
  local tag=$1 entry=$2
  shift 2
  if ! "${podman[@]}" run --rm --network none --entrypoint "$entry" "$tag" "$@" >"$ctx/smoke.log" 2>&1; then
    tail -n 20 "$ctx/smoke.log" >&2
    echo "images: $entry $* does not run in $tag (a runtime library missing?)" >&2
    exit 1
  fi
}

# The independent images in parallel (mostly package downloads and
# unpacking); tools after the coordinator, whose runtime stage it reuses.
images=("muonshard/coordinator:$version" "muonshard/tools:$version" "muonshard/worker:$version-cpu")
pids=()
build "muonshard/coordinator:$version" deploy/docker/coordinator.Dockerfile prebuilt "$ctx" &
pids+=($!)
build "muonshard/worker:$version-cpu" deploy/docker/worker.Dockerfile cpu-prebuilt "$ctx" &
pids+=($!)
if ((prometheus)); then
  build muonshard/prometheus:debian12 deploy/docker/prometheus.Dockerfile "" deploy/prometheus &
  pids+=($!)
  images+=(muonshard/prometheus:debian12)
fi
failed=0
for pid in "${pids[@]}"; do
  wait "$pid" || failed=1
done
((failed == 0)) || exit 1
build "muonshard/tools:$version" deploy/docker/coordinator.Dockerfile tools-prebuilt "$ctx"

# The gRPC health check (docker image format keeps it).
if ! podman image inspect --format '{{json .HealthCheck}}' "muonshard/coordinator:$version" | grep -q muonshardctl; then
  echo "images: muonshard/coordinator:$version has no HEALTHCHECK" >&2
  exit 1
fi
smoke "muonshard/coordinator:$version" muonshard-coordinator --help
smoke "muonshard/coordinator:$version" muonshardctl --help
smoke "muonshard/tools:$version" muonshardctl --help
smoke "muonshard/worker:$version-cpu" muonshard-worker --help
smoke "muonshard/worker:$version-cpu" muonshardctl --help
if ((prometheus)); then
  smoke muonshard/prometheus:debian12 /usr/bin/prometheus --version
fi

echo "images: done in $((SECONDS - start)) s; sizes:" >&2
printf '  %-40s %s\n' "$base" "$(podman image inspect --format '{{.Size}}' "$base" | numfmt --to=si)" >&2
for i in "${images[@]}"; do
  printf '  %-40s %s\n' "$i" "$(podman image inspect --format '{{.Size}}' "$i" | numfmt --to=si)" >&2
done
