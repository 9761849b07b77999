// The command rings' quota (server/service/ring_quota.h): rings per uid and
// in all, their segments charged to the memory budget and given back with
// the grant, and the per-uid CPU account.
#include "server/service/ring_quota.h"

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kRing = 2 * kMiB;

MemoryBudget Budget(uint64_t bytes) {
  return MemoryBudget(bytes, 0, [] { return uint64_t{1} << 40; });
}

TEST(RingQuotaTest, OneUidCannotTakeEveryRing) {
  MemoryBudget budget = Budget(0);
  RingQuota quota(RingLimits{.max_rings = 8, .max_rings_per_uid = 3}, &budget);
  std::vector<RingGrant> attacker;
  for (int i = 0; i < 3; ++i) {
    auto grant = quota.Grant(1001, kRing);
    ASSERT_OK(grant);
    attacker.push_back(std::move(*grant));
  }
  absl::StatusOr<RingGrant> fourth = quota.Grant(1001, kRing);
  EXPECT_ERROR(ResourceExhausted, fourth.status());
  EXPECT_NE(std::string::npos,
            fourth.status().message().find("--max_command_rings_per_uid"));
  EXPECT_EQ(3u, quota.rings_of(1001));
  // Another user still gets its rings.
  auto other = quota.Grant(1002, kRing);
  ASSERT_OK(other);
  EXPECT_EQ(1u, quota.rings_of(1002));
  EXPECT_EQ(4u, quota.rings());
}

TEST(RingQuotaTest, TheDaemonWideBoundHolds) {
  RingQuota quota(RingLimits{.max_rings = 2, .max_rings_per_uid = 2}, nullptr);
  auto a = quota.Grant(1, kRing);
  auto b = quota.Grant(2, kRing);
  ASSERT_OK(a);
  ASSERT_OK(b);
  absl::StatusOr<RingGrant> c = quota.Grant(3, kRing);
  EXPECT_ERROR(ResourceExhausted, c.status());
  EXPECT_NE(std::string::npos,
            c.status().message().find("--max_command_rings"));
  EXPECT_EQ(0u, quota.rings_of(3));
}

TEST(RingQuotaTest, SegmentsAreChargedToTheBudgetAndGivenBack) {
  MemoryBudget budget = Budget(5 * kMiB);
  RingQuota quota(RingLimits{.max_rings = 8, .max_rings_per_uid = 8}, &budget);
  {
    auto a = quota.Grant(1, kRing);
    auto b = quota.Grant(2, kRing);
    ASSERT_OK(a);
    ASSERT_OK(b);
    EXPECT_EQ(2 * kRing, budget.reserved_bytes());
    // A third does not fit in 5 MiB: refused, nothing counted.
    absl::StatusOr<RingGrant> c = quota.Grant(3, kRing);
    EXPECT_ERROR(ResourceExhausted, c.status());
    EXPECT_EQ(2u, quota.rings());
    EXPECT_EQ(0u, quota.rings_of(3));
    RingGrant moved = std::move(*a);
    EXPECT_EQ(2 * kRing, budget.reserved_bytes());
  }
  EXPECT_EQ(0u, budget.reserved_bytes());
  EXPECT_EQ(0u, quota.rings());
  EXPECT_EQ(0u, quota.rings_of(1));
}

TEST(RingQuotaTest, GrantsOutliveTheQuota) {
  MemoryBudget budget = Budget(0);
  absl::StatusOr<RingGrant> grant;
  {
    RingQuota quota(RingLimits{}, &budget);
    grant = quota.Grant(7, kRing);
    ASSERT_OK(grant);
  }
  *grant = RingGrant();
  EXPECT_EQ(0u, budget.reserved_bytes());
}

TEST(RingQuotaTest, RingsOfOneUidShareOneCpuAccount) {
  RingQuota quota(RingLimits{.cpu_per_uid = 0.5}, nullptr);
  auto a = quota.Grant(1, kRing);
  auto b = quota.Grant(1, kRing);
  auto c = quota.Grant(2, kRing);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_OK(c);
  EXPECT_EQ(a->cpu(), b->cpu());
  EXPECT_NE(a->cpu(), c->cpu());
  a->cpu()->Charge(absl::Milliseconds(200));
  // 150 ms over the 50 ms burst at 0.5 cores: about 300 ms to refill; the
  // other uid owes nothing.
  const absl::Duration wait = b->cpu()->Overdrawn();
  EXPECT_GT(wait, absl::Milliseconds(250));
  EXPECT_LE(wait, absl::Milliseconds(300));
  EXPECT_EQ(absl::ZeroDuration(), c->cpu()->Overdrawn());
}

TEST(RingCpuAccountTest, RefillsAtItsRateUpToTheBurst) {
  RingCpuAccount account(1.0, absl::Milliseconds(20));
  EXPECT_EQ(absl::ZeroDuration(), account.Overdrawn());
  absl::SleepFor(absl::Milliseconds(60));  // fills to the 20 ms burst only
  account.Charge(absl::Milliseconds(30));
  const absl::Duration wait = account.Overdrawn();
  EXPECT_GT(wait, absl::ZeroDuration());
  EXPECT_LE(wait, absl::Milliseconds(10));
  EXPECT_EQ(absl::Milliseconds(30), account.charged());
}

TEST(RingCpuAccountTest, OneCoreRunsOneCallAtOnce) {
  RingCpuAccount account(1.0, absl::Milliseconds(20));
  absl::Notification stop;
  ASSERT_TRUE(account.BeginCall([&] { return stop.HasBeenNotified(); }));
  std::atomic<bool> second{false};
  std::thread other([&] {
    if (account.BeginCall([&] { return stop.HasBeenNotified(); })) {
      second = true;
      account.EndCall();
    }
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(second.load());  // waits for the first call's turn
  account.EndCall();
  other.join();
  EXPECT_TRUE(second.load());
}

TEST(RingCpuAccountTest, AWaitingCallEndsWhenTheRingStops) {
  RingCpuAccount account(0.5, absl::Milliseconds(20));
  absl::Notification stop;
  ASSERT_TRUE(account.BeginCall([&] { return stop.HasBeenNotified(); }));
  std::thread other([&] { EXPECT_FALSE(account.BeginCall([&] { return stop.HasBeenNotified(); })); });
  stop.Notify();
  other.join();
  account.EndCall();
}

TEST(RingCpuAccountTest, ZeroCoresIsNoBound) {
  RingCpuAccount account(0, absl::Milliseconds(20));
  account.Charge(absl::Seconds(10));
  EXPECT_EQ(absl::ZeroDuration(), account.Overdrawn());
  absl::Notification stop;
  EXPECT_TRUE(account.BeginCall([&] { return stop.HasBeenNotified(); }));
  EXPECT_TRUE(account.BeginCall([&] { return stop.HasBeenNotified(); }));  // calls at once: no bound either
  EXPECT_EQ(absl::Seconds(10), account.charged());
}

}  // namespace
}  // namespace hostkv
