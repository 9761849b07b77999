// The harness's assertion: a violated check prints what and aborts, which
// libFuzzer saves as a crash.
#ifndef HOSTKV_TESTS_FUZZ_FUZZ_CHECK_H_
#define HOSTKV_TESTS_FUZZ_FUZZ_CHECK_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace hostkv::fuzz {

// Prints "invariant violated: <what>" and aborts.
[[noreturn]] void Die(const std::string& what);

#define FUZZ_CHECK(cond, ...)                                      \
  do {                                                             \
    if (!(cond)) {                                                 \
      Die(absl::StrCat(__FILE__, ":", __LINE__, ": ", #cond, ": ", \
                       ##__VA_ARGS__));                            \
    }                                                              \
  } while (0)

}  // namespace hostkv::fuzz

#endif  // HOSTKV_TESTS_FUZZ_FUZZ_CHECK_H_
