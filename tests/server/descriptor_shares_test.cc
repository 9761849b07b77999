// The descriptor limit shared out among what clients can make the daemon
// hold (server/operations/descriptor_shares.h): the shares leave the daemon
// at least 3/16, and the last eighth of each goes to uids holding few.
#include "server/operations/descriptor_shares.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace hostkv {
namespace {

TEST(DescriptorSharesTest, TheSharesLeaveTheDaemonThreeSixteenths) {
  for (uint64_t limit : {4096ull, 20000ull, 65536ull, 1048576ull}) {
    const DescriptorShares s = ShareDescriptorLimit(limit);
    const uint64_t shared = uint64_t{s.session_connections} + s.grpc_connections +
                            s.passed_fds + s.refused_fds + s.command_rings;
    EXPECT_LE(shared + limit * 3 / 16, limit) << s.ToString();
    EXPECT_EQ(s.reserve(), limit - shared);
    EXPECT_GE(s.refused_fds, 2u * 254) << s.ToString();
  }
  const DescriptorShares s = ShareDescriptorLimit(20000);
  EXPECT_EQ(s.session_connections, 5000u);
  EXPECT_EQ(s.grpc_connections, 5000u);
  EXPECT_EQ(s.passed_fds, 2500u);
  EXPECT_EQ(s.refused_fds, 2500u);
  EXPECT_EQ(s.command_rings, 1250u);
  EXPECT_EQ(s.reserve(), 3750u);
}

TEST(DescriptorSharesTest, ALowLimitKeepsTheFloors) {
  const DescriptorShares s = ShareDescriptorLimit(100);
  EXPECT_EQ(s.refused_fds, 2u * 254);  // two records, over the limit's share
  EXPECT_EQ(s.passed_fds, 16u);
  EXPECT_EQ(s.reserve(), 0u);  // main.cc warns below 4096
}

TEST(DescriptorSharesTest, TheLastEighthGoesToUidsHoldingFew) {
  // 640 at most: anyone below 560, then only uids holding under 10.
  EXPECT_TRUE(MayTakeShared(500, 559, 640));
  EXPECT_FALSE(MayTakeShared(10, 560, 640));
  EXPECT_TRUE(MayTakeShared(9, 560, 640));
  EXPECT_TRUE(MayTakeShared(0, 639, 640));
  EXPECT_FALSE(MayTakeShared(0, 640, 640));  // full is full
  // A total too small for a 64th: uids holding none still get one.
  EXPECT_TRUE(MayTakeShared(0, 7, 8));
  EXPECT_FALSE(MayTakeShared(1, 7, 8));
}

}  // namespace
}  // namespace hostkv
