#!/usr/bin/env bash
# Builds hostkv with CUDA (sm_90) on a GPU machine, runs every GPU test
# (ctest label `gpu`: the CUDA layout math, the copy kernel, and the data path
# end to end through a real hostkvd) and the GPU benchmark. Results go to
# $OUT (default ./gpu-results): summary.txt (test summary and benchmark
# table), gpu_bench.{json,md}, and every log.
#
# Exit status: that of the tests when they failed (a test skipped on a
# machine with a GPU counts as failed), else that of the benchmark. Takes
# about 4 minutes on 16 cores and an H200 (build ~1, tests ~1, bench ~2);
# the phases' time limits keep even a hung run under 8 minutes after the
# build. BUILD_DIR (default build-gpu) names the build directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}  # relative to the repository root
rm -f "$OUT/phases.txt"
started=$(date +%s)
phase() { echo "[$(($(date +%s) - started))s] $*" | tee -a "$OUT/phases.txt"; }

have_gpu=0
{
  echo "date: $(date -u +%FT%TZ)"
  if nvidia-smi --query-gpu=name,driver_version,memory.total,persistence_mode \
      --format=csv,noheader; then
    have_gpu=1
    nvidia-smi | head -n 4 | tail -n 1  # the CUDA version the driver supports
  fi
  echo "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -n 1 || echo none)"
  echo "cores: $(nproc)"
  free -g | head -n 2
  df -h /dev/shm
} > "$OUT/machine.txt" 2>&1 || true
cat "$OUT/machine.txt"

# Packages: only when something the build needs is missing
# (deploy/install_deps.sh installs whatever of its list is missing).
needed=(cmake g++ make libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler libspdlog-dev libabsl-dev libgtest-dev libgmock-dev
  grpc-proto prometheus-cpp-dev)
missing=()
for p in "${needed[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  phase "installing packages: ${missing[*]}"
  timeout 300 ./deploy/install_deps.sh > "$OUT/apt.log" 2>&1 \
    || echo "package installation failed (see apt.log); building with what is there"
fi

# hostkvd's pools live in /dev/shm: the tests need ~0.5 GiB, the benchmark
# ~2.5 GiB (it shrinks its transfers to fit). A container's default 64 MiB
# is raised when we may.
shm_kib=$(df -k --output=size /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ' || echo 0)
if [ "${shm_kib:-0}" -lt $((4 * 1024 * 1024)) ] && [ "$(id -u)" -eq 0 ]; then
  mount -o remount,size=16G /dev/shm >> "$OUT/machine.txt" 2>&1 \
    && echo "/dev/shm remounted with 16G" >> "$OUT/machine.txt" || true
fi

phase "configuring"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 \
  || { tail -n 30 "$OUT/configure.log"; echo "configure failed" > "$OUT/summary.txt"; exit 1; }
if ! grep -q "hostkv: CUDA sources ON" "$OUT/configure.log"; then
  echo "configure found no nvcc: nothing to test on the GPU" | tee "$OUT/summary.txt"
  exit 1
fi
phase "building"
targets=(hostkvd gpu_layout_offsets_test gpu_copy_kernels_test gpu_transfer_test
  hostkv_gpu_bench hostkv_signal_bench)
timeout 420 cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]}" \
  > "$OUT/build.log" 2>&1 \
  || { tail -n 40 "$OUT/build.log"; echo "build failed (build.log)" > "$OUT/summary.txt"; exit 1; }

# summary.txt, written after the tests and again after the benchmark, so
# that it survives a run cut short.
bench_rc="not run"
signal_rc="not run"
write_summary() {
  {
    echo "== GPU tests (ctest -L gpu): exit code $gpu_rc"
    grep -E "tests passed|tests failed|Total Test time|\(Failed\)|\(Timeout\)|\(Skipped\)|Not Run|Exception|\*\*\*" \
      "$OUT/gpu-tests.log" || true
    grep -hE "^\[  FAILED  \]" "$OUT/ctest-LastTest.log" | sort -u | head -n 60 || true
    if [ "$skipped_on_gpu" -eq 1 ]; then
      echo "a GPU is present but tests were skipped: counted as failed; the reason:"
      grep -h -m 1 "cudaGetDeviceCount" "$OUT/ctest-LastTest.log" \
        || grep -h -m 1 -A 1 "Skipped$" "$OUT/ctest-LastTest.log" | tail -n 1 || true
    fi
    grep -h "^\[   INFO   \]" "$OUT/ctest-LastTest.log" || true
    echo
    echo "== GPU benchmark: exit code $bench_rc"
    if [ -s "$OUT/gpu_bench.md" ]; then
      cat "$OUT/gpu_bench.md"
    elif [ -f "$OUT/gpu-bench.log" ]; then
      tail -n 30 "$OUT/gpu-bench.log"
    fi
    echo
    echo "== signal latency (hostkv_signal_bench): exit code $signal_rc"
    [ -s "$OUT/signal_bench.md" ] && cat "$OUT/signal_bench.md"
    [ -s "$OUT/signal-bench.log" ] && tail -n 5 "$OUT/signal-bench.log"
    echo
    echo "== phases"
    cat "$OUT/phases.txt"
  } > "$OUT/summary.txt"
}

phase "GPU tests"
mkdir -p "$OUT/gtest" "$OUT/daemon-logs"
set +e
GTEST_OUTPUT="xml:$OUT/gtest/" HOSTKV_GPU_TEST_LOGS="$OUT/daemon-logs" \
  timeout 300 ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure \
  --timeout 180 > "$OUT/gpu-tests.log" 2>&1
gpu_rc=$?
set -e
cp "$BUILD_DIR/Testing/Temporary/LastTest.log" "$OUT/ctest-LastTest.log" 2>/dev/null \
  || touch "$OUT/ctest-LastTest.log"
skipped_on_gpu=0
if [ "$have_gpu" -eq 1 ] && grep -q "(Skipped)" "$OUT/gpu-tests.log"; then
  skipped_on_gpu=1  # e.g. a driver too old for the CUDA runtime: see the log
  [ "$gpu_rc" -eq 0 ] && gpu_rc=3
fi
write_summary

phase "signal latency"
set +e
timeout 60 "$BUILD_DIR/tests/gpu/hostkv_signal_bench" --out "$OUT" \
  > "$OUT/signal-bench.stdout" 2> "$OUT/signal-bench.log"
signal_rc=$?
set -e

phase "GPU benchmark"
set +e
timeout 170 "$BUILD_DIR/tests/gpu/hostkv_gpu_bench" --out="$OUT" \
  > "$OUT/gpu-bench.stdout" 2> "$OUT/gpu-bench.log"
bench_rc=$?
set -e
phase "done"
write_summary
cat "$OUT/summary.txt"
[ "$gpu_rc" -ne 0 ] && exit "$gpu_rc"
exit "$bench_rc"
