#include "server/cache/namespace_owners.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/pool/pool_access.h"

namespace hostkv {
namespace {

Principal Uid(uint32_t uid) {
  PeerCredentials peer{};
  peer.uid = uid;
  peer.gid = uid;
  return Principal{peer};
}

NamespaceOwners::InUse Nothing() {
  return [](const std::string&, const NamespaceOwner&) { return false; };
}

TEST(NamespaceOwnersTest, AnUnusedClaimIsGivenBackAtTheSecondSweep) {
  NamespaceOwners owners(CacheSharing{}, 1);
  std::vector<std::string> erased;
  owners.set_releaser([&](const std::string& name, const NamespaceOwner& owner) {
    EXPECT_EQ(owner.uid, 1001u);
    erased.push_back(name);
  });
  ASSERT_TRUE(owners.ClaimOrCheck("p", "ns", Uid(1001)).ok());
  EXPECT_EQ(owners.ClaimOrCheck("p", "other", Uid(1001)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(owners.ReleaseUnused(Nothing()).empty());  // first seen unused
  EXPECT_EQ(owners.ReleaseUnused(Nothing()), std::vector<std::string>{"ns"});
  EXPECT_EQ(erased, std::vector<std::string>{"ns"});
  EXPECT_EQ(owners.size(), 0u);
  // The owner's share is back, and the name is anyone's to claim.
  EXPECT_TRUE(owners.ClaimOrCheck("p", "other", Uid(1001)).ok());
  EXPECT_TRUE(owners.ClaimOrCheck("p", "ns", Uid(1002)).ok());
  EXPECT_EQ(owners.CheckUse("p", "ns", Uid(1001)).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(NamespaceOwnersTest, AUseBetweenSweepsKeepsTheClaim) {
  NamespaceOwners owners(CacheSharing{}, 4);
  ASSERT_TRUE(owners.ClaimOrCheck("p", "ns", Uid(1001)).ok());
  EXPECT_TRUE(owners.ReleaseUnused(Nothing()).empty());
  ASSERT_TRUE(owners.CheckUse("p", "ns", Uid(1001)).ok());  // a lookup
  EXPECT_TRUE(owners.ReleaseUnused(Nothing()).empty());
  ASSERT_TRUE(owners.ClaimOrCheck("p", "ns", Uid(1001)).ok());  // a publish
  EXPECT_TRUE(owners.ReleaseUnused(Nothing()).empty());
  EXPECT_EQ(owners.ReleaseUnused(Nothing()), std::vector<std::string>{"ns"});
}

TEST(NamespaceOwnersTest, RefusedAttemptsOfOthersDoNotKeepAClaim) {
  NamespaceOwners owners(CacheSharing{}, 4);
  ASSERT_TRUE(owners.ClaimOrCheck("p", "ns", Uid(1001)).ok());
  EXPECT_TRUE(owners.ReleaseUnused(Nothing()).empty());
  EXPECT_EQ(owners.ClaimOrCheck("p", "ns", Uid(1002)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(owners.CheckUse("p", "ns", Uid(1002)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(owners.ReleaseUnused(Nothing()), std::vector<std::string>{"ns"});
}

TEST(NamespaceOwnersTest, AClaimInUseIsKept) {
  NamespaceOwners owners(CacheSharing{}, 4);
  ASSERT_TRUE(owners.ClaimOrCheck("p", "cached", Uid(1001)).ok());
  ASSERT_TRUE(owners.ClaimOrCheck("p", "idle", Uid(1001)).ok());
  std::vector<std::string> asked;
  auto in_use = [&](const std::string& name, const NamespaceOwner&) {
    asked.push_back(name);
    return name == "cached";
  };
  EXPECT_TRUE(owners.ReleaseUnused(in_use).empty());
  EXPECT_EQ(owners.ReleaseUnused(in_use), std::vector<std::string>{"idle"});
  EXPECT_EQ(asked.size(), 4u);
  // A claim found in use between two unused sweeps starts over.
  ASSERT_TRUE(owners.ClaimOrCheck("p", "flip", Uid(1001)).ok());
  bool used = false;
  auto flipping = [&](const std::string& name, const NamespaceOwner&) {
    return name == "cached" || (name == "flip" && used);
  };
  EXPECT_TRUE(owners.ReleaseUnused(flipping).empty());
  used = true;
  EXPECT_TRUE(owners.ReleaseUnused(flipping).empty());
  used = false;
  EXPECT_TRUE(owners.ReleaseUnused(flipping).empty());
  EXPECT_EQ(owners.ReleaseUnused(flipping), std::vector<std::string>{"flip"});
  EXPECT_TRUE(owners.OwnerOf("cached").has_value());
}

}  // namespace
}  // namespace hostkv
