#include "server/transfer/signal_sequence.h"

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

TEST(SignalSequenceTest, NextContinuesAboveTheStartAndClaims) {
  SignalSequence values(41);  // what the words held at registration
  auto next = values.Next();
  ASSERT_OK(next);
  EXPECT_EQ(42u, *next);
  EXPECT_OK(values.Claim(100));
  EXPECT_EQ(100u, values.last());
  next = values.Next();
  ASSERT_OK(next);
  EXPECT_EQ(101u, *next);
}

TEST(SignalSequenceTest, ClaimsNotAboveTheLastChangeNothing) {
  SignalSequence values;
  values.Start(7);
  EXPECT_ERROR(InvalidArgument, values.Claim(7));
  EXPECT_ERROR(InvalidArgument, values.Claim(0));
  absl::Status too_big = values.Claim(uint64_t{1} << 63);
  EXPECT_ERROR(InvalidArgument, too_big);
  EXPECT_NE(std::string::npos, too_big.message().find("2^63 - 1")) << too_big;
  EXPECT_EQ(7u, values.last());
}

TEST(SignalSequenceTest, TheLargestValueIsTheLast) {
  SignalSequence values;
  EXPECT_OK(values.Claim(kMaxSignalValue));
  EXPECT_ERROR(FailedPrecondition, values.Next());
  EXPECT_ERROR(InvalidArgument, values.Claim(kMaxSignalValue));
  EXPECT_EQ(kMaxSignalValue, values.last());
}

// Concurrent Next calls give each value once, none skipped.
TEST(SignalSequenceTest, NextGivesDistinctValuesAcrossThreads) {
  SignalSequence values;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 1000;
  std::vector<std::vector<uint64_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&values, &got, t] {
      for (int i = 0; i < kPerThread; ++i) {
        got[t].push_back(values.Next().value());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<bool> seen(kThreads * kPerThread + 1, false);
  for (const std::vector<uint64_t>& some : got) {
    for (uint64_t v : some) {
      ASSERT_GE(v, 1u);
      ASSERT_LE(v, uint64_t{kThreads * kPerThread});
      EXPECT_FALSE(seen[v]) << v;
      seen[v] = true;
    }
  }
  EXPECT_EQ(uint64_t{kThreads * kPerThread}, values.last());
}

}  // namespace
}  // namespace hostkv
