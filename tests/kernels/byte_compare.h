// Byte-for-byte comparison for the copy tests (CPU and GPU): names the first
// byte that differs.
#ifndef HOSTKV_TESTS_KERNELS_BYTE_COMPARE_H_
#define HOSTKV_TESTS_KERNELS_BYTE_COMPARE_H_

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace hostkv {

inline ::testing::AssertionResult SameBytes(const std::string& what,
                                            const uint8_t* expected,
                                            const uint8_t* actual,
                                            uint64_t size) {
  for (uint64_t i = 0; i < size; ++i) {
    if (expected[i] != actual[i]) {
      return ::testing::AssertionFailure()
             << what << ": byte " << i << " of " << size << " is "
             << int{actual[i]} << ", expected " << int{expected[i]};
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace hostkv

#endif  // HOSTKV_TESTS_KERNELS_BYTE_COMPARE_H_
