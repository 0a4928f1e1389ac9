# syntax=docker/dockerfile:1
# muonshard-worker images, with muonshardctl (the Kubernetes init container
# submits the job's plan with it), and an image for PyTorch training programs.
# Three targets, built from the repository root:
#
#   # CPU ranks (Gloo) on Debian 12: the docker-compose demo's workers
#   docker build -f deploy/docker/worker.Dockerfile --target cpu -t muonshard/worker:0.1.0-cpu .
#   # GPU ranks (CUDA kernels, NCCL) on the NVIDIA CUDA runtime base
#   docker build -f deploy/docker/worker.Dockerfile --target gpu -t muonshard/worker:0.1.0-gpu .
#   # PyTorch programs stepping muonshard.torch.ShardedMuonAdamW (Gloo, CPU
#   # tensors), e.g. examples/torch/train_gpt.py, under torch's launcher
#   docker build -f deploy/docker/worker.Dockerfile --target torch -t muonshard/worker:0.1.0-torch .
#   # CPU ranks from binaries built elsewhere (scripts/images.sh: a tree's bin/
#   # as the build context, on a base made from Debian's packages)
#   docker build -f deploy/docker/worker.Dockerfile --target cpu-prebuilt \
#     --build-arg RUNTIME_BASE=IMAGE -t muonshard/worker:0.1.0-cpu CONTEXT
#
# gRPC 1.51 / Protobuf 3.21 in all, as in the coordinator image: Debian 12
# and Ubuntu 24.04 (the CUDA images' base) ship the same versions. Runs as
# uid 10001; /metrics on 9465 (+ local rank).

# The Debian 12 packages of the shared libraries the CPU build of
# muonshard-worker and muonshardctl load (deploy/docker/runtime-packages.sh;
# checked in the build stage and by the deploy_runtime_packages test).
ARG CPU_RUNTIME_PACKAGES="libabsl20220623 libc-ares2 libc6 libcivetweb1 libgcc-s1 libgfortran5 \
libgloo0 libgrpc++1.51 libgrpc29 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200 \
libopenblas0-pthread libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprotobuf32 \
libquadmath0 libre2-9 libssl3 libstdc++6 zlib1g"
# What the torch image adds: Debian 12's interpreter (the extension is built
# for /usr/bin/python3), PyTorch 1.13 (CPU) and NumPy.
ARG TORCH_PACKAGES="python3 python3-torch python3-numpy"
# Debian 12 for the cpu stages: the registry's slim image by default;
# scripts/images.sh passes the one it makes with debootstrap.
ARG RUNTIME_BASE=debian:bookworm-slim
ARG CUDA_VERSION=13.0.0
# sm_90: H100 / H200 (the project's default); e.g. "80;90" adds A100.
ARG CUDA_ARCHITECTURES=90

# ================================================================ CPU
FROM debian:bookworm AS build-cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
# MUONSHARD_TORCH=0: no python3-torch / pytest (what runs the Python tests);
# the extension builds with python3-dev and pybind11-dev alone.
RUN MUONSHARD_DEPLOY_TOOLS=0 MUONSHARD_TORCH=0 bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# muonshard_python: the Python package (pybind11 extension + muonshard/*.py)
# in /build/python/muonshard, for the torch target.
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUONSHARD_CUDA=OFF \
 && cmake --build /build -j"$(nproc)" --target muonshard-worker muonshardctl muonshard_python
# The cpu image runs the two binaries, the torch image muonshardctl and the
# extension: one list covers all three.
ARG CPU_RUNTIME_PACKAGES
RUN deploy/docker/runtime-packages.sh /build/bin/muonshard-worker /build/bin/muonshardctl \
      /build/python/muonshard/_muonshard.*.so \
      > /build/needed-packages.txt \
 && missing=$(comm -23 /build/needed-packages.txt <(tr ' ' '\n' <<<"$CPU_RUNTIME_PACKAGES" | sed '/^$/d' | sort -u)) \
 && if [[ -n "$missing" ]]; then echo "CPU_RUNTIME_PACKAGES lacks: $missing" >&2; exit 1; fi

# Everything of the cpu image but its binaries (the user, port, ENTRYPOINT):
# shared by `cpu` (built from source) and `cpu-prebuilt`.
FROM ${RUNTIME_BASE} AS cpu-base
ARG CPU_RUNTIME_PACKAGES
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $CPU_RUNTIME_PACKAGES \
 && rm -rf /var/lib/apt/lists/*
# /var/lib/muonshard/checkpoints is the uid's, so a fresh volume mounted there
# (--checkpoint-dir; the compose demo's worker-checkpoints) is writable.
RUN groupadd --system --gid 10001 muonshard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin muonshard \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/muonshard /var/lib/muonshard/checkpoints
USER 10001:10001
EXPOSE 9465
ENTRYPOINT ["muonshard-worker"]
CMD ["--help"]

# The binaries of the build context's bin/ (scripts/images.sh).
FROM cpu-base AS cpu-prebuilt
COPY bin/muonshard-worker bin/muonshardctl /usr/local/bin/

FROM cpu-base AS cpu
COPY --from=build-cpu /build/bin/muonshard-worker /build/bin/muonshardctl /usr/local/bin/

# ================================================================ torch
# PyTorch training programs (Debian's torch 1.13: CPU tensors, Gloo): the
# muonshard package for Debian's /usr/bin/python3 (PYTHONPATH), muonshardctl
# (e.g. `muonshardctl ckpt inspect`) and examples/torch. The ENTRYPOINT is
# torch's launcher; the arguments are its flags, the script and the script's:
#
#   docker run muonshard/worker:0.1.0-torch --nnodes 2 --node_rank 0 --nproc_per_node 1 \
#     --master_addr HOST0 --master_port 29500 --redirects 1 --tee 1 \
#     /opt/muonshard/examples/torch/train_gpt.py --optimizer muonshard \
#     --coordinator coordinator:50051 --job gpt --hostname ADDRESS --metrics-port 9465
#
# (`--redirects 1 --tee 1`: torch 1.13's launcher fails on Python 3.11 with
# its default --redirects 0.) Checkpoints: /var/lib/muonshard/checkpoints is
# the uid's, so a fresh volume mounted there is writable; every rank writes
# into one directory, which all ranks must share.
FROM debian:bookworm-slim AS torch
ARG CPU_RUNTIME_PACKAGES
ARG TORCH_PACKAGES
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      $CPU_RUNTIME_PACKAGES $TORCH_PACKAGES \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 muonshard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin muonshard \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/muonshard /var/lib/muonshard/checkpoints
COPY --from=build-cpu /build/bin/muonshardctl /usr/local/bin/
COPY --from=build-cpu /build/python/muonshard /opt/muonshard/python/muonshard
COPY examples/torch /opt/muonshard/examples/torch
# MUONSHARD_BIN_DIR: where the package finds muonshardctl. No bytecode
# written (read-only root file systems); output unbuffered (container logs).
ENV PYTHONPATH=/opt/muonshard/python \
    MUONSHARD_BIN_DIR=/usr/local/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The image is complete: the extension's shared libraries, torch and NumPy
# load, and the launcher and the example parse their flags.
RUN python3 -c "import numpy, torch, muonshard, muonshard.torch" \
 && python3 -m torch.distributed.run --help > /dev/null \
 && python3 /opt/muonshard/examples/torch/train_gpt.py --help > /dev/null
USER 10001:10001
WORKDIR /var/lib/muonshard
# /metrics (--metrics-port + local rank), torch's rendezvous (--master_port).
EXPOSE 9465 29500
ENTRYPOINT ["python3", "-m", "torch.distributed.run"]
CMD ["--help"]

# ================================================================ GPU
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build-gpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# The same dependency script: its package names are Ubuntu's too.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN MUONSHARD_DEPLOY_TOOLS=0 MUONSHARD_TORCH=0 bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
ARG CUDA_ARCHITECTURES
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUONSHARD_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
 && cmake --build /build -j"$(nproc)" --target muonshard-worker muonshardctl muonshard_gpu
# Ubuntu's package names differ from Debian's (t64 renames): the runtime list
# is what the built binaries and the GPU plugin load, resolved on this same
# Ubuntu release.
RUN deploy/docker/runtime-packages.sh /build/bin/muonshard-worker /build/bin/muonshardctl \
      /build/bin/libmuonshard_gpu.so \
      > /build/runtime-packages.txt

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04 AS gpu
COPY --from=build-gpu /build/runtime-packages.txt /tmp/runtime-packages.txt
# CUDA runtime, cuBLAS and NCCL come with the base (already installed: apt
# keeps them); the rest (gRPC, Protobuf, Abseil, Gloo, OpenBLAS, ...) is added.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive xargs -a /tmp/runtime-packages.txt \
      apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt
# Checkpoints: as the cpu stage.
RUN groupadd --system --gid 10001 muonshard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin muonshard \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/muonshard /var/lib/muonshard/checkpoints
COPY --from=build-gpu /build/bin/muonshard-worker /build/bin/muonshardctl /usr/local/bin/
# The CUDA kernels and NCCL, loaded by the worker for --backend nccl from
# <binary dir>/../lib (common/gpu_plugin.h).
COPY --from=build-gpu /build/bin/libmuonshard_gpu.so /usr/local/lib/
USER 10001:10001
EXPOSE 9465
ENTRYPOINT ["muonshard-worker"]
CMD ["--help"]
