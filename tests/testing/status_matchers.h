// Assertions on absl::Status / StatusOr that name the code.
#ifndef HOSTKV_TESTS_TESTING_STATUS_MATCHERS_H_
#define HOSTKV_TESTS_TESTING_STATUS_MATCHERS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace hostkv::testing {

inline const absl::Status& ToStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace hostkv::testing

// Each macro evaluates `expr` exactly once.
#define HOSTKV_STATUS_CHECK(check, expr)                              \
  do {                                                                \
    const auto& hostkv_result_ = (expr);                              \
    const ::absl::Status& hostkv_s_ =                                 \
        ::hostkv::testing::ToStatus(hostkv_result_);                  \
    check(hostkv_s_.ok()) << hostkv_s_;                               \
  } while (0)
#define EXPECT_OK(expr) HOSTKV_STATUS_CHECK(EXPECT_TRUE, expr)
#define ASSERT_OK(expr) HOSTKV_STATUS_CHECK(ASSERT_TRUE, expr)
// EXPECT_ERROR(NotFound, expr): expr failed with absl::StatusCode::kNotFound.
#define EXPECT_ERROR(error_code, expr)                                \
  do {                                                                \
    const auto& hostkv_result_ = (expr);                              \
    const ::absl::Status& hostkv_s_ =                                 \
        ::hostkv::testing::ToStatus(hostkv_result_);                  \
    EXPECT_EQ(::absl::StatusCode::k##error_code, hostkv_s_.code())    \
        << hostkv_s_;                                                 \
  } while (0)

// ASSIGN_OR_FAIL(x, expr): x = the value of StatusOr `expr`, or the test
// fails here (a fatal assertion: use in functions returning void).
#define ASSIGN_OR_FAIL(lhs, expr)                  \
  auto lhs##_or = (expr);                          \
  ASSERT_TRUE(lhs##_or.ok()) << lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

#endif  // HOSTKV_TESTS_TESTING_STATUS_MATCHERS_H_
