# hostkvd container image: hostkvd (the daemon) and hostkv (its CLI, also the
# healthcheck), built in a Debian 12 toolchain stage and copied into a slim
# runtime stage that holds only their shared libraries.
#
#   docker build -t hostkv/hostkvd:0.1.0 .
#
# CPU backend only: this image has no CUDA toolkit and no CUDA runtime. The
# GPU backend (pinned pool, CUDA IPC imports, copy kernels) is built by CI
# where nvcc exists but has not yet run on a GPU; its image gets its own
# stages (nvidia/cuda:13.0.0-devel-ubuntu24.04 to build,
# nvidia/cuda:13.0.0-base-ubuntu24.04 to run; Ubuntu's library package names
# differ from Debian's, so the runtime list below does not carry over).
#
# Deployment (deploy/README.md, deploy/kubernetes/, deploy/compose.yaml):
#   - the socket lives on the shared volume /run/hostkv;
#   - /dev/shm must be shared with the engines and sized for every pool;
#   - the image's user is uid/gid 10001 (manifests name it numerically).

# ---------------------------------------------------------------------------
# Build stage: the project's Debian 12 packages (deploy/install_deps.sh, less
# the test-only ones: gtest/gmock, benchmark, python3-*, clang, and
# redis-server/redis-tools, the servers the tier tests start). libhiredis-dev:
# hostkvd's Redis/Valkey tier client.
# Base images by digest (the tag says which: Debian 12 "bookworm", the
# 2026-09-18 snapshot; digests of the multi-platform index, from
# docker-library/repo-info repos/debian/remote/bookworm-20260918*.md). To
# move on: `docker buildx imagetools inspect debian:bookworm-YYYYMMDD` (and
# -slim), then both FROM lines.
FROM debian:bookworm-20260918@sha256:f37a335e82bca302e955fa39f9dfe28f1be618f016f8a2b56318e5a5111afc26 AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cmake g++ make libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
      protobuf-compiler libspdlog-dev libabsl-dev grpc-proto prometheus-cpp-dev \
      libhiredis-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what hostkvd and hostkv are built from (tests are off): editing tests
# or manifests does not invalidate the build layers.
COPY CMakeLists.txt ./
COPY proto/ proto/
COPY kernels/ kernels/
COPY server/ server/
COPY client/ client/
COPY deploy/ deploy/
# The commit `hostkvd --version` names (.git stays out of the context):
#   docker build --build-arg HOSTKV_COMMIT=$(git describe --always --dirty) .
ARG HOSTKV_COMMIT=unknown
RUN HOSTKV_COMMIT="${HOSTKV_COMMIT}" cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release \
      -DHOSTKV_BUILD_TESTS=OFF -DHOSTKV_ENABLE_CUDA=OFF \
 && HOSTKV_COMMIT="${HOSTKV_COMMIT}" cmake --build /build -j"$(nproc)" --target hostkvd hostkv \
 && strip /build/server/hostkvd /build/client/hostkv

# ---------------------------------------------------------------------------
# Runtime stage: the shared libraries of `ldd hostkvd` / `ldd hostkv` (gRPC
# 1.51, protobuf, abseil, spdlog/fmt, prometheus-cpp's core (hostkvd serves
# /metrics itself: no prometheus-cpp-pull, no civetweb), hiredis 0.14 for the
# Redis/Valkey storage tier (--tier=redis://...); c-ares, re2, OpenSSL and
# zlib come as their dependencies, libstdc++ with the base image). No compiler, no headers. tests/deploy checks that every library ldd
# finds comes from this list's package closure.
FROM debian:bookworm-20260918-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251 AS runtime
ARG DEBIAN_FRONTEND=noninteractive
LABEL org.opencontainers.image.title="hostkvd" \
      org.opencontainers.image.description="node-local host KV-cache daemon for LLM inference engines (CPU backend)" \
      org.opencontainers.image.version="0.1.0"
# uid/gid 10001, fixed: the Kubernetes manifests run the daemon (and, for the
# CPU backend, the engine) as 10001 and give engines group 10001 for the
# socket. /run/hostkv is created 0750 so a fresh volume inherits that owner.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libspdlog1.10 \
      libfmt9 libprometheus-cpp-core1.0 libhiredis0.14 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 hostkv \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin hostkv \
 && install -d -m 0750 -o 10001 -g 10001 /run/hostkv
COPY --from=build /build/server/hostkvd /build/client/hostkv /usr/local/bin/
COPY deploy/entrypoint.sh /usr/local/bin/hostkvd-entrypoint
USER 10001:10001
# The gRPC socket (and PATH.session, PATH.lock) for the engines; gRPC is not
# on TCP unless --listen=HOST:PORT is given. TCP 9464: Prometheus /metrics
# (--metrics_listen, in CMD below), the Prometheus convention. It shows only
# counts (pools, sessions, RPCs, copies, the page cache, the tier) and
# page-cache namespaces as hashes (the first 12 hex digits of their SHA-256),
# never their names or any key or page. Add --metrics_token_file=FILE (0600
# or 0440; /metrics then answers 401 without "Authorization: Bearer TOKEN")
# where the port is reachable by more than the scraper, or drop the flag.
VOLUME ["/run/hostkv"]
EXPOSE 9464/tcp
# SIGTERM drains queued copies, then stops; a second signal exits at once.
STOPSIGNAL SIGTERM
# `hostkv health` exits 0 only while grpc.health.v1 reports SERVING (not
# during start-up pool creation, not while draining). Large configured pools
# are pre-faulted before the socket opens: give orchestrators a start period
# (compose: start_period; Kubernetes: a startupProbe). --start-period is not
# set here only because dockerfilelint (1.8) rejects that valid option.
HEALTHCHECK --interval=10s --timeout=5s --retries=3 \
  CMD ["hostkv", "--target=unix:/run/hostkv/hostkvd.sock", "health"]
# The entrypoint adds --config=/etc/hostkv/hostkvd.textproto when that file
# is mounted, then execs hostkvd (PID 1; it handles SIGTERM itself).
ENTRYPOINT ["/usr/local/bin/hostkvd-entrypoint"]
CMD ["--listen=unix:/run/hostkv/hostkvd.sock", "--metrics_listen=0.0.0.0:9464"]
