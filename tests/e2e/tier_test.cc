// The Redis tier end to end: two hostkvd daemons ("nodes", each with its
// own socket, pool and memory) over one real redis-server or a real
// three-master Redis Cluster, engines publishing on one node and finding the
// pages on the other through the C++ client (bytes compared); a store killed
// and restarted while the daemons serve; values corrupted in the store.
#include <hiredis/hiredis.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/e2e/tier_nodes.h"
#include "tests/server/tier/redis_server_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

using ::hostkv::testing::ChainKeys;
using ::hostkv::testing::FreeClusterPort;
using ::hostkv::testing::PollUntil;
using ::hostkv::testing::RawRedisCommand;
using ::hostkv::testing::RawRedisReply;
using ::hostkv::testing::RedisServerProcess;
using ::hostkv::testing::TierNode;

bool HaveRedis() {
  return !RedisServerProcess::FindBinary().empty() &&
         std::system("command -v redis-cli >/dev/null 2>&1") == 0;
}

// The cache key of a Redis key of the tier ("hkv:" + len(ns) + ":" + ns +
// key, where the tier's ns is the 8-byte geometry fingerprint, 'r', the
// namespace owner's scope, ':' and the cache namespace: tier_keys.h), ""
// for another key.
std::string CacheKeyOf(const std::string& redis_key) {
  absl::string_view rest = redis_key;
  if (!absl::ConsumePrefix(&rest, "hkv:")) return "";
  const size_t colon = rest.find(':');
  size_t ns_bytes = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(rest.substr(0, colon), &ns_bytes) ||
      rest.size() <= colon + 1 + ns_bytes || ns_bytes < 9) {
    return "";
  }
  const absl::string_view ns = rest.substr(colon + 1, ns_bytes);
  if (ns[8] != 'r' ||
      !absl::EndsWith(ns, absl::StrCat(":", testing::kTierNamespace))) {
    return "";
  }
  return std::string(rest.substr(colon + 1 + ns_bytes));
}

// Cache key -> Redis key of every page the server on `socket` holds.
std::map<std::string, std::string> StoredKeys(const std::string& socket) {
  std::map<std::string, std::string> out;
  for (const std::string& key :
       RawRedisCommand(socket, {"KEYS", "*"}).elements) {
    const std::string cache_key = CacheKeyOf(key);
    if (!cache_key.empty()) out[cache_key] = key;
  }
  return out;
}

class RedisTierE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveRedis())
      GTEST_SKIP() << "redis-server or redis-cli is not installed";
  }

  // Daemons A and B over the store at `url`.
  void StartNodes(const std::string& url) {
    a_ = std::make_unique<TierNode>(url);
    ASSERT_TRUE(a_->ready()) << a_->error();
    b_ = std::make_unique<TierNode>(url);
    ASSERT_TRUE(b_->ready()) << b_->error();
  }

  // A publishes, the write-behind stores the pages, B finds them all in
  // the store (bytes compared), then in its own memory.
  void ExpectSharedThroughTheStore() {
    const std::vector<std::string> keys = ChainKeys("shared", 12);
    ASSERT_OK(a_->PublishChain(keys));
    ASSERT_TRUE(a_->WaitWritten(12)) << a_->Tier().DebugString();
    EXPECT_EQ(0u, a_->Tier().write_failures());
    EXPECT_EQ(12u, b_->LookupAndCheck(keys).value());
    const v1::TierStats after_fetch = b_->Tier();
    EXPECT_EQ(12u, after_fetch.read_hits());
    EXPECT_EQ(0u, after_fetch.read_corrupt());
    EXPECT_TRUE(after_fetch.serving());
    // Host memory now: the tier is not asked again.
    EXPECT_EQ(12u, b_->LookupAndCheck(keys).value());
    EXPECT_EQ(12u, b_->Tier().read_hits());
    EXPECT_EQ(after_fetch.get_calls(), b_->Tier().get_calls());
    // A had them in memory all along.
    EXPECT_EQ(12u, a_->LookupAndCheck(keys).value());
    EXPECT_EQ(0u, a_->Tier().read_hits());
  }

  RedisServerProcess redis_;
  std::unique_ptr<TierNode> a_;
  std::unique_ptr<TierNode> b_;
};

TEST_F(RedisTierE2eTest, NodesShareAServerOnAUnixSocket) {
  ASSERT_OK(redis_.Start());
  StartNodes("redis+unix:" + redis_.socket_path());
  EXPECT_EQ("redis+unix:" + redis_.socket_path(), a_->Tier().url());
  ExpectSharedThroughTheStore();
  EXPECT_EQ(12u, StoredKeys(redis_.socket_path()).size());
}

// redis:// with one address: the daemon asks whether it is a cluster
// (INFO cluster) and takes it as the single server it is.
TEST_F(RedisTierE2eTest, NodesShareAServerOnLoopbackTcp) {
  const int port = testing::FreeTcpPort();
  ASSERT_OK(redis_.StartOnPort(port));
  const std::string url = absl::StrCat("redis://127.0.0.1:", port);
  StartNodes(url);
  EXPECT_EQ(url, a_->Tier().url());  // not redis-cluster://
  EXPECT_EQ(url, b_->Tier().url());
  ExpectSharedThroughTheStore();
}

// Redis killed: host operations go on, "hostkv.tier" says NOT_SERVING;
// restarted on the same socket (empty), the tier comes back by itself.
TEST_F(RedisTierE2eTest, StoreKilledAndRestartedWhileTheNodesServe) {
  ASSERT_OK(redis_.Start());
  StartNodes("redis+unix:" + redis_.socket_path());
  EXPECT_TRUE(CheckHealth(a_->target(), "hostkv.tier").value());
  const std::vector<std::string> before = ChainKeys("before", 6);
  ASSERT_OK(a_->PublishChain(before));
  ASSERT_TRUE(a_->WaitWritten(6));
  ASSERT_EQ(6u, b_->LookupAndCheck(before).value());

  redis_.Kill();
  // At once, before the daemons may have noticed, and again after.
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    const std::string prefix = absl::StrCat("down", round);
    EXPECT_OK(a_->PublishChain(ChainKeys(prefix, 3)));
    EXPECT_EQ(3u, a_->LookupAndCheck(ChainKeys(prefix, 3)).value());
    for (TierNode* node : {a_.get(), b_.get()}) {
      EXPECT_EQ(6u, node->LookupAndCheck(before).value());
      EXPECT_OK(node->AllocAndFree());
    }
    // Not in B's memory, and the store is gone: a miss, not an error.
    EXPECT_EQ(0u, b_->LookupAndCheck(ChainKeys(prefix, 3)).value());
    if (round == 0) {
      EXPECT_TRUE(a_->WaitTierHealth(false));
      EXPECT_TRUE(b_->WaitTierHealth(false));
    }
  }
  EXPECT_FALSE(a_->Tier().serving());
  EXPECT_FALSE(a_->Tier().last_error().empty());
  EXPECT_TRUE(CheckHealth(a_->target()).value());  // the daemon serves
  EXPECT_TRUE(CheckHealth(b_->target()).value());

  ASSERT_OK(redis_.Start());
  EXPECT_TRUE(a_->WaitTierHealth(true));
  EXPECT_TRUE(b_->WaitTierHealth(true));
  EXPECT_TRUE(a_->Tier().serving());
  const uint64_t written = a_->Tier().written();
  const std::vector<std::string> after = ChainKeys("after", 6);
  ASSERT_OK(a_->PublishChain(after));
  ASSERT_TRUE(a_->WaitWritten(written + 6)) << a_->Tier().DebugString();
  EXPECT_EQ(6u, b_->LookupAndCheck(after).value());
}

// A flipped page byte (checksum) and another geometry's fingerprint: each
// stops the prefix at its key, is counted and logged, and never served.
TEST_F(RedisTierE2eTest, CorruptValuesAreMissesNeverServed) {
  ASSERT_OK(redis_.Start());
  StartNodes("redis+unix:" + redis_.socket_path());
  const std::vector<std::string> flipped = ChainKeys("flipped", 6);
  const std::vector<std::string> foreign = ChainKeys("foreign", 3);
  ASSERT_OK(a_->PublishChain(flipped));
  ASSERT_OK(a_->PublishChain(foreign));
  ASSERT_TRUE(a_->WaitWritten(9));
  const std::map<std::string, std::string> stored =
      StoredKeys(redis_.socket_path());
  ASSERT_EQ(9u, stored.size());
  const auto rewrite = [&](const std::string& cache_key, size_t offset) {
    const std::string& key = stored.at(cache_key);
    RawRedisReply value = RawRedisCommand(redis_.socket_path(), {"GET", key});
    ASSERT_EQ(REDIS_REPLY_STRING, value.type);
    ASSERT_EQ(32 + a_->page_bytes(), value.str.size());
    value.str[offset] ^= 0x01;
    ASSERT_EQ(
        REDIS_REPLY_STATUS,
        RawRedisCommand(redis_.socket_path(), {"SET", key, value.str}).type);
  };
  rewrite(flipped[2], 32 + 1000);  // a page byte
  rewrite(foreign[1], 8);          // the geometry fingerprint

  EXPECT_EQ(2u, b_->LookupAndCheck(flipped).value());
  EXPECT_EQ(1u, b_->Tier().read_corrupt());
  EXPECT_EQ(1u, b_->LookupAndCheck(foreign).value());
  const v1::TierStats stats = b_->Tier();
  EXPECT_EQ(2u, stats.read_corrupt());
  EXPECT_EQ(3u, stats.read_hits());
  EXPECT_TRUE(stats.serving());  // a bad value is not a dead store
  EXPECT_TRUE(b_->WaitLog("checksum does not match")) << b_->log();
  EXPECT_TRUE(b_->WaitLog("geometry does not match")) << b_->log();
  // The intact rest of the chain is still found after the bad key.
  const std::vector<std::string> rest(flipped.begin() + 3, flipped.end());
  EXPECT_EQ(3u, b_->LookupAndCheck(rest).value());
  EXPECT_EQ(2u, b_->Tier().read_corrupt());
}

// Three masters made by the test; pages spread over them. A master killed:
// its keys miss (a chain stops at its first such key), the others still
// hit, and no page is ever wrong.
class RedisClusterE2eTest : public RedisTierE2eTest {
 protected:
  static constexpr int kMasters = 3;

  void SetUp() override {
    RedisTierE2eTest::SetUp();
    if (IsSkipped()) return;
    std::vector<std::string> addresses;
    for (int i = 0; i < kMasters; ++i) {
      masters_.push_back(std::make_unique<RedisServerProcess>());
      const int port = FreeClusterPort();
      ASSERT_NE(0, port);
      ASSERT_OK(masters_.back()->StartClusterNode(port));
      addresses.push_back(absl::StrCat("127.0.0.1:", port));
    }
    const std::string create = absl::StrCat(
        "redis-cli --cluster create ", absl::StrJoin(addresses, " "),
        " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1");
    ASSERT_EQ(0, std::system(create.c_str()));
    for (int i = 0; i < kMasters; ++i) {
      ASSERT_TRUE(PollUntil([&] {
        return absl::StrContains(Raw(i, {"CLUSTER", "INFO"}).str,
                                 "cluster_state:ok");
      })) << i;
    }
    url_ = "redis://" + absl::StrJoin(addresses, ",");
  }

  RawRedisReply Raw(int master, const std::vector<std::string>& args) {
    return RawRedisCommand(masters_[master]->socket_path(), args);
  }

  std::vector<std::unique_ptr<RedisServerProcess>> masters_;
  std::string url_;
};

TEST_F(RedisClusterE2eTest, AKilledMasterCostsOnlyItsKeys) {
  StartNodes(url_);
  EXPECT_TRUE(absl::StartsWith(a_->Tier().url(), "redis-cluster://"))
      << a_->Tier().url();
  constexpr int kChains = 24;
  constexpr int kChainKeys = 3;
  std::vector<std::vector<std::string>> chains;
  for (int c = 0; c < kChains; ++c) {
    chains.push_back(ChainKeys(absl::StrCat("chain", c), kChainKeys));
    ASSERT_OK(a_->PublishChain(chains.back()));
  }
  ASSERT_TRUE(a_->WaitWritten(kChains * kChainKeys))
      << a_->Tier().DebugString();
  std::map<std::string, int> master_of;
  for (int m = 0; m < kMasters; ++m) {
    const std::map<std::string, std::string> here =
        StoredKeys(masters_[m]->socket_path());
    EXPECT_GT(here.size(), 0u) << "master " << m;
    EXPECT_EQ(static_cast<long long>(here.size()), Raw(m, {"DBSIZE"}).integer);
    for (const auto& [cache_key, redis_key] : here) master_of[cache_key] = m;
  }
  ASSERT_EQ(static_cast<size_t>(kChains * kChainKeys), master_of.size());
  // The first chains are read while every master serves.
  constexpr int kReadBefore = 4;
  for (int c = 0; c < kReadBefore; ++c) {
    EXPECT_EQ(3u, b_->LookupAndCheck(chains[c]).value()) << c;
  }
  EXPECT_EQ(kReadBefore * kChainKeys, b_->Tier().read_hits());

  // Any master will do: the daemons' health probe asks keys on several.
  const int victim = 1;
  masters_[victim]->Kill();
  int full = 0, cut = 0, empty = 0;
  uint64_t expected_hits = kReadBefore * kChainKeys;
  for (int c = kReadBefore; c < kChains; ++c) {
    uint64_t expected = 0;
    while (expected < kChainKeys && master_of[chains[c][expected]] != victim) {
      ++expected;
    }
    full += expected == kChainKeys;
    cut += expected > 0 && expected < kChainKeys;
    empty += expected == 0;
    expected_hits += expected;
    EXPECT_EQ(expected, b_->LookupAndCheck(chains[c]).value()) << "chain " << c;
  }
  // The keys are such that every case happens (their slots are fixed).
  EXPECT_GT(full, 0);
  EXPECT_GT(cut, 0);
  EXPECT_GT(empty, 0);
  const v1::TierStats stats = b_->Tier();
  EXPECT_EQ(expected_hits, stats.read_hits());
  EXPECT_GT(stats.read_failures(), 0u);
  EXPECT_EQ(0u, stats.read_corrupt());
  EXPECT_TRUE(CheckHealth(a_->target()).value());
  EXPECT_TRUE(CheckHealth(b_->target()).value());
  // The other masters answer: the tier still serves (their keys hit).
  EXPECT_TRUE(stats.serving()) << stats.last_error();
  EXPECT_TRUE(CheckHealth(b_->target(), "hostkv.tier").value());
  EXPECT_OK(a_->AllocAndFree());
  EXPECT_OK(b_->AllocAndFree());
  // What B had before the kill is in its memory.
  for (int c = 0; c < kReadBefore; ++c) {
    EXPECT_EQ(3u, b_->LookupAndCheck(chains[c]).value()) << c;
  }
}

}  // namespace
}  // namespace hostkv
