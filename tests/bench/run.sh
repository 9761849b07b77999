#!/usr/bin/env bash
# Builds hostkvd and the benchmark driver (Release, CPU backend only) in their
# own build directory and runs every benchmark: each figure beside a baseline
# measured in the same run, and their ratio. Writes ${OUT}/bench.json and
# ${OUT}/bench.md and prints the Markdown table.
#
#   tests/bench/run.sh                         # everything, a few minutes
#   tests/bench/run.sh --quick                 # a smoke run
#   tests/bench/run.sh --sections=control,copy # some sections
#   tests/bench/run.sh --python_client         # Python client vs C++ client vs
#                                              # bare gRPC, one daemon (~10 s)
#
# Environment: OUT (default tests/bench/results), BUILD_DIR (default
# build-bench at the repository root). Extra arguments go to hostkv_bench
# (--help lists them), or with --python_client first, to
# tests/bench/python_client_bench.py, which writes ${OUT}/python_client.json
# and python_client.md. Benchmarks are not ctest tests.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [[ -z ${OUT:-} ]]; then
  OUT="$here/results"
else
  case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac  # relative to the caller
fi
cd "$here/../.."
BUILD_DIR=${BUILD_DIR:-build-bench}
targets=(hostkvd hostkv_bench)
python_client=0
if [[ ${1:-} == --python_client ]]; then
  shift
  python_client=1
  targets=(hostkvd client_cost_bench hostkv_python_stubs)
fi
mkdir -p "$OUT" "$BUILD_DIR"

echo "== building (Release, CPU only) in $BUILD_DIR" >&2
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DHOSTKV_ENABLE_CUDA=OFF \
  -DHOSTKV_BUILD_TESTS=ON > "$BUILD_DIR/bench-configure.log" 2>&1 ||
  { cat "$BUILD_DIR/bench-configure.log" >&2; exit 1; }
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]}" >&2

if ((python_client)); then
  echo "== running (progress on stderr; the table follows on stdout)" >&2
  /usr/bin/python3 tests/bench/python_client_bench.py --build_dir="$BUILD_DIR" \
    --json="$OUT/python_client.json" "$@" | tee "$OUT/python_client.md"
  exit
fi

rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || rev="$rev (uncommitted changes)"
echo "== running (progress on stderr; the table follows on stdout)" >&2
"$BUILD_DIR/tests/bench/hostkv_bench" --out="$OUT" --git_rev="$rev" "$@"
