#include "server/operations/logging.h"

#include "gtest/gtest.h"

namespace hostkv {
namespace {

TEST(WarningThrottleTest, OnePerPeriodAndCountsTheOthers) {
  WarningThrottle throttle(absl::Hours(1));
  uint64_t held_back = 99;
  EXPECT_TRUE(throttle.Allow(&held_back));
  EXPECT_EQ(0u, held_back);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(throttle.Allow(&held_back));
}

TEST(WarningThrottleTest, AllowsAgainAfterThePeriodWithTheCount) {
  WarningThrottle throttle(absl::ZeroDuration());
  uint64_t held_back = 99;
  EXPECT_TRUE(throttle.Allow(&held_back));
  EXPECT_TRUE(throttle.Allow(&held_back));
  EXPECT_EQ(0u, held_back);

  WarningThrottle slow(absl::Milliseconds(50));
  EXPECT_TRUE(slow.Allow(&held_back));
  EXPECT_FALSE(slow.Allow(&held_back));
  EXPECT_FALSE(slow.Allow(&held_back));
  absl::SleepFor(absl::Milliseconds(60));
  EXPECT_TRUE(slow.Allow(&held_back));
  EXPECT_EQ(2u, held_back);
}

TEST(JsonEscapeTest, EscapesQuotesAndControls) {
  EXPECT_EQ("a\\\"b\\\\c\\n", JsonEscape("a\"b\\c\n"));
}

}  // namespace
}  // namespace hostkv
