#!/usr/bin/env bash
# Builds everything with clang and a sanitizer, then runs the whole ctest
# suite (unit and end-to-end tests) under it.
#
# usage: tests/sanitize.sh asan    # AddressSanitizer + LeakSanitizer + UBSan
#        tests/sanitize.sh tsan    # ThreadSanitizer
#
# Environment: JOBS (build parallelism, default nproc); CTEST_JOBS (default
# 1: sanitized daemons are slow, parallel e2e tests only invite timeouts);
# CTEST_ARGS (extra ctest arguments, e.g. "-R e2e_" or "-E copy_plan_test");
# BUILD_TARGETS (build only these, e.g. "hostkvd peer_connections_test",
# with a CTEST_ARGS -R that runs only their tests).
#
# Build trees: build-asan / build-tsan at the repository root, configured
# with CC=clang CXX=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo
# -DHOSTKV_ENABLE_CUDA=OFF -DHOSTKV_SANITIZE=address,undefined (asan) or
# thread (tsan). asan also compiles with -fno-sanitize-recover=undefined, so
# a UBSan finding aborts the process instead of printing and going on.
#
# The daemon is checked too. The end-to-end tests spawn the real hostkvd (and
# the hostkv CLI), built with the same sanitizer; but the daemon's stderr
# goes to a log the tests rarely print, and most tests SIGKILL it at the end,
# so its reports could go unnoticed. Therefore every sanitizer here writes
# its reports to files, log_path=<build>/sanitizer-reports/<kind>.<pid>, in
# test binaries and daemons alike; halt_on_error makes the reporting process
# stop at its first report (a dead daemon also fails the test talking to
# it); and after ctest this script prints every report file and exits
# non-zero if there is any, even when every test passed. LeakSanitizer runs
# when a process exits normally: every test binary, and the daemons that
# tests stop with SIGTERM (e2e_lifecycle_test, e2e_reflection_test), whose
# exit code then also becomes non-zero.
#
# TSan and the system libraries. gRPC, protobuf and Abseil come from Debian
# and are not instrumented. Two consequences, and what this script does:
#  1. absl::Mutex (in libabsl_synchronization) is invisible to TSan: it sees
#     no happens-before from a MutexLock, and reports every pair of accesses
#     to mutex-guarded data from two threads as a race (checked here: every
#     test with threads failed that way), including accesses by
#     absl::Condition callbacks that Abseil runs on another thread while that
#     thread holds the mutex. Suppressing those would suppress our own code.
#     Instead, a small shim (source below, built into build-tsan) is linked
#     into every executable ahead of libabsl_synchronization: it defines
#     absl::Mutex::{Lock,Unlock,ReaderLock,ReaderUnlock,TryLock,ReaderTryLock,
#     LockWhen*,ReaderLockWhen*,Await*,~Mutex} and absl::CondVar::Wait*, calls
#     the real ones (dlsym RTLD_NEXT), and wraps them in the __tsan_mutex_*
#     annotations Abseil makes itself when built with -fsanitize=thread
#     (accesses inside the lock operation, condition callbacks included, are
#     ignored; the lock is acquired/released for TSan at the same points).
#     Only calls made from the executable (our instrumented code, statically
#     linked) are annotated; the libraries' own mutexes stay invisible like
#     the rest of those libraries. Checked: without the shim a program with
#     correctly locked data gets a report, with it none; a write without the
#     lock is still reported. Limit: what an absl::Condition callback reads
#     (Await, LockWhen) is not checked at all, since it runs inside the
#     ignored lock operation.
#  2. Interceptors (malloc/free, memcpy, epoll, sendmsg...) called from inside
#     gRPC and Abseil see only part of those libraries' synchronization
#     (their atomics are not instrumented) and report races between library
#     internals (seen here: gRPC's epoll fd, slice buffers, Abseil's
#     deadlock-detection graph). TSAN_OPTIONS=ignore_noninstrumented_modules=1
#     ignores interceptor calls made from uninstrumented modules. Accesses by
#     our code are unaffected.
# tests/tsan.supp, if present and non-empty, is passed as suppressions;
# none is needed today. Real races in our code must be fixed, not suppressed.
#
# Checked by planting bugs in a scratch copy: a leak in a daemon-only path
# (GrpcService) gave report files and failed the two tests that SIGTERM the
# daemon; an unsynchronized write in the daemon gave a TSan report file and
# failed the e2e test whose daemon it stopped.
set -euo pipefail

mode="${1:-}"
case "${mode}" in
  asan)
    sanitize="address,undefined"
    cxx_flags="-fno-sanitize-recover=undefined"
    ;;
  tsan)
    sanitize="thread"
    cxx_flags=""
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
mkdir -p "${build}"

linker_flags=""
if [[ "${mode}" == tsan ]]; then
  shim_dir="${build}/absl_tsan_shim"
  shim="${shim_dir}/libhostkv_absl_tsan_shim.so"
  mkdir -p "${shim_dir}"
  cat >"${shim_dir}/shim.cc.new" <<'HOSTKV_SHIM'
// Generated by tests/sanitize.sh (tsan); edit it there.
// TSan annotations for the uninstrumented absl::Mutex / absl::CondVar of the
// system Abseil. Linked into every executable of build-tsan ahead of
// libabsl_synchronization, so these definitions win; each calls the real one
// (dlsym RTLD_NEXT) between the __tsan_mutex_* annotations Abseil itself
// would make if it were built with -fsanitize=thread.
#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "absl/synchronization/mutex.h"

extern "C" {
void __tsan_mutex_destroy(void*, unsigned) __attribute__((weak));
void __tsan_mutex_pre_lock(void*, unsigned) __attribute__((weak));
void __tsan_mutex_post_lock(void*, unsigned, int) __attribute__((weak));
int __tsan_mutex_pre_unlock(void*, unsigned) __attribute__((weak));
void __tsan_mutex_post_unlock(void*, unsigned) __attribute__((weak));
}

namespace {

constexpr unsigned kRead = 1u << 3;        // __tsan_mutex_read_lock
constexpr unsigned kTry = 1u << 4;         // __tsan_mutex_try_lock
constexpr unsigned kTryFailed = 1u << 5;   // __tsan_mutex_try_lock_failed

template <typename F>
F Real(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (p == nullptr) {
    std::fprintf(stderr, "absl mutex tsan shim: %s not found\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(p);
}

// Annotations need the TSan runtime (linked into the executable).
bool On() { return &__tsan_mutex_pre_lock != nullptr; }

// Only calls from the main executable (our instrumented code, statically
// linked) are annotated; the uninstrumented libraries' own mutexes (gRPC,
// Abseil internals) stay invisible to TSan, like the rest of those libraries.
struct Range {
  uintptr_t begin, end;
};
Range main_ranges[16];
int main_range_count = 0;

int CollectMain(dl_phdr_info* info, size_t, void*) {
  for (int i = 0; i < info->dlpi_phnum && main_range_count < 16; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
    main_ranges[main_range_count++] = {begin, begin + ph.p_memsz};
  }
  return 1;  // the first object is the main program
}

__attribute__((constructor)) void FindMain() { dl_iterate_phdr(CollectMain, nullptr); }

bool FromMain(const void* caller) {
  const auto pc = reinterpret_cast<uintptr_t>(caller);
  for (int i = 0; i < main_range_count; ++i) {
    if (pc >= main_ranges[i].begin && pc < main_ranges[i].end) return true;
  }
  return false;
}
#define CALLER __builtin_return_address(0)

// Some entry points call others through the PLT (CondVar::WaitWithTimeout
// calls WaitWithDeadline...): only the outermost call is annotated.
thread_local int depth = 0;
struct Outer {
  explicit Outer(const void* caller)
      : on(depth++ == 0 && On() && FromMain(caller)) {}
  ~Outer() { --depth; }
  const bool on;
};

// Lock-like call: what runs inside (the condition, absl's bookkeeping) is
// ignored by TSan; the lock is taken at the end (unless a try failed).
template <typename R, typename Call>
R AnnotatedLock(const void* caller, void* m, unsigned flags, Call call) {
  Outer o(caller);
  if (!o.on) return call();
  __tsan_mutex_pre_lock(m, flags);
  R r = call();
  unsigned post = flags;
  if constexpr (!std::is_void_v<R>) {
    if ((flags & kTry) && !r) post |= kTryFailed;
  }
  __tsan_mutex_post_lock(m, post, 0);
  return r;
}
template <typename Call>
void AnnotatedLockV(const void* caller, void* m, unsigned flags, Call call) {
  AnnotatedLock<int>(caller, m, flags, [&] { call(); return 1; });
}

// Unlock-like call: the mutex is released at the start.
template <typename Call>
void AnnotatedUnlock(const void* caller, void* m, unsigned flags, Call call) {
  Outer o(caller);
  if (!o.on) return call();
  __tsan_mutex_pre_unlock(m, flags);
  call();
  __tsan_mutex_post_unlock(m, flags);
}

// Await / CondVar::Wait: released at the start, held again at the end.
template <typename R, typename Call>
R AnnotatedWait(const void* caller, void* m, Call call) {
  Outer o(caller);
  if (!o.on) return call();
  __tsan_mutex_pre_unlock(m, 0);
  R r = call();
  __tsan_mutex_post_unlock(m, 0);
  __tsan_mutex_pre_lock(m, 0);
  __tsan_mutex_post_lock(m, 0, 0);
  return r;
}

}  // namespace

#define REAL(type, name) static const auto real = Real<type>(name)

namespace absl {
ABSL_NAMESPACE_BEGIN
using Cond = const Condition&;

Mutex::~Mutex() {
  REAL(void (*)(Mutex*), "_ZN4absl7debian35MutexD1Ev");
  if (On() && depth == 0 && FromMain(CALLER)) __tsan_mutex_destroy(this, 0);
  real(this);
}
void Mutex::Lock() {
  REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  AnnotatedLockV(CALLER, this, 0, [&] { real(this); });
}
void Mutex::ReaderLock() {
  REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  AnnotatedLockV(CALLER, this, kRead, [&] { real(this); });
}
bool Mutex::TryLock() {
  REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  return AnnotatedLock<bool>(CALLER, this, kTry, [&] { return real(this); });
}
bool Mutex::ReaderTryLock() {
  REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  return AnnotatedLock<bool>(CALLER, this, kRead | kTry, [&] { return real(this); });
}
void Mutex::LockWhen(Cond c) {
  REAL(void (*)(Mutex*, Cond), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  AnnotatedLockV(CALLER, this, 0, [&] { real(this, c); });
}
void Mutex::ReaderLockWhen(Cond c) {
  REAL(void (*)(Mutex*, Cond), "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  AnnotatedLockV(CALLER, this, kRead, [&] { real(this, c); });
}
bool Mutex::LockWhenWithTimeout(Cond c, Duration t) {
  REAL(bool (*)(Mutex*, Cond, Duration), "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return AnnotatedLock<bool>(CALLER, this, 0, [&] { return real(this, c, t); });
}
bool Mutex::ReaderLockWhenWithTimeout(Cond c, Duration t) {
  REAL(bool (*)(Mutex*, Cond, Duration), "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return AnnotatedLock<bool>(CALLER, this, kRead, [&] { return real(this, c, t); });
}
bool Mutex::LockWhenWithDeadline(Cond c, Time d) {
  REAL(bool (*)(Mutex*, Cond, Time), "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return AnnotatedLock<bool>(CALLER, this, 0, [&] { return real(this, c, d); });
}
bool Mutex::ReaderLockWhenWithDeadline(Cond c, Time d) {
  REAL(bool (*)(Mutex*, Cond, Time), "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return AnnotatedLock<bool>(CALLER, this, kRead, [&] { return real(this, c, d); });
}
void Mutex::Unlock() {
  REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  AnnotatedUnlock(CALLER, this, 0, [&] { real(this); });
}
void Mutex::ReaderUnlock() {
  REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  AnnotatedUnlock(CALLER, this, kRead, [&] { real(this); });
}
// Await and CondVar waits are modelled for a mutex held exclusively (how
// this code base and gRPC use them).
void Mutex::Await(Cond c) {
  REAL(void (*)(Mutex*, Cond), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  AnnotatedWait<int>(CALLER, this, [&] { real(this, c); return 0; });
}
bool Mutex::AwaitWithTimeout(Cond c, Duration t) {
  REAL(bool (*)(Mutex*, Cond, Duration), "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return AnnotatedWait<bool>(CALLER, this, [&] { return real(this, c, t); });
}
bool Mutex::AwaitWithDeadline(Cond c, Time d) {
  REAL(bool (*)(Mutex*, Cond, Time), "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return AnnotatedWait<bool>(CALLER, this, [&] { return real(this, c, d); });
}
void CondVar::Wait(Mutex* mu) {
  REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  AnnotatedWait<int>(CALLER, mu, [&] { real(this, mu); return 0; });
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration t) {
  REAL(bool (*)(CondVar*, Mutex*, Duration), "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return AnnotatedWait<bool>(CALLER, mu, [&] { return real(this, mu, t); });
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time d) {
  REAL(bool (*)(CondVar*, Mutex*, Time), "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return AnnotatedWait<bool>(CALLER, mu, [&] { return real(this, mu, d); });
}
ABSL_NAMESPACE_END
}  // namespace absl
HOSTKV_SHIM
  # Rebuild only when the source changed (keeps the build tree's link up to date).
  if ! cmp -s "${shim_dir}/shim.cc.new" "${shim_dir}/shim.cc" || [[ ! -f "${shim}" ]]; then
    mv "${shim_dir}/shim.cc.new" "${shim_dir}/shim.cc"
    echo "== build the absl::Mutex TSan shim"
    clang++ -std=c++17 -O2 -g -fPIC -shared -Wall -Werror \
      -o "${shim}" "${shim_dir}/shim.cc" -ldl
  else
    rm -f "${shim_dir}/shim.cc.new"
  fi
  # First on the link line, so it comes before libabsl_synchronization in
  # the symbol lookup order; no soname, so DT_NEEDED holds the full path.
  linker_flags="-Wl,--push-state,--no-as-needed ${shim} -Wl,--pop-state"
fi

echo "== configure ${build} (clang, -fsanitize=${sanitize})"
CC=clang CXX=clang++ cmake -S "${root}" -B "${build}" \
  -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHOSTKV_ENABLE_CUDA=OFF \
  -DHOSTKV_BUILD_TESTS=ON \
  -DHOSTKV_SANITIZE="${sanitize}" \
  -DCMAKE_CXX_FLAGS="${cxx_flags}" \
  -DCMAKE_EXE_LINKER_FLAGS="${linker_flags}" >/dev/null

echo "== build (-j${jobs}${BUILD_TARGETS:+, targets ${BUILD_TARGETS}})"
# shellcheck disable=SC2086
cmake --build "${build}" -j"${jobs}" ${BUILD_TARGETS:+--target ${BUILD_TARGETS}}

rm -rf "${reports}"
mkdir -p "${reports}"
ulimit -c 0 || true

if [[ "${mode}" == asan ]]; then
  # log_path is common to the three runtimes in one process: same value.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:log_path=${reports}/asan"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=${reports}/asan"
  export LSAN_OPTIONS="log_path=${reports}/asan"
else
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:log_path=${reports}/tsan"
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
  echo "FAIL: every test passed, but the sanitizer reported (${mode}); see above" >&2
  exit 1
fi
echo "OK: every test passed under ${mode}, no sanitizer reports"
