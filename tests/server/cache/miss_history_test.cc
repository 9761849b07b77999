// Why lookups miss (PageCache with its MissHistory): each reason from the
// calls that produce it, the counters by namespace, the recent misses.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/cache/page_cache.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr OwnerTag kAlice = 1;

class MissHistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<PageCache>> cache = PageCache::Create(4);
    ASSERT_OK(cache);
    cache_ = std::move(*cache);
  }
  void Publish(absl::string_view ns, absl::string_view key, uint64_t page) {
    ASSERT_OK(cache_->Publish(ns, key, "", page));
  }
  uint64_t Lookup(absl::string_view ns, std::vector<absl::string_view> keys) {
    absl::StatusOr<LookupResult> r = cache_->Lookup(ns, keys, false, kNoOwner);
    EXPECT_OK(r);
    return r.ok() ? r->hits : 0;
  }
  KeyExplanation Why(absl::string_view ns, absl::string_view key) {
    std::vector<absl::string_view> keys = {key};
    return cache_->ExplainKeys(ns, keys)[0];
  }
  MissCounters Counters(absl::string_view ns) {
    for (const NamespaceCounters& n : cache_->Stats().namespaces) {
      if (n.name == ns) return n.misses;
    }
    return cache_->Stats().unknown_namespace;
  }
  static uint64_t Missed(const MissCounters& c, MissReason r) {
    return c.missed_by_reason[static_cast<int>(r)];
  }

  std::unique_ptr<PageCache> cache_;
};

TEST_F(MissHistoryTest, EachReasonFromItsCause) {
  Publish("a", "k0", 0);
  Publish("a", "k1", 1);
  Publish("b", "shared", 2);
  // Cached: a hit, and no reason.
  EXPECT_EQ(Lookup("a", {"k0", "k1"}), 2u);
  EXPECT_TRUE(Why("a", "k0").cached);
  // Never published here.
  EXPECT_EQ(Lookup("a", {"k0", "nope"}), 1u);
  EXPECT_EQ(Why("a", "nope").why.reason, MissReason::kNeverPublished);
  // In another namespace of the pool, named.
  EXPECT_EQ(Lookup("a", {"shared"}), 0u);
  const KeyExplanation other = Why("a", "shared");
  EXPECT_EQ(other.why.reason, MissReason::kOtherNamespace);
  EXPECT_EQ(other.other_namespace, "b");
  // Evicted, for the session whose allocation asked.
  const std::vector<uint64_t> evicted = cache_->EvictForAllocation(3, /*for_session=*/7);
  ASSERT_EQ(evicted.size(), 3u);
  EXPECT_EQ(Lookup("a", {"k0"}), 0u);
  const KeyExplanation gone = Why("a", "k0");
  EXPECT_EQ(gone.why.reason, MissReason::kEvicted);
  EXPECT_EQ(gone.why.evicted_for_session, 7u);
  EXPECT_LE(absl::Now() - gone.why.evicted_at, absl::Seconds(5));

  const MissCounters a = Counters("a");
  EXPECT_EQ(a.lookups, 4u);
  EXPECT_EQ(a.reusable_lookups, 3u);  // the lookup of "shared" could never hit here
  EXPECT_EQ(a.missed(), 3u);
  EXPECT_EQ(Missed(a, MissReason::kNeverPublished), 1u);
  EXPECT_EQ(Missed(a, MissReason::kOtherNamespace), 1u);
  EXPECT_EQ(Missed(a, MissReason::kEvicted), 1u);
  // Newest first, this namespace's only.
  const std::vector<ExplainedMiss> recent = cache_->RecentMisses("a", 10);
  ASSERT_EQ(recent.size(), 3u);
  EXPECT_EQ(recent[0].key, "k0");
  EXPECT_EQ(recent[0].why.reason, MissReason::kEvicted);
  EXPECT_EQ(recent[1].key, "shared");
  EXPECT_EQ(recent[1].other_namespace, "b");
  EXPECT_EQ(recent[2].key, "nope");
  EXPECT_EQ(cache_->RecentMisses("a", 1).size(), 1u);
}

TEST_F(MissHistoryTest, NamespacesNeverPublishedInCountApart) {
  Publish("b", "k", 0);
  EXPECT_EQ(Lookup("never", {"k"}), 0u);
  EXPECT_EQ(Lookup("never", {"x"}), 0u);
  const MissCounters c = cache_->Stats().unknown_namespace;
  EXPECT_EQ(c.lookups, 2u);
  EXPECT_EQ(Missed(c, MissReason::kOtherNamespace), 1u);
  EXPECT_EQ(Missed(c, MissReason::kNeverPublished), 1u);
  EXPECT_EQ(Why("never", "k").other_namespace, "b");
  EXPECT_EQ(cache_->RecentMisses("never", 10).size(), 2u);
}

TEST_F(MissHistoryTest, RefusedLookupsAreMissesWithTheirReason) {
  Publish("a", "k", 0);
  std::vector<absl::string_view> keys = {"k"};
  ASSERT_OK(cache_->Lookup("a", keys, true, kAlice));  // charged: no budget hook
  PageCache::ReferenceCharge charge;
  charge.reserve = [](uint64_t) { return absl::ResourceExhaustedError("budget"); };
  charge.release = [](uint64_t) {};
  absl::StatusOr<std::unique_ptr<PageCache>> refusing = PageCache::Create(4);
  ASSERT_OK(refusing);
  (*refusing)->set_reference_charge(charge);
  ASSERT_OK((*refusing)->Publish("a", "k", "", 0));
  EXPECT_EQ((*refusing)->Lookup("a", keys, true, kAlice).status().code(),
            absl::StatusCode::kResourceExhausted);
  const MissCounters c = (*refusing)->Stats().namespaces[0].misses;
  EXPECT_EQ(Missed(c, MissReason::kRefused), 1u);
  EXPECT_EQ(c.lookups, 1u);
}

TEST_F(MissHistoryTest, MemoryIsBoundedAndCounted) {
  EXPECT_EQ(MissHistory::SlotsFor(1), 4096u);
  EXPECT_EQ(MissHistory::SlotsFor(1024), 8192u);
  EXPECT_EQ(MissHistory::SlotsFor(uint64_t{1} << 30), MissHistory::kSlots);
  // The recent misses stay within their ring.
  Publish("a", "k", 0);
  for (size_t i = 0; i < MissHistory::kRecent + 10; ++i) {
    Lookup("a", {absl::StrCat("m", i)});
  }
  EXPECT_EQ(cache_->RecentMisses("a", 100000).size(), MissHistory::kRecent);
  EXPECT_LE(cache_->MemoryBytes(), cache_->MaxMemoryBytes());
}

}  // namespace
}  // namespace hostkv
