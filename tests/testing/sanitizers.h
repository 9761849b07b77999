// Which sanitizer this test binary (and, in the sanitizer builds, the
// daemon it starts) was built with.
#ifndef HOSTKV_TESTS_TESTING_SANITIZERS_H_
#define HOSTKV_TESTS_TESTING_SANITIZERS_H_

namespace hostkv::testing {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// ThreadSanitizer runs signal handlers inside its own wrapper, and a
// siglongjmp out of a SIGBUS handler (kernels/fault_guard.h) does not come
// back from it: the process dies of the fault. The fault guard is checked
// by the plain and the ASan builds.
inline constexpr char kNoFaultGuardUnderTsan[] =
    "ThreadSanitizer cannot run the SIGBUS fault guard (siglongjmp out of its "
    "signal wrapper); checked by the plain and ASan builds";

}  // namespace hostkv::testing

#endif  // HOSTKV_TESTS_TESTING_SANITIZERS_H_
