#!/usr/bin/env bash
# Installs what the tests need, builds everything (CUDA sources too when nvcc
# is present) and runs the whole test suite (GPU tests skip without a GPU),
# then a CI-sized run of the request fuzzer (FUZZ_SECONDS, default 60; 0
# skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600
if [ "${FUZZ_SECONDS:-60}" != 0 ]; then
  FUZZ_SECONDS="${FUZZ_SECONDS:-60}" tests/fuzz/run_fuzzer.sh
fi
