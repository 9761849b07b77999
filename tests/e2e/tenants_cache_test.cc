// The multi-user suite (tenants_fixture.h): the page cache's namespaces and
// the storage tier under it, as another user (or root) tries them.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/e2e/tenants_fixture.h"

namespace hostkv {
namespace {

// Root is no exception to namespace ownership: a namespace a user claimed
// first would otherwise serve that user's bytes to a root engine.
TEST_F(TenantsTest, RootDoesNotLookUpInANamespaceAUserClaimed) {
  std::string out;
  ASSERT_EQ(0, Run(kAlice, {"publish", "shared", "squatted", "2", "161"}, &out))
      << out;
  auto root = Root();
  ASSERT_NE(nullptr, root);
  auto found = root->Lookup("shared", "squatted", {"k0", "k1"});
  EXPECT_EQ(found.status().code(), absl::StatusCode::kPermissionDenied)
      << found.status();
  EXPECT_NE(std::string(found.status().message()).find("uid 61001"), std::string::npos) << std::string(found.status().message());
  // Alice herself finds both pages, with her bytes.
  ASSERT_EQ(0, Run(kAlice, {"lookup", "shared", "squatted", "2"}, &out)) << out;
  EXPECT_NE(out.find("hits 2 bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("value 161"), std::string::npos) << out;
}

// Namespaces belong to their first publisher in every pool of the daemon,
// not per pool: another user's own pool of the same geometry is refused.
TEST_F(TenantsTest, ANamespaceIsItsOwnersInEveryPool) {
  std::string out;
  ASSERT_EQ(0, Run(kAlice, {"publish", "shared", "model", "2", "161"}, &out))
      << out;
  ASSERT_EQ(0, Run(kBob, {"create-pool", "bobs"}, &out)) << out;
  EXPECT_EQ(kPermissionDenied, Run(kBob, {"lookup", "bobs", "model", "2"}, &out))
      << out;
  EXPECT_EQ(kPermissionDenied,
            Run(kBob, {"publish", "bobs", "model", "2", "178"}, &out))
      << out;
  ASSERT_EQ(0, Run(kAlice, {"create-pool", "alices"}, &out)) << out;
  ASSERT_EQ(0, Run(kAlice, {"publish", "alices", "model", "2", "161"}, &out))
      << out;
}

// Daemons sharing one file tier (the "nodes" of a cluster).
class TenantsTierTest : public TenantsTest {
 protected:
  std::vector<std::string> ExtraFlags() override {
    char pattern[] = "/tmp/hostkv-tenants-tier-XXXXXX";
    tier_dir_ = mkdtemp(pattern);
    return TierFlags();
  }
  void TearDown() override {
    nodes_.clear();
    TenantsTest::TearDown();
    std::filesystem::remove_all(tier_dir_);
  }
  std::vector<std::string> TierFlags() const {
    return {"--tier=file:" + tier_dir_, "--tier_fsync=false"};
  }
  // Another daemon on the same tier; returns its target.
  std::string StartNode() {
    std::vector<std::string> flags = TierFlags();
    flags.push_back("--socket_mode=0666");
    nodes_.push_back(std::make_unique<testing::DaemonProcess>(flags));
    const testing::DaemonProcess& node = *nodes_.back();
    EXPECT_TRUE(node.started()) << node.log();
    const std::string dir =
        node.socket_path().substr(0, node.socket_path().rfind('/'));
    chmod(dir.c_str(), 0755);
    return node.target();
  }
  // Values in the tier (files k-*), waiting up to 10 s for `at_least`.
  size_t StoredValues(size_t at_least) const {
    size_t n = 0;
    for (int i = 0; i < 200; ++i) {
      n = 0;
      for (const auto& e :
           std::filesystem::recursive_directory_iterator(tier_dir_)) {
        n += e.path().filename().string().rfind("k-", 0) == 0;
      }
      if (n >= at_least) break;
      usleep(50 * 1000);
    }
    return n;
  }

  std::string tier_dir_;
  std::vector<std::unique_ptr<testing::DaemonProcess>> nodes_;
};

// Another user never reads, nor replaces, a user's values through the
// tier: the owner of a namespace is part of its tier key, so Bob's lookup
// on another node finds nothing of Alice's, and what he then publishes
// under the same namespace and keys is stored apart from her values.
TEST_F(TenantsTierTest, StoredValuesStayWithTheirOwnerAcrossNodes) {
  std::string out;
  ASSERT_EQ(0, Run(kAlice, {"publish", "shared", "model", "4", "161"}, &out))
      << out;
  ASSERT_EQ(4u, StoredValues(4));
  // Node B: nobody owns "model" there.
  const std::string node_b = StartNode();
  ASSERT_EQ(0, Run(kBob, {"create-pool", "bobs"}, &out, node_b)) << out;
  ASSERT_EQ(0, Run(kBob, {"lookup", "bobs", "model", "4"}, &out, node_b))
      << out;
  EXPECT_NE(out.find("hits 0 bytes 0"), std::string::npos) << out;
  ASSERT_EQ(0, Run(kBob, {"publish", "bobs", "model", "4", "178"}, &out, node_b))
      << out;
  EXPECT_EQ(8u, StoredValues(8));  // his, beside hers
  // Node C: Alice finds her own bytes; Bob, on node D, his.
  const std::string node_c = StartNode();
  ASSERT_EQ(0, Run(kAlice, {"create-pool", "alices"}, &out, node_c)) << out;
  ASSERT_EQ(0, Run(kAlice, {"lookup", "alices", "model", "4"}, &out, node_c))
      << out;
  EXPECT_NE(out.find("hits 4 bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("value 161"), std::string::npos) << out;
  // Her fetch claimed "model" on node C for her, as a publish would.
  ASSERT_EQ(0, Run(kBob, {"create-pool", "bobs"}, &out, node_c)) << out;
  EXPECT_EQ(kPermissionDenied,
            Run(kBob, {"lookup", "bobs", "model", "4"}, &out, node_c))
      << out;
  const std::string node_d = StartNode();
  ASSERT_EQ(0, Run(kBob, {"create-pool", "bobs"}, &out, node_d)) << out;
  ASSERT_EQ(0, Run(kBob, {"lookup", "bobs", "model", "4"}, &out, node_d))
      << out;
  EXPECT_NE(out.find("hits 4 bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("value 178"), std::string::npos) << out;
}

}  // namespace
}  // namespace hostkv
