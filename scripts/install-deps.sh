#!/usr/bin/env bash
# Installs every build and test dependency of muonshard from Debian 12 packages.
# Idempotent: packages already present are skipped, so a second run is a no-op.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libre2-dev
  libabsl-dev libgoogle-glog-dev libgflags-dev
  prometheus-cpp-dev libgloo-dev libsqlite3-dev sqlite3 libssl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  openssl curl python3
  # The Python package (python/): a pybind11 extension for Debian's
  # /usr/bin/python3, and what its tests and the torch example use.
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-setuptools
)
# PyTorch and pytest: to run the Python tests and the torch example, not to
# build. MUONSHARD_TORCH=0 skips them (the images' build stages).
if [[ "${MUONSHARD_TORCH:-1}" == "1" ]]; then
  PACKAGES+=(python3-pytest python3-torch)
fi
# Tools the deploy checks use (compose config, promtool, a real Prometheus server,
# PyYAML for the tests in tests/deploy).
if [[ "${MUONSHARD_DEPLOY_TOOLS:-1}" == "1" ]]; then
  PACKAGES+=(prometheus docker-compose python3-yaml)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present" >&2
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
