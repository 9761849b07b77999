#!/usr/bin/env bash
# Builds request_fuzzer, ledger_fuzzer and session_socket_fuzzer (clang,
# libFuzzer, ASan + UBSan) in build-fuzz; fuzzes the request layer for
# FUZZ_SECONDS (default 60) from a copy of the seed corpus, then what a daemon
# adopts after a restart (edited ledgers) for LEDGER_FUZZ_SECONDS (default
# 15), then the session socket (records, descriptors, connection bounds) for
# SOCKET_FUZZ_SECONDS (default 15).
#
# usage: tests/fuzz/run_fuzzer.sh [extra libFuzzer flags...]
#   FUZZ_SECONDS=600 tests/fuzz/run_fuzzer.sh
#   tests/fuzz/run_fuzzer.sh -jobs=2 -workers=2     # parallel, if cores allow
# Replay a saved input:
#   build-fuzz/tests/fuzz/request_fuzzer tests/fuzz/crashes/crash-<sha1>
#
# Environment: FUZZ_SECONDS (60), JOBS (build parallelism, default nproc),
# FUZZ_TIMEOUT (seconds one input may take before it counts as a hang, 20).
# Read by the fuzzer itself: HOSTKV_FUZZ_STATS=1 prints, at exit, how often
# each request ran and succeeded (e.g. replaying a corpus:
# HOSTKV_FUZZ_STATS=1 build-fuzz/tests/fuzz/request_fuzzer build-fuzz/fuzz-corpus/*).
#
# Exits non-zero if the fuzzer found anything (crash, sanitizer report, a
# violated harness invariant, leak, hang, out-of-memory); the input that
# triggered it is saved in tests/fuzz/crashes/ and its name printed.
# The working corpus (seeds + what the run found) stays in
# build-fuzz/fuzz-corpus; tests/fuzz/corpus holds only the small seed set.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${root}/build-fuzz"
seeds="${root}/tests/fuzz/corpus"
crashes="${root}/tests/fuzz/crashes"
corpus="${build}/fuzz-corpus"
log="${build}/request_fuzzer.log"
seconds="${FUZZ_SECONDS:-60}"
jobs="${JOBS:-$(nproc)}"

if ! grep -qE '^[[:space:]]*add_subdirectory\(fuzz\)' "${root}/tests/CMakeLists.txt"; then
  echo "tests/CMakeLists.txt does not add_subdirectory(fuzz): no fuzz targets" >&2
  exit 2
fi

echo "== configure ${build}"
CC=clang CXX=clang++ cmake -S "${root}" -B "${build}" \
  -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHOSTKV_SANITIZE=address,undefined \
  -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=undefined" \
  -DHOSTKV_BUILD_FUZZERS=ON \
  -DHOSTKV_ENABLE_CUDA=OFF \
  -DHOSTKV_BUILD_TESTS=ON >/dev/null

echo "== build request_fuzzer ledger_fuzzer session_socket_fuzzer (-j${jobs})"
cmake --build "${build}" --target request_fuzzer ledger_fuzzer session_socket_fuzzer \
  -j"${jobs}"

rm -rf "${corpus}"
mkdir -p "${corpus}" "${crashes}"
cp "${seeds}"/* "${corpus}/" 2>/dev/null || true
ulimit -c 0 || true

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# Our shm segments: /hostkv-fuzz.<pid>.* (daemon side) and
# /hostkv-fuzzdev.<pid>.* (device buffers). A crashed run leaves them.
cleanup_shm() {
  local f pid
  for f in /dev/shm/hostkv-fuzz.* /dev/shm/hostkv-fuzzdev.* /dev/shm/hostkv-sfuzz.*; do
    [[ -e "${f}" ]] || continue
    pid="${f#/dev/shm/hostkv-*fuzz*.}"
    pid="${pid%%.*}"
    if [[ "${pid}" =~ ^[0-9]+$ ]] && ! kill -0 "${pid}" 2>/dev/null; then
      rm -f "${f}"
    fi
  done
}
cleanup_shm

# Inputs saved by earlier runs are regression tests: each must pass now.
replay_failed=0
shopt -s nullglob
saved=("${crashes}"/*)
shopt -u nullglob
if ((${#saved[@]} > 0)); then
  echo "== replay ${#saved[@]} saved input(s) from ${crashes}"
  for f in "${saved[@]}"; do
    target=request_fuzzer
    [[ "$(basename "${f}")" == ledger-* ]] && target=ledger_fuzzer
    [[ "$(basename "${f}")" == socket-* ]] && target=session_socket_fuzzer
    if ! "${build}/tests/fuzz/${target}" "${f}" >"${build}/replay.log" 2>&1; then
      echo "FAIL: ${f} still fails:"
      grep -E 'invariant violated|ERROR|SUMMARY|what\(\)' "${build}/replay.log" | head -5
      replay_failed=1
    fi
  done
  cleanup_shm
fi

before="$(ls -1 "${crashes}" | wc -l)"
echo "== fuzz for ${seconds} s (log: ${log})"
set +e
"${build}/tests/fuzz/request_fuzzer" \
  -max_total_time="${seconds}" \
  -timeout="${FUZZ_TIMEOUT:-20}" \
  -rss_limit_mb=4096 \
  -print_final_stats=1 \
  -artifact_prefix="${crashes}/" \
  "$@" "${corpus}" >"${log}" 2>&1
rc=$?
set -e
cleanup_shm

# Figures from libFuzzer's last status line and final stats.
status_line="$(grep -E '^#[0-9]+' "${log}" | tail -1 || true)"
done_line="$(grep -E '^Done [0-9]+ runs in' "${log}" | tail -1 || true)"
echo "${status_line}"
echo "${done_line}"
grep -E '^stat::' "${log}" || true
echo "corpus: $(ls -1 "${corpus}" | wc -l) inputs in ${corpus}"

after="$(ls -1 "${crashes}" | wc -l)"
if ((rc != 0 || after > before)); then
  echo
  echo "== request_fuzzer exited ${rc}; last lines of ${log}:"
  grep -vE '^#[0-9]+' "${log}" | tail -60
  echo
  echo "FAIL: the fuzzer found a problem. Saved inputs (newest first):"
  ls -1t "${crashes}" | head -n $((after - before > 0 ? after - before : 5)) |
    sed "s|^|  ${crashes}/|"
  echo "Replay: ${build}/tests/fuzz/request_fuzzer <file>"
  exit 1
fi
# Runs fuzzer $1 for $2 s (0: not at all) on its own corpus; saved inputs
# are prefixed $3; $4 says what it fuzzes.
fuzz_more() {
  local target="$1" secs="$2" prefix="$3" what="$4"
  [[ "${secs}" != 0 ]] || return 0
  local more_corpus="${build}/${prefix}corpus" more_log="${build}/${target}.log" rc
  mkdir -p "${more_corpus}"
  echo "== fuzz ${what} for ${secs} s (log: ${more_log})"
  set +e
  "${build}/tests/fuzz/${target}" -max_total_time="${secs}" \
    -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="${crashes}/${prefix}" "${more_corpus}" >"${more_log}" 2>&1
  rc=$?
  set -e
  cleanup_shm
  grep -E '^Done [0-9]+ runs in' "${more_log}" | tail -1 || true
  if ((rc != 0)); then
    grep -vE '^#[0-9]+' "${more_log}" | tail -40
    echo "FAIL: ${target} found a problem (saved in ${crashes}/${prefix}*)"
    exit 1
  fi
}
fuzz_more ledger_fuzzer "${LEDGER_FUZZ_SECONDS:-15}" ledger- "adopted ledgers"
fuzz_more session_socket_fuzzer "${SOCKET_FUZZ_SECONDS:-15}" socket- "the session socket"
if ((replay_failed)); then
  echo "FAIL: no new crash in ${seconds} s, but a saved input still fails (above)"
  exit 1
fi
echo "OK: no crash in ${seconds} s"
