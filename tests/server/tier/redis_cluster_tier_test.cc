// RedisTier::OpenCluster against a real three-master Redis Cluster on
// loopback ports (created by redis-cli --cluster create).
#include <hiredis/hiredis.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/tier/redis_cluster_slots.h"
#include "server/tier/redis_tier.h"
#include "tests/server/tier/redis_server_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

using ::hostkv::testing::FreeClusterPort;
using ::hostkv::testing::RawRedisCommand;
using ::hostkv::testing::RawRedisReply;
using ::hostkv::testing::RedisServerProcess;

std::string Page(uint64_t seed, size_t size) {
  std::string page(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    page[i] = static_cast<char>((seed * 131 + i * 7 + (i >> 8)) & 0xff);
  }
  return page;
}

class RedisClusterTierTest : public ::testing::Test {
 protected:
  static constexpr int kNodes = 3;

  void SetUp() override {
    if (RedisServerProcess::FindBinary().empty() ||
        std::system("command -v redis-cli >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "redis-server or redis-cli is not installed";
    }
    std::vector<std::string> addresses;
    for (int i = 0; i < kNodes; ++i) {
      nodes_.push_back(std::make_unique<RedisServerProcess>());
      ports_.push_back(FreeClusterPort());
      ASSERT_NE(0, ports_.back());
      ASSERT_OK(nodes_.back()->StartClusterNode(ports_.back()));
      addresses.push_back(absl::StrCat("127.0.0.1:", ports_.back()));
    }
    const std::string create = absl::StrCat(
        "redis-cli --cluster create ", absl::StrJoin(addresses, " "),
        " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1");
    ASSERT_EQ(0, std::system(create.c_str()));
    for (int i = 0; i < kNodes; ++i) ASSERT_TRUE(WaitClusterOk(i)) << i;
    seeds_ = absl::StrJoin(addresses, ",");
  }

  bool WaitClusterOk(int node) {
    for (int i = 0; i < 1000; ++i) {
      RawRedisReply info = Raw(node, {"CLUSTER", "INFO"});
      if (info.str.find("cluster_state:ok") != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  RawRedisReply Raw(int node, const std::vector<std::string>& args) {
    return RawRedisCommand(nodes_[node]->socket_path(), args);
  }
  std::string MyId(int node) { return Raw(node, {"CLUSTER", "MYID"}).str; }

  std::unique_ptr<RedisTier> OpenTier() {
    auto tier = RedisTier::OpenCluster(
        {seeds_, "", absl::Seconds(1), absl::Seconds(5), 2});
    EXPECT_OK(tier);
    return tier.ok() ? *std::move(tier) : nullptr;
  }

  std::vector<std::unique_ptr<RedisServerProcess>> nodes_;
  std::vector<int> ports_;
  std::string seeds_;
};

std::vector<TierKey> Keys(int n) {
  std::vector<TierKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back({"cluster-ns", absl::StrCat(i)});
  return keys;
}

// The count, or ~0 (and a failure) if the call failed.
uint64_t Count(PageTier& tier, const std::vector<TierKey>& keys) {
  absl::StatusOr<uint64_t> count = tier.CountPrefix(keys);
  EXPECT_TRUE(count.ok()) << count.status();
  return count.ok() ? *count : ~uint64_t{0};
}

void PutAndCheck(PageTier& tier, const std::vector<TierKey>& keys,
                 const std::vector<std::string>& values) {
  std::vector<absl::string_view> views(values.begin(), values.end());
  for (const absl::Status& s : tier.Put(keys, views)) ASSERT_OK(s);
}

void ExpectValues(PageTier& tier, const std::vector<TierKey>& keys,
                  const std::vector<std::string>& values) {
  std::vector<absl::StatusOr<std::string>> got = tier.Get(keys);
  ASSERT_EQ(keys.size(), got.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    ASSERT_TRUE(*got[i] == values[i]) << "bytes differ at item " << i;
  }
}

TEST_F(RedisClusterTierTest, BatchesSpreadOverTheMasters) {
  auto tier = OpenTier();
  ASSERT_NE(nullptr, tier);
  const std::vector<TierKey> keys = Keys(300);
  std::vector<std::string> values;
  for (int i = 0; i < 300; ++i) values.push_back(Page(i, 16 << 10));
  PutAndCheck(*tier, keys, values);
  ExpectValues(*tier, keys, values);
  EXPECT_EQ(300u, Count(*tier, keys));
  long long total = 0;
  for (int i = 0; i < kNodes; ++i) {
    const long long keys_here = Raw(i, {"DBSIZE"}).integer;
    EXPECT_GT(keys_here, 0) << "node " << i;
    total += keys_here;
  }
  EXPECT_EQ(300, total);
  ASSERT_OK(tier->Delete({keys[7]}));
  EXPECT_EQ(7u, Count(*tier, keys));
  ASSERT_OK(tier->Delete(keys));
  EXPECT_EQ(0u, Count(*tier, keys));
}

// Moves the slot of a key from its master to another one (the keys with
// it); with finish false the slot stays "migrating" (the old master answers
// ASK), else every node learns the new owner (MOVED).
class RedisClusterMoveTest : public RedisClusterTierTest {
 protected:
  int OwnerOf(const std::string& redis_key) {
    for (int i = 0; i < kNodes; ++i) {
      RawRedisReply r = Raw(i, {"EXISTS", redis_key});
      if (r.type == REDIS_REPLY_INTEGER) return i;  // others answer MOVED
    }
    return -1;
  }
  void MoveSlot(const std::string& redis_key, int from, int to, bool finish) {
    const std::string slot = std::to_string(RedisKeySlot(redis_key));
    ASSERT_EQ(
        REDIS_REPLY_STATUS,
        Raw(to, {"CLUSTER", "SETSLOT", slot, "IMPORTING", MyId(from)}).type);
    ASSERT_EQ(
        REDIS_REPLY_STATUS,
        Raw(from, {"CLUSTER", "SETSLOT", slot, "MIGRATING", MyId(to)}).type);
    RawRedisReply migrate =
        Raw(from, {"MIGRATE", "127.0.0.1", std::to_string(ports_[to]),
                   redis_key, "0", "5000"});
    ASSERT_EQ(REDIS_REPLY_STATUS, migrate.type) << migrate.str;
    if (!finish) return;
    for (int i = 0; i < kNodes; ++i) {
      ASSERT_EQ(REDIS_REPLY_STATUS,
                Raw(i, {"CLUSTER", "SETSLOT", slot, "NODE", MyId(to)}).type)
          << i;
    }
  }
};

TEST_F(RedisClusterMoveTest, MovedSlotIsFollowed) {
  auto tier = OpenTier();
  ASSERT_NE(nullptr, tier);
  const std::vector<TierKey> keys = {{"ns", "moving"}};
  const std::vector<std::string> values = {Page(5, 1 << 20)};
  PutAndCheck(*tier, keys, values);
  const std::string redis_key = RedisTierKey(keys[0]);
  const int from = OwnerOf(redis_key);
  ASSERT_GE(from, 0);
  const int to = (from + 1) % kNodes;
  MoveSlot(redis_key, from, to, /*finish=*/true);
  ASSERT_EQ(REDIS_REPLY_ERROR, Raw(from, {"GET", redis_key}).type);  // MOVED
  ExpectValues(*tier, keys, values);  // MOVED followed, map re-read
  EXPECT_EQ(1u, Count(*tier, keys));
  ExpectValues(*tier, keys, values);
}

TEST_F(RedisClusterMoveTest, AskDuringMigrationIsFollowed) {
  auto tier = OpenTier();
  ASSERT_NE(nullptr, tier);
  const std::vector<TierKey> keys = {{"ns", "migrating"}};
  const std::vector<std::string> values = {Page(6, 64 << 10)};
  PutAndCheck(*tier, keys, values);
  const std::string redis_key = RedisTierKey(keys[0]);
  const int from = OwnerOf(redis_key);
  ASSERT_GE(from, 0);
  MoveSlot(redis_key, from, (from + 1) % kNodes, /*finish=*/false);
  RawRedisReply ask = Raw(from, {"GET", redis_key});
  ASSERT_EQ(REDIS_REPLY_ERROR, ask.type);
  ASSERT_EQ(0u, ask.str.rfind("ASK ", 0)) << ask.str;
  ExpectValues(*tier, keys, values);
  EXPECT_EQ(1u, Count(*tier, keys));
}

// A master killed: its keys are Unavailable, the others' still served
// (before the cluster's node timeout, 15 s, marks it failed); restarted with
// its nodes.conf it serves its slots again, empty (no persistence).
TEST_F(RedisClusterTierTest, KilledMasterComesBack) {
  auto tier = OpenTier();
  ASSERT_NE(nullptr, tier);
  const std::vector<TierKey> keys = Keys(60);
  std::vector<std::string> values;
  for (int i = 0; i < 60; ++i) values.push_back(Page(i, 4096));
  PutAndCheck(*tier, keys, values);

  nodes_[1]->Kill();
  std::vector<absl::StatusOr<std::string>> got = tier->Get(keys);
  int unavailable = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::IsUnavailable(got[i].status())) {
      ++unavailable;
    } else {
      ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
      EXPECT_TRUE(*got[i] == values[i]) << i;
    }
  }
  EXPECT_GT(unavailable, 0);
  EXPECT_LT(unavailable, 60);

  ASSERT_OK(nodes_[1]->StartClusterNode(ports_[1]));
  int served = 0;
  for (int attempt = 0; attempt < 500 && served < 60; ++attempt) {
    served = 0;
    for (const absl::StatusOr<std::string>& item : tier->Get(keys)) {
      if (item.ok() || absl::IsNotFound(item.status())) ++served;
    }
    if (served < 60) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(60, served);
  got = tier->Get(keys);
  int found = 0;
  for (const absl::StatusOr<std::string>& item : got) found += item.ok();
  EXPECT_EQ(60 - unavailable, found);  // the restarted master is empty
}

TEST_F(RedisClusterTierTest, BadSeeds) {
  EXPECT_ERROR(InvalidArgument,
               RedisTier::OpenCluster(
                   {"unix:/x", "", absl::Seconds(1), absl::Seconds(1), 2}));
  EXPECT_ERROR(InvalidArgument,
               RedisTier::OpenCluster({"127.0.0.1:1,nonsense", "",
                                       absl::Seconds(1), absl::Seconds(1), 2}));
}

}  // namespace
}  // namespace hostkv
