#!/usr/bin/env bash
# Builds hostkvd and the benchmark driver (Release, CPU backend only) in their
# own build directory and runs every benchmark: each figure beside a baseline
# measured in the same run, and their ratio. Writes ${OUT}/bench.json and
# ${OUT}/bench.md and prints the Markdown table.
#
#   tests/bench/run.sh                         # everything, a few minutes
#   tests/bench/run.sh --quick                 # a smoke run
#   tests/bench/run.sh --sections=control,copy # some sections
#
# Environment: OUT (default tests/bench/results), BUILD_DIR (default
# build-bench at the repository root). Extra arguments go to hostkv_bench
# (--help lists them). Benchmarks are not ctest tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [[ -z ${OUT:-} ]]; then
  OUT="$here/results"
else
  case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac  # relative to the caller
fi
cd "$here/../.."
BUILD_DIR=${BUILD_DIR:-build-bench}
mkdir -p "$OUT" "$BUILD_DIR"

echo "== building (Release, CPU only) in $BUILD_DIR" >&2
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DHOSTKV_ENABLE_CUDA=OFF \
  -DHOSTKV_BUILD_TESTS=ON > "$BUILD_DIR/bench-configure.log" 2>&1 ||
  { cat "$BUILD_DIR/bench-configure.log" >&2; exit 1; }
cmake --build "$BUILD_DIR" -j"$(nproc)" --target hostkvd hostkv_bench >&2

rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || rev="$rev (uncommitted changes)"
echo "== running (progress on stderr; the table follows on stdout)" >&2
"$BUILD_DIR/tests/bench/hostkv_bench" --out="$OUT" --git_rev="$rev" "$@"
