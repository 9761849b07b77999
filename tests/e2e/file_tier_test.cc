// The file tier end to end: daemons ("nodes") sharing one directory, pages
// published on one found on another (bytes compared), a truncated value
// file refused; and daemons given a --tier they cannot open (or must not:
// a root others can write).
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/e2e/tier_nodes.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

using ::hostkv::testing::ChainKeys;
using ::hostkv::testing::DaemonProcess;
using ::hostkv::testing::TierNode;

class FileTierE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/hostkv-file-tier-XXXXXX";
    ASSERT_NE(nullptr, mkdtemp(dir));
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  // The value file of `key` ("k-" and the hex of the key, in the directory
  // of the geometry and namespace); "" if there is none.
  std::string ValueFile(const std::string& key) {
    const std::string suffix = absl::BytesToHexString(key);
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && absl::StartsWith(name, "k-") &&
          name.size() == 2 + suffix.size() && absl::EndsWith(name, suffix)) {
        return entry.path().string();
      }
    }
    return "";
  }

  std::string dir_;
};

TEST_F(FileTierE2eTest, NodesShareADirectory) {
  TierNode a("file:" + dir_);
  ASSERT_TRUE(a.ready()) << a.error();
  TierNode b("file:" + dir_);
  ASSERT_TRUE(b.ready()) << b.error();
  EXPECT_EQ("file:" + dir_, a.Tier().url());
  const std::vector<std::string> keys = ChainKeys("file", 8);
  ASSERT_OK(a.PublishChain(keys));
  ASSERT_TRUE(a.WaitWritten(8)) << a.Tier().DebugString();
  EXPECT_EQ(8u, b.LookupAndCheck(keys).value());
  EXPECT_EQ(8u, b.Tier().read_hits());
  EXPECT_EQ(8u, b.LookupAndCheck(keys).value());  // from memory now
  EXPECT_EQ(8u, b.Tier().read_hits());

  // One value file cut short: a fresh node stops before it; B, which has
  // the page in memory, does not notice.
  const std::string file = ValueFile(keys[5]);
  ASSERT_FALSE(file.empty());
  const uintmax_t size = std::filesystem::file_size(file);
  ASSERT_EQ(32 + a.page_bytes(), size);
  std::filesystem::resize_file(file, size / 2);
  TierNode c("file:" + dir_);
  ASSERT_TRUE(c.ready()) << c.error();
  EXPECT_EQ(5u, c.LookupAndCheck(keys).value());
  const v1::TierStats stats = c.Tier();
  EXPECT_EQ(5u, stats.read_hits());
  EXPECT_EQ(1u, stats.read_corrupt());
  EXPECT_TRUE(c.WaitLog("size does not match")) << c.log();
  EXPECT_EQ(8u, b.LookupAndCheck(keys).value());
}

TEST(BadTierTest, DaemonExitsWithTheReason) {
  std::string log;
  EXPECT_NE(0,
            DaemonProcess::RunToExit(
                {"--listen=unix:/tmp/hostkv-badtier.sock", "--tier=bogus://x"},
                &log));
  EXPECT_NE(std::string::npos, log.find("bogus://x")) << log;
  log.clear();
  EXPECT_NE(0,
            DaemonProcess::RunToExit({"--listen=unix:/tmp/hostkv-badtier.sock",
                                      "--tier=file:/nonexistent/tier"},
                                     &log));
  EXPECT_NE(std::string::npos, log.find("/nonexistent/tier")) << log;
}

// A tier root others can write is refused (they could swap a tenant's
// directory for a symlink); the daemon says which mode and what to run.
TEST_F(FileTierE2eTest, DaemonRefusesARootOthersCanWrite) {
  const std::string root = dir_ + "/open-to-all";
  ASSERT_EQ(0, mkdir(root.c_str(), 0700));
  ASSERT_EQ(0, chmod(root.c_str(), 0777));
  std::string log;
  EXPECT_NE(
      0, DaemonProcess::RunToExit(
             {"--listen=unix:/tmp/hostkv-badtier.sock", "--tier=file:" + root},
             &log));
  EXPECT_TRUE(absl::StrContains(log, root + " has mode 0777")) << log;
  EXPECT_TRUE(absl::StrContains(log, "chmod 0700 " + root)) << log;
}

}  // namespace
}  // namespace hostkv
