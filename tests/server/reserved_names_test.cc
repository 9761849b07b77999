#include "server/pool/reserved_names.h"

#include "gtest/gtest.h"
#include "server/pool/pool_access.h"

namespace hostkv {
namespace {

Principal Uid(uint32_t uid) {
  PeerCredentials peer;
  peer.uid = uid;
  peer.gid = uid;
  return Principal{peer};
}

TEST(ReservedNamesTest, OnlyUidDecimalDotPrefixesAreReserved) {
  EXPECT_EQ(ReservedUid("uid1000.vllm-abc-r0"), 1000u);
  EXPECT_EQ(ReservedUid("uid0.x"), 0u);
  EXPECT_EQ(ReservedUid("uid4294967295.x"), 4294967295u);
  EXPECT_EQ(ReservedUid("uid4294967296.x"), std::nullopt);  // over uint32
  EXPECT_EQ(ReservedUid("uid01.x"), std::nullopt);          // leading zero
  EXPECT_EQ(ReservedUid("uid.x"), std::nullopt);
  EXPECT_EQ(ReservedUid("uid12"), std::nullopt);             // no dot
  EXPECT_EQ(ReservedUid("uid1a.x"), std::nullopt);
  EXPECT_EQ(ReservedUid("vllm-uid1000.x"), std::nullopt);
  EXPECT_EQ(ReservedUid("UID1000.x"), std::nullopt);
  EXPECT_EQ(ReservedUid(""), std::nullopt);
}

TEST(ReservedNamesTest, OnlyThatUidMayUseAReservedName) {
  EXPECT_TRUE(CheckReservedName("pool", "uid1000.p", Uid(1000)).ok());
  EXPECT_TRUE(CheckReservedName("pool", "plain", Uid(7)).ok());
  EXPECT_TRUE(CheckReservedName("pool", "plain", Principal{}).ok());
  const absl::Status other = CheckReservedName("pool", "uid1000.p", Uid(1001));
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(other.message().find("reserved to uid 1000"), std::string::npos);
  EXPECT_NE(other.message().find("uid 1001"), std::string::npos);
  // Root is no exception: the name is a promise about who made it.
  EXPECT_EQ(CheckReservedName("pool", "uid1000.p", Uid(0)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckReservedName("pool", "uid1000.p", Principal{}).code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace hostkv
