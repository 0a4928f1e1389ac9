#!/usr/bin/env bash
# Installs every build and test dependency of muonshard: Debian 12 packages,
# then (unless MUONSHARD_TORCH=0) the project's Python environment .venv at the
# repository root, made from Debian's /usr/bin/python3 with the exact pins of
# python/requirements.txt (PyTorch, numpy, pybind11, pytest, PyYAML).
# Idempotent: packages already present are skipped, and .venv is left alone
# while it holds what the requirements file (by its SHA-256) asks for, so a
# second run is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libre2-dev
  libabsl-dev libgoogle-glog-dev libgflags-dev
  prometheus-cpp-dev libgloo-dev libsqlite3-dev sqlite3 libssl-dev zlib1g-dev libdlpack-dev
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  openssl curl python3
  # The house format and lint (scripts/check-format.sh, scripts/lint.sh).
  clang-format-14 clang-tidy-14
  # The Python package (python/): a pybind11 extension, here for Debian's
  # /usr/bin/python3 (the images' build stages); python3-dev's headers serve
  # .venv's interpreter too.
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-setuptools
)
# PyTorch and pytest: to run the Python tests and the torch example, not to
# build. MUONSHARD_TORCH=0 skips them (the images' build stages). They come
# from PyPI into .venv (below), not from Debian: Debian 12's python3-torch is
# 1.13, the GPU machine runs PyTorch 2.11, and one pinned release means one
# code path (no 1.13 fallbacks) tested here as it runs there.
if [[ "${MUONSHARD_TORCH:-1}" == "1" ]]; then
  PACKAGES+=(python3-venv)
fi
# Tools the deploy checks use (compose config, promtool, a real Prometheus server,
# PyYAML for the tests in tests/deploy).
if [[ "${MUONSHARD_DEPLOY_TOOLS:-1}" == "1" ]]; then
  PACKAGES+=(prometheus docker-compose python3-yaml)
fi
# ---- container engine (deploy_containers, scripts/images.sh) ----------------
# podman (Docker-compatible API for docker-compose), runc, debootstrap for the
# Debian base image, netavark + aardvark-dns (container networks with DNS)
# and iptables, which netavark runs to set a bridge network up (without it
# every `RUN` of an image build fails: "netavark: No such file or directory"),
# uidmap, slirp4netns, fuse-overlayfs, catatonit. About 30 s on a fresh
# machine. MUONSHARD_CONTAINERS=0 (and MUONSHARD_DEPLOY_TOOLS=0, the images'
# build stages) skips them.
if [[ "${MUONSHARD_DEPLOY_TOOLS:-1}" == "1" && "${MUONSHARD_CONTAINERS:-1}" == "1" ]]; then
  PACKAGES+=(podman runc debootstrap netavark aardvark-dns iptables uidmap slirp4netns fuse-overlayfs catatonit)
fi
# ---- end of container engine ------------------------------------------------

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present" >&2
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "install-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install-deps: packages installed" >&2
fi

if [[ "${MUONSHARD_TORCH:-1}" != "1" ]]; then
  exit 0
fi
# .venv: made from Debian's interpreter (not whatever python3 is first on
# PATH), then `pip install -r python/requirements.txt`. The stamp holds the
# SHA-256 of the requirements file it installed; a matching stamp skips pip.
# From scratch: about 1 min and 4.7 GB (PyPI's torch wheel is the CUDA 13
# build and brings NVIDIA's libraries; on a machine without a GPU it runs on
# the CPU).
VENV=.venv
REQUIREMENTS=python/requirements.txt
STAMP=$VENV/.requirements.sha256
want=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
if [[ -x $VENV/bin/python && -f $STAMP && "$(cat "$STAMP")" == "$want" ]]; then
  echo "install-deps: $VENV matches $REQUIREMENTS" >&2
  exit 0
fi
if [[ ! -x $VENV/bin/python ]]; then
  echo "install-deps: creating $VENV (/usr/bin/python3 -m venv)" >&2
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
fi
echo "install-deps: installing $REQUIREMENTS into $VENV" >&2
rm -f "$STAMP"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$REQUIREMENTS"
echo "$want" >"$STAMP"
echo "install-deps: done" >&2
