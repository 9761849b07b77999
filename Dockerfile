# hostkvd container images: hostkvd (the daemon) and hostkv (its CLI, also the
# healthcheck), built in a Debian 12 toolchain stage and copied into a slim
# runtime stage that holds only their shared libraries. Two targets:
#
#   runtime (the default, the last stage): the CPU backend.
#     docker build -t hostkv/hostkvd:0.1.0 .
#   runtime-gpu: the CUDA backend (and the CPU one). hostkvd links the CUDA
#     runtime statically; the driver (libcuda) comes from the host through
#     the NVIDIA container toolkit (NVIDIA_VISIBLE_DEVICES,
#     NVIDIA_DRIVER_CAPABILITIES below), so the base stays slim Debian.
#     Where NVIDIA's CUDA repository is reachable:
#       docker build --target runtime-gpu -t hostkv/hostkvd:0.1.0-cuda .
#     Where it is not, with a CUDA toolkit on the build machine (nvcc 12.x or
#     13.x; its bin/, nvvm/, include/ and lib/ are used):
#       docker build --target runtime-gpu \
#         --build-context cuda-toolkit=/usr/local/cuda -t hostkv/hostkvd:0.1.0-cuda .
#
# Base images are build arguments (BUILD_BASE, RUNTIME_BASE), pinned by
# digest by default; tests/deploy/image_test.py builds both targets from a
# debootstrapped Debian 12 where no registry is reachable.
#
# Deployment (deploy/README.md, deploy/kubernetes/, deploy/compose.yaml):
#   - the socket lives on the shared volume /run/hostkv;
#   - /dev/shm must be shared with the engines and sized for every pool;
#   - the image's user is uid/gid 10001 (manifests name it numerically);
#   - the state keeper is the same image (hostkvd --state_keeper=...).

# Base images by digest (the tag says which: Debian 12 "bookworm", the
# 2026-09-18 snapshot; digests of the multi-platform index, from
# docker-library/repo-info repos/debian/remote/bookworm-20260918*.md). To
# move on: `docker buildx imagetools inspect debian:bookworm-YYYYMMDD` (and
# -slim), then both ARG lines.
ARG BUILD_BASE=debian:bookworm-20260918@sha256:f37a335e82bca302e955fa39f9dfe28f1be618f016f8a2b56318e5a5111afc26
ARG RUNTIME_BASE=debian:bookworm-20260918-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251

# ---------------------------------------------------------------------------
# Toolchain stage: the project's Debian 12 packages (deploy/install_deps.sh,
# less the test-only ones: gtest/gmock, benchmark, python3-*, clang, and
# redis-server/redis-tools, the servers the tier tests start). libhiredis-dev:
# hostkvd's Redis/Valkey tier client. Then the sources both builds use.
FROM ${BUILD_BASE} AS toolchain
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

# ---------------------------------------------------------------------------
# Build stage (CPU backend). The commit `hostkvd --version` names (.git
# stays out of the context):
#   docker build --build-arg HOSTKV_COMMIT=$(git describe --always --dirty) .
FROM toolchain AS build
ARG HOSTKV_COMMIT=unknown
RUN HOSTKV_COMMIT="${HOSTKV_COMMIT}" cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release \
      -DHOSTKV_BUILD_TESTS=OFF -DHOSTKV_ENABLE_CUDA=OFF \
 && HOSTKV_COMMIT="${HOSTKV_COMMIT}" cmake --build /build -j"$(nproc)" --target hostkvd hostkv \
 && strip /build/server/hostkvd /build/client/hostkv

# ---------------------------------------------------------------------------
# The CUDA toolkit the GPU build compiles with, laid out as bin/, nvvm/,
# include/, lib/. This stage installs it from NVIDIA's Debian 12 repository;
# `--build-context cuda-toolkit=DIR` (a toolkit already on the build machine)
# takes its place, and then nothing is fetched from NVIDIA.
FROM ${BUILD_BASE} AS cuda-from-nvidia
ARG DEBIAN_FRONTEND=noninteractive
ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
ARG CUDA_PACKAGE_VERSION=13-0
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSL -o /tmp/cuda-keyring.deb "${CUDA_REPO}/cuda-keyring_1.1-1_all.deb" \
 && dpkg -i /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      "cuda-nvcc-${CUDA_PACKAGE_VERSION}" "cuda-cudart-dev-${CUDA_PACKAGE_VERSION}" \
      "cuda-driver-dev-${CUDA_PACKAGE_VERSION}" "cuda-cccl-${CUDA_PACKAGE_VERSION}" \
 && rm -rf /var/lib/apt/lists/* /tmp/cuda-keyring.deb

FROM scratch AS cuda-toolkit
COPY --from=cuda-from-nvidia /usr/local/cuda/bin/ /bin/
COPY --from=cuda-from-nvidia /usr/local/cuda/nvvm/ /nvvm/
COPY --from=cuda-from-nvidia /usr/local/cuda/targets/x86_64-linux/include/ /include/
COPY --from=cuda-from-nvidia /usr/local/cuda/targets/x86_64-linux/lib/ /lib/

# ---------------------------------------------------------------------------
# Build stage (CUDA backend): nvcc with the toolchain's g++, only the parts of
# the toolkit the build reads (about 220 MB, not the toolkit's libraries).
# CUDA_ARCHITECTURES: the GPUs' compute capabilities (80 A100, 90 H100/H200).
FROM toolchain AS build-gpu
COPY --from=cuda-toolkit /bin/ /usr/local/cuda/bin/
COPY --from=cuda-toolkit /nvvm/ /usr/local/cuda/nvvm/
COPY --from=cuda-toolkit /include/ /usr/local/cuda/targets/x86_64-linux/include/
COPY --from=cuda-toolkit /lib/libcudart* /lib/libcudadevrt.a /lib/libculibos.a \
     /usr/local/cuda/targets/x86_64-linux/lib/
ARG CUDA_ARCHITECTURES="80;90"
ARG HOSTKV_COMMIT=unknown
RUN ln -s targets/x86_64-linux/include /usr/local/cuda/include \
 && ln -s targets/x86_64-linux/lib /usr/local/cuda/lib64 \
 && HOSTKV_COMMIT="${HOSTKV_COMMIT}" cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release \
      -DHOSTKV_BUILD_TESTS=OFF -DHOSTKV_ENABLE_CUDA=ON \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
      "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" \
 && HOSTKV_COMMIT="${HOSTKV_COMMIT}" cmake --build /build -j"$(nproc)" --target hostkvd hostkv \
 && /build/server/hostkvd --version | grep -q 'cuda (CUDA runtime' \
 && strip /build/server/hostkvd /build/client/hostkv

# ---------------------------------------------------------------------------
# Runtime base: the shared libraries of `ldd hostkvd` / `ldd hostkv` (gRPC
# 1.51, protobuf, abseil, spdlog/fmt, prometheus-cpp's core (hostkvd serves
# /metrics itself: no prometheus-cpp-pull, no civetweb), hiredis 0.14 for the
# Redis/Valkey storage tier (--tier=redis://...); c-ares, re2, OpenSSL and
# zlib come as their dependencies, libstdc++ with the base image). No
# compiler, no headers, no CUDA library (the GPU build links the CUDA runtime
# statically; libcuda is the host driver's). tests/deploy checks that every
# library ldd finds comes from this list's package closure.
FROM ${RUNTIME_BASE} AS runtime-base
ARG DEBIAN_FRONTEND=noninteractive
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

# ---------------------------------------------------------------------------
# The GPU image (--target runtime-gpu): hostkvd with the CUDA backend. Run it
# with the NVIDIA container toolkit (runtimeClassName: nvidia, or
# `--gpus all` / `--device nvidia.com/gpu=all`), which mounts the host's
# driver; without a driver it serves the CPU backend and says so at start.
# CUDA IPC needs the engines' pid and IPC namespaces (deploy/README.md).
FROM runtime-base AS runtime-gpu
LABEL org.opencontainers.image.title="hostkvd" \
      org.opencontainers.image.description="node-local host KV-cache daemon for LLM inference engines (CUDA and CPU backends; driver from the host)" \
      org.opencontainers.image.version="0.1.0"
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=build-gpu /build/server/hostkvd /build/client/hostkv /usr/local/bin/

# ---------------------------------------------------------------------------
# The CPU image (the default target).
FROM runtime-base AS runtime
LABEL org.opencontainers.image.title="hostkvd" \
      org.opencontainers.image.description="node-local host KV-cache daemon for LLM inference engines (CPU backend)" \
      org.opencontainers.image.version="0.1.0"
COPY --from=build /build/server/hostkvd /build/client/hostkv /usr/local/bin/
