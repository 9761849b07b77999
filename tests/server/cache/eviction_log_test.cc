#include "server/cache/eviction_log.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/cache/page_cache.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

using Keys = std::vector<std::string>;

TEST(EvictionLogTest, ReadsOneNamespaceInOrderFromAnyPoint) {
  EvictionLog log(8);
  EXPECT_EQ(0u, log.last());
  log.Record(1, "a");
  log.Record(2, "x");
  log.Record(1, "b");
  EvictionList all = log.Read(1, 0, 100);
  EXPECT_EQ((Keys{"a", "b"}), all.keys);
  EXPECT_EQ(3u, all.next);
  EXPECT_EQ(0u, all.missed);
  EXPECT_EQ((Keys{"b"}), log.Read(1, 1, 100).keys);
  EXPECT_EQ((Keys{"x"}), log.Read(2, 0, 100).keys);
  // Nothing new after the last one.
  EvictionList none = log.Read(1, 3, 100);
  EXPECT_TRUE(none.keys.empty());
  EXPECT_EQ(3u, none.next);
}

TEST(EvictionLogTest, MaxKeysPagesAndZeroStartsFromNow) {
  EvictionLog log(16);
  for (int i = 0; i < 5; ++i) log.Record(7, absl::StrCat("k", i));
  EvictionList first = log.Read(7, 0, 2);
  EXPECT_EQ((Keys{"k0", "k1"}), first.keys);
  EvictionList rest = log.Read(7, first.next, 100);
  EXPECT_EQ((Keys{"k2", "k3", "k4"}), rest.keys);
  EvictionList now = log.Read(7, 0, 0);
  EXPECT_TRUE(now.keys.empty());
  EXPECT_EQ(5u, now.next);
}

TEST(EvictionLogTest, CountsWhatLeftTheRingUnread) {
  EvictionLog log(4);
  for (int i = 0; i < 10; ++i) log.Record(1, absl::StrCat("k", i));
  // Numbers 7..10 are held; 1..6 are gone.
  EvictionList from_start = log.Read(1, 0, 100);
  EXPECT_EQ(6u, from_start.missed);
  EXPECT_EQ((Keys{"k6", "k7", "k8", "k9"}), from_start.keys);
  EXPECT_EQ(10u, from_start.next);
  EvictionList late = log.Read(1, 5, 100);
  EXPECT_EQ(1u, late.missed);
  EXPECT_EQ(4u, late.keys.size());
}

TEST(EvictionLogTest, ACursorFromBeforeARestartReadsFromTheStart) {
  EvictionLog log(8);
  log.Record(1, "a");
  EvictionList stale = log.Read(1, 1000, 100);
  EXPECT_EQ((Keys{"a"}), stale.keys);
  EXPECT_EQ(1u, stale.next);
}

TEST(EvictionLogTest, KeepsFullSixtyFourByteKeys) {
  EvictionLog log(2);
  const std::string key(64, '\xff');
  log.Record(3, key);
  EXPECT_EQ((Keys{key}), log.Read(3, 0, 1).keys);
}

TEST(PageCacheEvictionsTest, EvictionsAreListedPerNamespace) {
  absl::StatusOr<std::unique_ptr<PageCache>> cache = PageCache::Create(8);
  ASSERT_OK(cache);
  PageCache& c = **cache;
  ASSERT_OK(c.Publish("vllm-a", "a0", "", 0));
  ASSERT_OK(c.Publish("vllm-b", "b0", "", 1));
  ASSERT_OK(c.Publish("vllm-a", "a1", "", 2));
  // Nothing evicted yet; a reader starting now gets the current number.
  EvictionList start = c.ListEvictions("vllm-a", 0, 0);
  EXPECT_EQ(0u, start.next);
  const std::vector<uint64_t> evicted = c.Evict(3);
  ASSERT_EQ(3u, evicted.size());
  EvictionList a = c.ListEvictions("vllm-a", start.next, 100);
  std::sort(a.keys.begin(), a.keys.end());
  EXPECT_EQ((Keys{"a0", "a1"}), a.keys);
  EXPECT_EQ(3u, a.next);
  EXPECT_EQ((Keys{"b0"}), c.ListEvictions("vllm-b", 0, 100).keys);
  // A namespace nothing was published in has none.
  EvictionList unknown = c.ListEvictions("never", 0, 100);
  EXPECT_TRUE(unknown.keys.empty());
  EXPECT_EQ(3u, unknown.next);
  EXPECT_OK(c.CheckConsistency());
}

}  // namespace
}  // namespace hostkv
