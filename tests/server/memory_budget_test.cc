#include "server/pool/memory_budget.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

TEST(MemoryBudgetTest, KeepsTheReserveFree) {
  MemoryBudget budget(0, 10 * kGiB, [] { return 20 * kGiB; });
  EXPECT_OK(budget.Reserve("pool 'a'", 10 * kGiB));
  absl::Status s = budget.Reserve("pool 'b'", 10 * kGiB + 1);
  EXPECT_ERROR(ResourceExhausted, s);
  EXPECT_NE(std::string::npos, s.message().find("pool 'b' needs"));
  EXPECT_NE(std::string::npos, s.message().find("shrink"));
}

TEST(MemoryBudgetTest, CapsTheSumOfPools) {
  MemoryBudget budget(8 * kGiB, 0, [] { return 100 * kGiB; });
  EXPECT_OK(budget.Reserve("a", 5 * kGiB));
  EXPECT_ERROR(ResourceExhausted, budget.Reserve("b", 4 * kGiB));
  EXPECT_EQ(5 * kGiB, budget.reserved_bytes());
  budget.Release(5 * kGiB);
  EXPECT_OK(budget.Reserve("b", 8 * kGiB));
}

TEST(MemoryBudgetTest, ReservationGivesBytesBackWhenItDies) {
  MemoryBudget budget(8 * kGiB, 0, [] { return 100 * kGiB; });
  {
    ASSERT_OK(budget.Reserve("a", 3 * kGiB));
    BudgetReservation r(&budget, 3 * kGiB);
    BudgetReservation moved = std::move(r);
    EXPECT_EQ(3 * kGiB, budget.reserved_bytes());
  }
  EXPECT_EQ(0u, budget.reserved_bytes());
}

TEST(MemoryBudgetTest, SystemAvailableIsReadable) {
  EXPECT_GT(MemoryBudget::SystemAvailableBytes(), 0u);
}

TEST(MemoryBudgetTest, CgroupLimitCapsWhatIsAvailable) {
  EXPECT_EQ(6 * kGiB, MemoryBudget::CgroupHeadroom("8589934592\n", "2147483648\n"));
  EXPECT_EQ(0u, MemoryBudget::CgroupHeadroom("1000", "2000"));
  EXPECT_EQ(UINT64_MAX, MemoryBudget::CgroupHeadroom("max\n", "2147483648"));
  EXPECT_EQ(UINT64_MAX, MemoryBudget::CgroupHeadroom("", ""));
}

TEST(FormatBytesTest, Units) {
  EXPECT_EQ("512 B", FormatBytes(512));
  EXPECT_EQ("1.50 MiB", FormatBytes(3ull << 19));
  EXPECT_EQ("10.00 GiB", FormatBytes(10 * kGiB));
}

}  // namespace
}  // namespace hostkv
