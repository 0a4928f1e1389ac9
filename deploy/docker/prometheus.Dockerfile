# syntax=docker/dockerfile:1
# Prometheus from Debian 12's package (prometheus 2.42), for machines that
# reach a Debian mirror but no image registry: scripts/images.sh builds it as
# muonshard/prometheus:debian12 on its debootstrap'd base, and the container
# stack test (tests/deploy/check_containers.py) runs docker-compose.yml's
# prometheus service on it. It takes the same command line as the registry's
# prom/prometheus image (ENTRYPOINT prometheus; config in /etc/prometheus,
# TSDB in /prometheus, uid 65534 as there).
#
#   docker build -f deploy/docker/prometheus.Dockerfile \
#     --build-arg RUNTIME_BASE=IMAGE -t muonshard/prometheus:debian12 deploy/prometheus
ARG RUNTIME_BASE=debian:bookworm-slim

FROM ${RUNTIME_BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* /var/lib/prometheus \
 && install -d -o 65534 -g 65534 -m 0755 /prometheus \
 && prometheus --version
USER 65534:65534
WORKDIR /prometheus
VOLUME ["/prometheus"]
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
