#!/usr/bin/env bash
# Installs the Debian 12 packages hostkv builds and tests with (idempotent).
set -euo pipefail
PACKAGES=(cmake g++ make libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler libspdlog-dev libabsl-dev libgtest-dev libgmock-dev
  libbenchmark-dev grpc-proto prometheus-cpp-dev python3-yaml python3-grpcio python3-protobuf python3-grpc-tools
  python3-torch python3-pytest python3-pip python3-venv
  clang libclang-rt-14-dev
  libhiredis-dev redis-server redis-tools)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
