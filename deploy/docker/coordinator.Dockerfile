# syntax=docker/dockerfile:1
# muonshard-coordinator on Debian 12, with muonshardctl (the HEALTHCHECK and
# plan submission use it). Build from the repository root:
#
#   docker build -f deploy/docker/coordinator.Dockerfile -t muonshard/coordinator:0.1.0 .
#
# Runs as uid 10001 with its SQLite store in /var/lib/muonshard (a volume);
# gRPC on 50051, Prometheus /metrics on 9464.
#
# From binaries built elsewhere (scripts/images.sh: a tree's bin/ as the build
# context, on a base made from Debian's packages; no registry needed):
#
#   docker build -f deploy/docker/coordinator.Dockerfile --target prebuilt \
#     --build-arg RUNTIME_BASE=IMAGE -t muonshard/coordinator:0.1.0 CONTEXT
#   # muonshardctl alone (plan submission, `ckpt inspect`, health probes)
#   docker build -f deploy/docker/coordinator.Dockerfile --target tools-prebuilt \
#     --build-arg RUNTIME_BASE=IMAGE -t muonshard/tools:0.1.0 CONTEXT
#
# The final stage (built from source) and `prebuilt` share one stage with the
# user, ports, volume, health check, ENTRYPOINT and CMD: they differ only in
# where the binaries come from.

# The Debian 12 packages of the shared libraries muonshard-coordinator and
# muonshardctl load: what deploy/docker/runtime-packages.sh reports for them.
# The build stage fails when this list misses one, and so does the
# deploy_runtime_packages test against the binaries built in the tree.
ARG RUNTIME_PACKAGES="libabsl20220623 libc-ares2 libc6 libgcc-s1 libgrpc++1.51 libgrpc29 \
libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 libprotobuf32 libre2-9 \
libsqlite3-0 libssl3 libstdc++6 zlib1g"
# Debian 12 for the runtime stages: the registry's slim image by default;
# scripts/images.sh passes the one it makes with debootstrap.
ARG RUNTIME_BASE=debian:bookworm-slim

# ---------------------------------------------------------------- build
FROM debian:bookworm AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# The project's own dependency script (its own layer: cached until it changes).
# The deploy tools (Prometheus, docker-compose) and PyTorch are for the tests,
# not images.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN MUONSHARD_DEPLOY_TOOLS=0 MUONSHARD_TORCH=0 bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUONSHARD_CUDA=OFF \
 && cmake --build /build -j"$(nproc)" --target muonshard-coordinator muonshardctl
ARG RUNTIME_PACKAGES
RUN deploy/docker/runtime-packages.sh /build/bin/muonshard-coordinator /build/bin/muonshardctl \
      > /build/needed-packages.txt \
 && missing=$(comm -23 /build/needed-packages.txt <(tr ' ' '\n' <<<"$RUNTIME_PACKAGES" | sed '/^$/d' | sort -u)) \
 && if [[ -n "$missing" ]]; then echo "RUNTIME_PACKAGES lacks: $missing" >&2; exit 1; fi

# ---------------------------------------------------------------- runtime
# The runtime libraries and the user, shared by the coordinator and tools
# images.
FROM ${RUNTIME_BASE} AS runtime
ARG RUNTIME_PACKAGES
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $RUNTIME_PACKAGES \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 muonshard \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/muonshard --no-create-home \
      --shell /usr/sbin/nologin muonshard \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/muonshard
# Numeric, so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001

# ---------------------------------------------------------------- tools
FROM runtime AS tools-base
ENTRYPOINT ["muonshardctl"]
CMD ["--help"]

FROM tools-base AS tools-prebuilt
COPY bin/muonshardctl /usr/local/bin/

# ---------------------------------------------------------------- coordinator
FROM runtime AS coordinator-base
WORKDIR /var/lib/muonshard
VOLUME ["/var/lib/muonshard"]
EXPOSE 50051 9464
# grpc.health.v1 status of the muonshard.v1.Coordinator service (plain-text
# gRPC; with --tls-cert, override it with --tls-ca).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["muonshardctl", "health", "--coordinator", "127.0.0.1:50051", "--timeout", "3"]
ENTRYPOINT ["muonshard-coordinator"]
CMD ["--listen", "0.0.0.0:50051", "--data-dir", "/var/lib/muonshard", \
     "--metrics-host", "0.0.0.0", "--metrics-port", "9464"]

# The binaries of the build context's bin/ (scripts/images.sh).
FROM coordinator-base AS prebuilt
COPY bin/muonshard-coordinator bin/muonshardctl /usr/local/bin/

# Built from source (the default target).
FROM coordinator-base
COPY --from=build /build/bin/muonshard-coordinator /build/bin/muonshardctl /usr/local/bin/
