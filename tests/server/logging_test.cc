#include "server/operations/logging.h"

#include <memory>
#include <sstream>

#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

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

TEST(LogEscapeTest, EscapesControlsAndKeepsTheRest) {
  EXPECT_EQ("a\\nb\\r\\t\\x1b[2J\\x7f\\x00 ok \xc3\xa9",
            LogEscape(std::string("a\nb\r\t\x1b[2J\x7f\0 ok \xc3\xa9", 17)));
}

// A client_name with a newline (issue: log injection) is one line in the
// text log.
TEST(LogFormatTest, TextLinesCannotBeForged) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "forge-test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  spdlog::register_logger(logger);
  ASSERT_TRUE(SetUpLogging("info", "text").ok());
  logger->info("session 1 opened: client='{}'",
               "x'\n[2026-12-02 00:00:00.000] [info] session 2 opened");
  spdlog::drop("forge-test");
  const std::string line = out.str();
  EXPECT_EQ(1, std::count(line.begin(), line.end(), '\n')) << line;
  EXPECT_NE(std::string::npos, line.find("client='x'\\n[2026")) << line;
  EXPECT_NE(std::string::npos, line.find("] [info] session 1 opened")) << line;
}

}  // namespace
}  // namespace hostkv
