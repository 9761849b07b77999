#include "server/auth_token.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>

#include "gtest/gtest.h"

namespace hostkv {
namespace {

TEST(ConstantTimeEqualsTest, EqualOnlyWhenBytesAndLengthMatch) {
  EXPECT_TRUE(ConstantTimeEquals("s3cret", "s3cret"));
  EXPECT_FALSE(ConstantTimeEquals("x3cret", "s3cret"));        // first byte
  EXPECT_FALSE(ConstantTimeEquals("s3creT", "s3cret"));        // last byte
  EXPECT_FALSE(ConstantTimeEquals("s3cre", "s3cret"));         // a prefix
  EXPECT_FALSE(ConstantTimeEquals("s3crets3cret", "s3cret"));  // repeated
  EXPECT_FALSE(ConstantTimeEquals("s3cretX", "s3cret"));
  EXPECT_FALSE(ConstantTimeEquals("", "s3cret"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("a", ""));
  // Bytes that differ only in one bit, and NUL bytes, count.
  EXPECT_FALSE(
      ConstantTimeEquals(std::string("ab\0d", 4), std::string("ab\0e", 4)));
  EXPECT_TRUE(
      ConstantTimeEquals(std::string("ab\0d", 4), std::string("ab\0d", 4)));
}

TEST(TokenAuthorizerTest, MatchesBearerTokenOnly) {
  TokenAuthorizer authorizer("s3cret");
  EXPECT_TRUE(authorizer.required());
  EXPECT_TRUE(authorizer.Matches("Bearer s3cret"));
  EXPECT_FALSE(authorizer.Matches("s3cret"));
  EXPECT_FALSE(authorizer.Matches("Bearer s3creT"));
  EXPECT_FALSE(authorizer.Matches("Bearer s3cret "));
  EXPECT_FALSE(authorizer.Matches("bearer s3cret"));
  EXPECT_FALSE(authorizer.Matches(""));
}

TEST(TokenAuthorizerTest, NoTokenAllowsEverything) {
  TokenAuthorizer authorizer("");
  EXPECT_FALSE(authorizer.required());
  EXPECT_TRUE(authorizer.Matches(""));
  EXPECT_TRUE(authorizer.Matches("Bearer anything"));
  grpc::ServerContext context;
  EXPECT_TRUE(authorizer.Allows(context));
  EXPECT_TRUE(authorizer.Check(context).ok());
}

TEST(TokenAuthorizerTest, CallWithoutMetadataIsUnauthenticated) {
  TokenAuthorizer authorizer("s3cret");
  grpc::ServerContext context;  // no client metadata
  EXPECT_FALSE(authorizer.Allows(context));
  EXPECT_EQ(grpc::StatusCode::UNAUTHENTICATED,
            authorizer.Check(context).error_code());
}

// The fastest of `runs` timings of `compare`, in nanoseconds.
double FastestNanos(const std::function<bool()>& compare, int runs) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const bool equal = compare();
    const auto end = std::chrono::steady_clock::now();
    EXPECT_FALSE(equal);
    best = std::min(
        best, std::chrono::duration<double, std::nano>(end - start).count());
  }
  return best;
}

// An early exit (memcmp, operator==) would make a mismatch in the first byte
// ~1000x faster than one in the last byte of a 64 KiB string, and a length
// mismatch nearly free. The bound is loose (3x) so that a busy machine does
// not fail it; the fastest of many runs filters out preemption.
TEST(ConstantTimeEqualsTest, TimeDoesNotDependOnWhereOrHowLongTheMismatch) {
  constexpr size_t kSize = 64 << 10;
  constexpr int kRuns = 30;
  const std::string expected(kSize, 'a');
  std::string first = expected, last = expected;
  first.front() = 'b';
  last.back() = 'b';
  const std::string short_expected(16, 'a');
  const double at_first =
      FastestNanos([&] { return ConstantTimeEquals(first, expected); }, kRuns);
  const double at_last =
      FastestNanos([&] { return ConstantTimeEquals(last, expected); }, kRuns);
  const double other_length = FastestNanos(
      [&] { return ConstantTimeEquals(last, short_expected); }, kRuns);
  EXPECT_LT(at_last / at_first, 3.0)
      << at_first << " ns vs " << at_last << " ns";
  EXPECT_LT(at_first / at_last, 3.0)
      << at_first << " ns vs " << at_last << " ns";
  EXPECT_LT(at_last / other_length, 3.0)
      << at_last << " ns vs " << other_length << " ns";
  EXPECT_LT(other_length / at_last, 3.0)
      << at_last << " ns vs " << other_length << " ns";
}

}  // namespace
}  // namespace hostkv
