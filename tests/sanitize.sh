#!/usr/bin/env bash
# Builds everything with clang and a sanitizer, then runs the whole ctest
# suite (unit and end-to-end tests) under it.
#
# usage: tests/sanitize.sh asan    # AddressSanitizer + LeakSanitizer + UBSan
#        tests/sanitize.sh tsan    # ThreadSanitizer
#
# Environment: JOBS (build parallelism, default nproc), CTEST_JOBS (default
# 1: sanitized daemons are slow, parallel e2e tests only add timeouts),
# CTEST_ARGS (extra ctest arguments, e.g. "-R e2e_").
#
# Build dirs: build-asan / build-tsan at the repository root, configured with
# CC=clang CXX=clang++ -DHOSTKV_SANITIZE=... -DHOSTKV_ENABLE_CUDA=OFF
# -DCMAKE_BUILD_TYPE=RelWithDebInfo. asan adds -fno-sanitize-recover=undefined,
# so any UBSan finding aborts the process instead of printing and going on.
#
# The end-to-end tests spawn the real hostkvd (and the hostkv CLI), built
# with the same sanitizer, so the daemon is checked too. Its stderr goes to a
# private log the tests rarely print, and most tests SIGKILL it at the end, so
# a report in the daemon could go unnoticed. Therefore every sanitizer writes
# its reports to files (log_path=<build>/sanitizer-reports/<kind>.<pid>)
# instead of stderr, for test binaries and daemons alike; halt_on_error makes
# the reporting process exit at once (a dead daemon fails the test that
# talks to it), and after ctest this script prints every report file and
# exits non-zero if there is any, whether or not a test failed.
# LeakSanitizer runs when a process exits normally: test binaries, and the
# daemons that tests stop with SIGTERM (lifecycle_test, reflection_test);
# a leak makes that exit code non-zero (checked by those tests) and leaves a
# report file.
#
# TSan and uninstrumented libraries: gRPC, protobuf and Abseil come from
# Debian and are not built with -fsanitize=thread. absl::Mutex lives in
# libabsl_synchronization, so TSan does not see its lock/unlock and could
# report false races on data guarded by absl::Mutex. In practice it does not:
# absl::Mutex's fast paths are inline atomics in absl/synchronization/mutex.h,
# compiled into our (instrumented) code... only partly, so see tests/tsan.supp
# for what is suppressed, if anything, and why. Real races in our code are
# never suppressed there.
set -euo pipefail

mode="${1:-}"
case "${mode}" in
  asan)
    sanitize="address,undefined"
    extra_flags="-fno-sanitize-recover=undefined"
    ;;
  tsan)
    sanitize="thread"
    extra_flags=""
    ;;
  *)
    echo "usage: $0 asan|tsan" >&2
    exit 2
    ;;
esac

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${root}/build-${mode}"
reports="${build}/sanitizer-reports"
jobs="${JOBS:-$(nproc)}"

echo "== configure ${build} (clang, -fsanitize=${sanitize})"
CC=clang CXX=clang++ cmake -S "${root}" -B "${build}" \
  -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHOSTKV_ENABLE_CUDA=OFF \
  -DHOSTKV_BUILD_TESTS=ON \
  -DHOSTKV_SANITIZE="${sanitize}" \
  -DCMAKE_CXX_FLAGS="${extra_flags}" >/dev/null

echo "== build (-j${jobs})"
cmake --build "${build}" -j"${jobs}"

rm -rf "${reports}"
mkdir -p "${reports}"
ulimit -c 0 || true

# Symbolized stacks need llvm-symbolizer; clang 14 ships it under this name.
if ! command -v llvm-symbolizer >/dev/null 2>&1; then
  for s in /usr/bin/llvm-symbolizer-14 /usr/lib/llvm-14/bin/llvm-symbolizer; do
    if [[ -x "${s}" ]]; then
      export ASAN_SYMBOLIZER_PATH="${s}" TSAN_SYMBOLIZER_PATH="${s}"
      export UBSAN_SYMBOLIZER_PATH="${s}"
      break
    fi
  done
fi

if [[ "${mode}" == asan ]]; then
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:log_path=${reports}/asan"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=${reports}/ubsan"
  export LSAN_OPTIONS="log_path=${reports}/lsan"
  if [[ -s "${root}/tests/lsan.supp" ]]; then
    LSAN_OPTIONS+=":suppressions=${root}/tests/lsan.supp"
  fi
else
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:log_path=${reports}/tsan"
  if [[ -s "${root}/tests/tsan.supp" ]]; then
    TSAN_OPTIONS+=":suppressions=${root}/tests/tsan.supp"
  fi
fi

echo "== ctest (${mode})"
set +e
# shellcheck disable=SC2086
ctest --test-dir "${build}" --output-on-failure -j"${CTEST_JOBS:-1}" \
  --timeout 900 ${CTEST_ARGS:-}
ctest_rc=$?
set -e

shopt -s nullglob
report_files=("${reports}"/*)
if ((${#report_files[@]} > 0)); then
  echo
  echo "== ${#report_files[@]} sanitizer report(s) in ${reports}:"
  for f in "${report_files[@]}"; do
    echo "---- ${f}"
    cat "${f}"
  done
fi

if ((ctest_rc != 0)); then
  echo "FAIL: ctest exited ${ctest_rc} (${mode})" >&2
  exit 1
fi
if ((${#report_files[@]} > 0)); then
  echo "FAIL: tests passed but the sanitizer reported (${mode}); see above" >&2
  exit 1
fi
echo "OK: every test passed under ${mode}, no sanitizer reports"
