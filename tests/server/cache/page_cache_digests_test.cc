// The page cache's side of page digests: digests set after a publish and
// read back, a page that no longer matches taken out of the cache (detached
// while referenced or a parent, evicted first), the misses that follow
// saying digest_mismatch or tier_failed, the ledger told of each digest.
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/cache/cache_ledger.h"
#include "server/cache/page_cache.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr OwnerTag kAlice = 1;
constexpr OwnerTag kBob = 2;

// Records what the cache tells its ledger.
class FakeLedger : public CacheLedger {
 public:
  void RecordCached(uint64_t page, absl::string_view, absl::string_view, uint64_t,
                    uint64_t) override {
    cached.push_back(page);
  }
  void RecordEvicted(uint64_t page) override { evicted.push_back(page); }
  void RecordDigest(uint64_t page, uint32_t digest) override {
    digests.emplace_back(page, digest);
  }
  std::vector<uint64_t> cached, evicted;
  std::vector<std::pair<uint64_t, uint32_t>> digests;
};

class PageCacheDigestsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<PageCache>> cache = PageCache::Create(8);
    ASSERT_OK(cache);
    cache_ = std::move(*cache);
    cache_->set_ledger(&ledger_);
  }
  // keys[i] on page i, chained (each the parent of the next).
  void PublishChain(const std::vector<absl::string_view>& keys) {
    std::vector<PublishItem> items;
    for (size_t i = 0; i < keys.size(); ++i) {
      items.push_back({keys[i], i == 0 ? absl::string_view() : keys[i - 1], i});
    }
    ASSERT_OK(cache_->Publish("m", items, false, kNoOwner));
  }
  MissReason WhyNot(absl::string_view key) {
    const std::vector<absl::string_view> keys = {key};
    const std::vector<KeyExplanation> why = cache_->ExplainKeys("m", keys);
    EXPECT_FALSE(why[0].cached);
    return why[0].why.reason;
  }

  FakeLedger ledger_;
  std::unique_ptr<PageCache> cache_;
};

TEST_F(PageCacheDigestsTest, DigestsArePendingUntilSetAndGoWithTheKey) {
  PublishChain({"a", "b"});
  EXPECT_EQ(2u, cache_->digest_counters().pending);
  std::vector<uint64_t> pages = {0, 1, 5};
  EXPECT_EQ((std::vector<std::optional<uint32_t>>{std::nullopt, std::nullopt, std::nullopt}),
            cache_->DigestsOf(pages));
  EXPECT_TRUE(cache_->SetDigest(0, "a", 0xAAAA));
  EXPECT_FALSE(cache_->SetDigest(0, "a", 0xBBBB)) << "set once";
  EXPECT_FALSE(cache_->SetDigest(1, "a", 0xBBBB)) << "page 1 is b's";
  EXPECT_FALSE(cache_->SetDigest(5, "a", 0xBBBB)) << "not cached";
  EXPECT_EQ((std::vector<std::optional<uint32_t>>{0xAAAA, std::nullopt, std::nullopt}),
            cache_->DigestsOf(pages));
  EXPECT_EQ((std::vector<std::pair<uint64_t, uint32_t>>{{0, 0xAAAA}}), ledger_.digests);
  DigestCounters c = cache_->digest_counters();
  EXPECT_EQ(1u, c.computed);
  EXPECT_EQ(1u, c.pending);
  const std::vector<PageCache::Undigested> undigested = cache_->ListUndigested();
  ASSERT_EQ(1u, undigested.size());
  EXPECT_EQ("m", undigested[0].name_space);
  EXPECT_EQ(std::vector<uint64_t>{1}, undigested[0].pages);
  EXPECT_EQ(std::vector<std::string>{"b"}, undigested[0].keys);
  // Evicted (b first: a is its parent), then cached again: pending anew.
  EXPECT_EQ(2u, cache_->Evict(8).size());
  ASSERT_OK(cache_->Publish("m", "a", "", 0));
  EXPECT_EQ(std::vector<std::optional<uint32_t>>{std::nullopt},
            cache_->DigestsOf(std::vector<uint64_t>{0}));
  EXPECT_EQ(1u, cache_->digest_counters().pending);
  EXPECT_OK(cache_->CheckConsistency());
}

// A mismatch in the middle of a chain that this session and another
// reference: the hits stop before it, the session's references on the
// pages not served go, the key leaves the cache at once, and the page is
// freed only once nothing holds it (evicted before any other page).
TEST_F(PageCacheDigestsTest, RejectedHitsLeaveTheCacheAndTheirReferencesGo) {
  PublishChain({"a", "b", "c"});
  const std::vector<absl::string_view> keys = {"a", "b", "c"};
  ASSERT_OK(cache_->Lookup("m", keys, true, kBob));
  absl::StatusOr<LookupResult> found = cache_->Lookup("m", keys, true, kAlice, false);
  ASSERT_OK(found);
  ASSERT_EQ(3u, found->hits);
  cache_->RejectHits("m", *found, 1, true, kAlice);
  cache_->CountLookupMisses("m", keys, found->hits);
  EXPECT_EQ(1u, found->hits);
  EXPECT_EQ(std::vector<uint64_t>{0}, found->pages);
  EXPECT_EQ(1u, cache_->ReferencesHeldBy(kAlice));
  EXPECT_EQ(1u, cache_->References(1)) << "Bob's";
  EXPECT_OK(cache_->CheckConsistency());
  EXPECT_EQ(std::vector<uint64_t>{1}, ledger_.evicted);
  // Not found, explained, counted.
  EXPECT_EQ(1u, cache_->Lookup("m", keys, false, kNoOwner)->hits);
  EXPECT_EQ(MissReason::kDigestMismatch, WhyNot("b"));
  const CacheStats stats = cache_->Stats();
  EXPECT_EQ(2u, stats.namespaces[0].misses.missed_by_reason[static_cast<int>(
                    MissReason::kDigestMismatch)]);
  EXPECT_EQ(1u + 3u + 1u, stats.total.hits) << "Bob's 3, Alice's 1 served, 1 now";
  EXPECT_EQ(1u, cache_->digest_counters().mismatched);
  // The page stays the cache's while Bob holds it and c is its child.
  EXPECT_TRUE(cache_->IsCached(1));
  EXPECT_EQ(PageCache::kNotCached, cache_->PageOf("m", "b"));
  // A publish of b again takes a fresh page; the detached one is not it.
  ASSERT_OK(cache_->Publish("m", "b", "a", 4));
  EXPECT_EQ(4u, cache_->PageOf("m", "b"));
  EXPECT_EQ(PublishOutcome::kConflict, cache_->Publish("m", "x", "", 1)->outcome);
  // Once Bob lets go, the evictable pages go coldest first; the detached
  // page, evictable once its child c is gone, joins them at the cold end.
  EXPECT_EQ(3u, cache_->ReleaseAll(kBob));
  EXPECT_OK(cache_->CheckConsistency());
  EXPECT_EQ((std::vector<uint64_t>{4, 2}), cache_->Evict(2))
      << "b's new page (published before Bob let go), then c";
  EXPECT_EQ(std::vector<uint64_t>{1}, cache_->Evict(1)) << "the detached page, cold end";
  EXPECT_FALSE(cache_->IsCached(1));
  EXPECT_OK(cache_->CheckConsistency());
}

TEST_F(PageCacheDigestsTest, AnUnreferencedMismatchIsEvictedBeforeAnythingElse) {
  ASSERT_OK(cache_->Publish("m", "old", "", 3));
  ASSERT_OK(cache_->Publish("m", "a", "", 0));
  const std::vector<absl::string_view> keys = {"a"};
  absl::StatusOr<LookupResult> found = cache_->Lookup("m", keys, false, kNoOwner, false);
  ASSERT_OK(found);
  cache_->RejectHits("m", *found, 0, false, kNoOwner);
  EXPECT_EQ(0u, found->hits);
  EXPECT_EQ(std::vector<uint64_t>{0}, cache_->Evict(1)) << "before the colder 'old'";
  EXPECT_EQ(3u, cache_->PageOf("m", "old"));
  EXPECT_OK(cache_->CheckConsistency());
}

TEST_F(PageCacheDigestsTest, DroppedKeysMissForTheirReasonUntilPublishedAgain) {
  ASSERT_OK(cache_->Publish("m", "a", "", 0));
  cache_->NoteDropped("m", "t", MissReason::kTierFailed);
  cache_->NoteDropped("fresh", "r", MissReason::kDigestMismatch);
  EXPECT_EQ(MissReason::kTierFailed, WhyNot("t"));
  const std::vector<absl::string_view> r = {"r"};
  EXPECT_EQ(MissReason::kDigestMismatch, cache_->ExplainKeys("fresh", r)[0].why.reason);
  EXPECT_EQ(0u, cache_->Lookup("m", std::vector<absl::string_view>{"t"}, false, kNoOwner)->hits);
  EXPECT_EQ(1u, cache_->Stats().namespaces[0].misses.missed_by_reason[static_cast<int>(
                    MissReason::kTierFailed)]);
  ASSERT_OK(cache_->Publish("m", "t", "", 1));
  EXPECT_EQ(PageCache::kNotCached + 0, cache_->PageOf("m", "zz"));
  EXPECT_EQ(1u, cache_->PageOf("m", "t"));
  // The tier writer's finding: the page of a key, if still that page.
  cache_->DropMismatched("m", "t", 0);
  EXPECT_EQ(1u, cache_->PageOf("m", "t")) << "page 0 is not t's";
  cache_->DropMismatched("m", "t", 1);
  EXPECT_EQ(PageCache::kNotCached, cache_->PageOf("m", "t"));
  EXPECT_EQ(MissReason::kDigestMismatch, WhyNot("t"));
  EXPECT_OK(cache_->CheckConsistency());
}

TEST_F(PageCacheDigestsTest, AdoptedDigestsAreKept) {
  std::unique_ptr<PageCache> fresh = *PageCache::Create(8);
  std::vector<AdoptedEntry> entries(2);
  entries[0] = {2, "m", "a", UINT64_MAX, 1, 0x1234u};
  entries[1] = {3, "m", "b", 2, 2, std::nullopt};
  ASSERT_OK(fresh->Adopt(entries));
  EXPECT_EQ((std::vector<std::optional<uint32_t>>{0x1234u, std::nullopt}),
            fresh->DigestsOf(std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(1u, fresh->digest_counters().pending);
  EXPECT_EQ(0u, fresh->digest_counters().computed);
  EXPECT_OK(fresh->CheckConsistency());
}

}  // namespace
}  // namespace hostkv
