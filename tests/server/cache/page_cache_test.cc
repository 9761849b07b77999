#include "server/cache/page_cache.h"

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr OwnerTag kAlice = 1;
constexpr OwnerTag kBob = 2;
using Pages = std::vector<uint64_t>;
using Outcome = PublishOutcome;

std::unique_ptr<PageCache> MakeCache(uint64_t pages) {
  absl::StatusOr<std::unique_ptr<PageCache>> cache = PageCache::Create(pages);
  EXPECT_OK(cache);
  return std::move(*cache);
}

class PageCacheTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_OK(cache_->CheckConsistency()); }

  PublishResult Publish(absl::string_view key, uint64_t page,
                        absl::string_view parent = "",
                        absl::string_view ns = "ns") {
    absl::StatusOr<PublishResult> r = cache_->Publish(ns, key, parent, page);
    EXPECT_OK(r);
    return r.ok() ? *r : PublishResult{};
  }
  // Publishes a chain: keys[i]'s parent is keys[i - 1]; pages[i] its page.
  std::vector<PublishResult> PublishChain(const std::vector<std::string>& keys,
                                          const Pages& pages,
                                          bool acquire = false,
                                          OwnerTag session = kNoOwner) {
    std::vector<PublishItem> items;
    for (size_t i = 0; i < keys.size(); ++i) {
      items.push_back(
          {keys[i],
           i == 0 ? absl::string_view() : absl::string_view(keys[i - 1]),
           pages[i]});
    }
    absl::StatusOr<std::vector<PublishResult>> r =
        cache_->Publish("ns", items, acquire, session);
    EXPECT_OK(r);
    return r.ok() ? *r : std::vector<PublishResult>{};
  }
  // The pages Lookup finds (no references taken).
  Pages Find(std::vector<absl::string_view> keys, absl::string_view ns = "ns") {
    absl::StatusOr<LookupResult> r = cache_->Lookup(ns, keys, false, kNoOwner);
    EXPECT_OK(r);
    if (!r.ok()) return {};
    EXPECT_EQ(r->hits, r->pages.size());
    return r->pages;
  }
  Pages Acquire(OwnerTag session, std::vector<absl::string_view> keys) {
    absl::StatusOr<LookupResult> r = cache_->Lookup("ns", keys, true, session);
    EXPECT_OK(r);
    return r.ok() ? r->pages : Pages{};
  }
  absl::StatusOr<uint64_t> Release(OwnerTag session, const Pages& pages) {
    return cache_->Release(session, ToPageRuns(pages));
  }
  Pages Evict(uint64_t n) { return cache_->Evict(n); }

  std::unique_ptr<PageCache> cache_ = MakeCache(100);
};

TEST(PageCacheCreateTest, RefusesEmptyAndHugePools) {
  EXPECT_ERROR(InvalidArgument, PageCache::Create(0));
  EXPECT_ERROR(InvalidArgument, PageCache::Create(kMaxCachePages + 1));
  EXPECT_OK(PageCache::Create(1));
}

TEST(ToPageRunsTest, CoalescesAscendingNeighboursInGivenOrder) {
  EXPECT_EQ((std::vector<PageRun>{{3, 3}, {9, 1}, {8, 1}, {3, 1}}),
            ToPageRuns({3, 4, 5, 9, 8, 3}));
  EXPECT_TRUE(ToPageRuns({}).empty());
}

TEST_F(PageCacheTest, PublishedPagesAreFoundInKeyOrder) {
  EXPECT_EQ(Outcome::kCached, Publish("a", 5).outcome);
  EXPECT_EQ(Outcome::kCached, Publish("b", 7).outcome);
  EXPECT_EQ((Pages{5, 7}), Find({"a", "b"}));
  EXPECT_EQ((Pages{7, 5}), Find({"b", "a"}));
  EXPECT_TRUE(cache_->IsCached(5));
  EXPECT_FALSE(cache_->IsCached(6));
  EXPECT_FALSE(cache_->IsCached(1000));
  EXPECT_EQ(2u, cache_->cached_pages());
  EXPECT_EQ(2u, cache_->evictable_pages());
  EXPECT_EQ(0u, cache_->referenced_pages());
}

TEST_F(PageCacheTest, LookupReturnsTheConsecutivePrefixOnly) {
  Publish("a", 1);
  Publish("b", 2);
  Publish("d", 4);
  absl::StatusOr<LookupResult> r =
      cache_->Lookup("ns", {"a", "b", "c", "d"}, false, kNoOwner);
  ASSERT_OK(r);
  EXPECT_EQ(2u, r->hits);
  EXPECT_EQ((Pages{1, 2}), r->pages);
  EXPECT_TRUE(Find({"c", "a"}).empty());
  const CacheCounters c = cache_->CountersOf("ns");
  EXPECT_EQ(2u, c.hits);
  EXPECT_EQ(4u, c.misses);  // c and d, then c and a
}

TEST_F(PageCacheTest, EmptyLookupIsAHitOfNothing) {
  Publish("a", 1);
  EXPECT_TRUE(Find({}).empty());
  EXPECT_EQ(CacheCounters({.cached = 1, .evictable = 1}),
            cache_->CountersOf("ns"));
}

TEST_F(PageCacheTest, UnknownNamespaceMissesWithoutCreatingIt) {
  EXPECT_TRUE(Find({"a", "b"}, "nobody").empty());
  const CacheStats stats = cache_->Stats();
  EXPECT_TRUE(stats.namespaces.empty());
  EXPECT_EQ(2u, stats.total.misses);
}

TEST_F(PageCacheTest, DuplicatePublishKeepsTheFirstPage) {
  Publish("a", 5);
  const PublishResult again = Publish("a", 6);
  EXPECT_EQ(Outcome::kAlreadyCached, again.outcome);
  EXPECT_EQ(5u, again.page);
  EXPECT_FALSE(cache_->IsCached(6));  // still the caller's
  EXPECT_EQ((Pages{5}), Find({"a"}));
  EXPECT_EQ(1u, cache_->CountersOf("ns").already_cached);
  EXPECT_EQ(1u, cache_->cached_pages());
}

TEST_F(PageCacheTest, PublishingACachedPageIsAConflict) {
  Publish("a", 5);
  const PublishResult other_key = Publish("b", 5);
  EXPECT_EQ(Outcome::kConflict, other_key.outcome);
  EXPECT_EQ(5u, other_key.page);
  EXPECT_EQ(Outcome::kConflict, Publish("a", 5).outcome);  // same key too
  EXPECT_EQ(Outcome::kConflict, Publish("a", 5, "", "other").outcome);
  EXPECT_TRUE(Find({"b"}).empty());
  EXPECT_EQ((Pages{5}), Find({"a"}));
  EXPECT_EQ(2u, cache_->CountersOf("ns").conflicts);
  EXPECT_EQ(1u, cache_->CountersOf("other").conflicts);
  EXPECT_EQ(1u, cache_->cached_pages());
}

TEST_F(PageCacheTest, BatchPublishGivesOneResultPerItemInOrder) {
  const std::vector<PublishItem> items = {
      {"a", "", 1}, {"a", "", 2}, {"b", "", 1}, {"c", "a", 3}};
  absl::StatusOr<std::vector<PublishResult>> r =
      cache_->Publish("ns", items, false, kNoOwner);
  ASSERT_OK(r);
  ASSERT_EQ(4u, r->size());
  EXPECT_EQ(Outcome::kCached, (*r)[0].outcome);
  EXPECT_EQ(Outcome::kAlreadyCached, (*r)[1].outcome);
  EXPECT_EQ(1u, (*r)[1].page);
  EXPECT_EQ(Outcome::kConflict, (*r)[2].outcome);
  EXPECT_EQ(Outcome::kCached, (*r)[3].outcome);
  EXPECT_EQ((Pages{1, 3}), Find({"a", "c"}));
  // c's parent is a, given in the same batch: a waits for c.
  EXPECT_EQ(1u, cache_->evictable_pages());
}

TEST_F(PageCacheTest, KeysAreOpaqueBytes) {
  const std::string k1("x\0y", 3), k2("x\0z", 3);
  Publish(k1, 1);
  Publish(k2, 2);
  Publish("x", 3);
  EXPECT_EQ((Pages{1, 2, 3}), Find({k1, k2, "x"}));
}

TEST_F(PageCacheTest, NamespacesAreSeparate) {
  Publish("a", 1, "", "one");
  Publish("a", 2, "", "two");
  EXPECT_EQ((Pages{1}), Find({"a"}, "one"));
  EXPECT_EQ((Pages{2}), Find({"a"}, "two"));
  EXPECT_TRUE(Find({"a"}, "three").empty());
}

TEST_F(PageCacheTest, AcquiredPagesAreNotEvicted) {
  Publish("a", 1);
  Publish("b", 2);
  Publish("c", 3);
  EXPECT_EQ((Pages{1, 2}), Acquire(kAlice, {"a", "b"}));
  EXPECT_EQ(1u, cache_->References(1));
  EXPECT_EQ(2u, cache_->referenced_pages());
  EXPECT_EQ(1u, cache_->evictable_pages());
  EXPECT_EQ((Pages{3}), Evict(10));
  EXPECT_EQ(2u, cache_->cached_pages());
  EXPECT_TRUE(Evict(10).empty());
  EXPECT_EQ(2u, *Release(kAlice, {1, 2}));
  EXPECT_EQ(0u, cache_->ReferencesHeldBy(kAlice));
  EXPECT_EQ(2u, cache_->evictable_pages());
  // Released last page first: the first page ends up hottest.
  EXPECT_EQ((Pages{2, 1}), Evict(10));
}

TEST_F(PageCacheTest, ReferencesAreCountedPerSessionAndInAll) {
  Publish("a", 1);
  Acquire(kAlice, {"a"});
  Acquire(kAlice, {"a", "a"});
  Acquire(kBob, {"a"});
  EXPECT_EQ(4u, cache_->References(1));
  EXPECT_EQ(3u, cache_->ReferencesHeldBy(kAlice));
  EXPECT_EQ(1u, *Release(kAlice, {1}));
  EXPECT_EQ(2u, *Release(kAlice, {1, 1}));
  EXPECT_EQ(1u, cache_->References(1));
  EXPECT_EQ(0u, cache_->evictable_pages());
  EXPECT_EQ(1u, cache_->ReleaseAll(kBob));
  EXPECT_EQ(1u, cache_->evictable_pages());
}

TEST_F(PageCacheTest, ReleaseOfAPageNotHeldChangesNothing) {
  Publish("a", 1);
  Publish("b", 2);
  Acquire(kAlice, {"a"});
  EXPECT_ERROR(FailedPrecondition, Release(kBob, {1}));
  EXPECT_ERROR(FailedPrecondition, Release(kAlice, {1, 2}));   // b not held
  EXPECT_ERROR(FailedPrecondition, Release(kAlice, {1, 1}));   // held once
  EXPECT_ERROR(FailedPrecondition, Release(kAlice, {1, 50}));  // not cached
  EXPECT_ERROR(InvalidArgument, cache_->Release(kAlice, {{1, 0}}));
  EXPECT_ERROR(InvalidArgument, cache_->Release(kAlice, {{99, 2}}));
  EXPECT_ERROR(InvalidArgument,
               cache_->Release(kAlice, {{1, 1}, {UINT64_MAX, 2}}));
  EXPECT_EQ(1u, cache_->References(1));
  EXPECT_EQ(1u, cache_->ReferencesHeldBy(kAlice));
  EXPECT_EQ(1u, *Release(kAlice, {1}));
  EXPECT_ERROR(FailedPrecondition, Release(kAlice, {1}));
}

TEST_F(PageCacheTest, ReleaseAllDropsReferencesNotPages) {
  Publish("a", 1);
  Publish("b", 2);
  Acquire(kAlice, {"a", "b"});
  Acquire(kAlice, {"a"});
  Acquire(kBob, {"b"});
  EXPECT_EQ(3u, cache_->ReleaseAll(kAlice));
  EXPECT_EQ(0u, cache_->ReleaseAll(kAlice));
  EXPECT_EQ(2u, cache_->cached_pages());
  EXPECT_EQ(0u, cache_->References(1));
  EXPECT_EQ(1u, cache_->References(2));
  EXPECT_EQ((Pages{1}), Evict(10));
}

TEST_F(PageCacheTest, PublishWithAcquireReferencesTheCachedPage) {
  absl::StatusOr<std::vector<PublishResult>> r =
      cache_->Publish("ns", {{"a", "", 5}}, true, kAlice);
  ASSERT_OK(r);
  EXPECT_EQ(1u, cache_->References(5));
  // Bob's copy of a is a duplicate: he gets a reference on Alice's page and
  // keeps his own; his publish of a cached page takes no reference.
  r = cache_->Publish("ns", {{"a", "", 6}, {"b", "", 5}}, true, kBob);
  ASSERT_OK(r);
  EXPECT_EQ(Outcome::kAlreadyCached, (*r)[0].outcome);
  EXPECT_EQ(5u, (*r)[0].page);
  EXPECT_EQ(Outcome::kConflict, (*r)[1].outcome);
  EXPECT_EQ(2u, cache_->References(5));
  EXPECT_EQ(1u, cache_->ReferencesHeldBy(kBob));
  EXPECT_TRUE(Evict(10).empty());
  cache_->ReleaseAll(kAlice);
  cache_->ReleaseAll(kBob);
  EXPECT_EQ((Pages{5}), Evict(10));
}

TEST_F(PageCacheTest, EvictsLeastRecentlyUsedFirst) {
  Publish("a", 1);
  Publish("b", 2);
  Publish("c", 3);
  Find({"a"});
  EXPECT_EQ((Pages{2}), Evict(1));
  Publish("d", 4);
  Find({"c"});
  EXPECT_EQ((Pages{1, 4, 3}), Evict(5));
  EXPECT_EQ(0u, cache_->cached_pages());
  EXPECT_EQ(4u, cache_->CountersOf("ns").evictions);
}

TEST_F(PageCacheTest, WithinOneCallLaterKeysAreColder) {
  cache_
      ->Publish("ns", {{"a", "", 1}, {"b", "", 2}, {"c", "", 3}}, false,
                kNoOwner)
      .IgnoreError();
  EXPECT_EQ((Pages{3}), Evict(1));
  Publish("c", 3);
  Find({"a", "b", "c"});
  EXPECT_EQ((Pages{3, 2, 1}), Evict(3));
}

TEST_F(PageCacheTest, ChainEvictsLeafBeforeParents) {
  PublishChain({"a", "b", "c"}, {1, 2, 3});
  Publish("x", 9);                           // hotter than the whole chain
  EXPECT_EQ(2u, cache_->evictable_pages());  // c and x
  EXPECT_EQ((Pages{3, 2, 1, 9}), Evict(4));
}

TEST_F(PageCacheTest, ChainIsEvictedFromItsEndEvenWhenItsRootIsHot) {
  PublishChain({"a", "b", "c"}, {1, 2, 3});
  Find({"a", "b", "c"});
  Publish("x", 9);
  // a is looked up alone after x: hotter than x, but its children hold it.
  Find({"a"});
  EXPECT_EQ((Pages{3, 2}), Evict(2));
  // b was last used (the chain's lookup) before x: it went to the cold end.
  // a, used after x, went to the hot end.
  EXPECT_EQ((Pages{9, 1}), Evict(2));
}

TEST_F(PageCacheTest, TreeEvictsEveryChildBeforeTheParent) {
  Publish("r", 1);
  Publish("c1", 2, "r");
  Publish("c2", 3, "r");
  Publish("g", 4, "c1");
  EXPECT_EQ(2u, cache_->evictable_pages());  // c2 and g
  EXPECT_EQ((Pages{3}), Evict(1));
  EXPECT_EQ(1u, cache_->evictable_pages());  // r still has c1
  EXPECT_EQ((Pages{4, 2, 1}), Evict(3));
}

TEST_F(PageCacheTest, ReferencedParentStaysAfterItsChildren) {
  PublishChain({"a", "b"}, {1, 2});
  Acquire(kAlice, {"a"});
  EXPECT_EQ((Pages{2}), Evict(10));
  EXPECT_EQ(1u, cache_->cached_pages());
  EXPECT_EQ(0u, cache_->evictable_pages());
  EXPECT_EQ(1u, *Release(kAlice, {1}));
  EXPECT_EQ((Pages{1}), Evict(10));
}

TEST_F(PageCacheTest, ParentKeyThatIsNotCachedIsIgnored) {
  EXPECT_EQ(Outcome::kCached, Publish("b", 2, "never").outcome);
  EXPECT_EQ(1u, cache_->evictable_pages());
  EXPECT_EQ((Pages{2}), Evict(1));
}

TEST_F(PageCacheTest, EntriesAreReusedAfterEviction) {
  for (int round = 0; round < 5; ++round) {
    std::vector<std::string> keys;
    Pages pages;
    for (int i = 0; i < 100; ++i) {
      keys.push_back(absl::StrCat("r", round, "-", i));
      pages.push_back(static_cast<uint64_t>(99 - i));
    }
    PublishChain(keys, pages);
    EXPECT_EQ(100u, cache_->cached_pages());
    ASSERT_OK(cache_->CheckConsistency());
    Pages reversed(pages.rbegin(), pages.rend());
    EXPECT_EQ(reversed, Evict(1000));
  }
  EXPECT_EQ(500u, cache_->CountersOf("ns").evictions);
}

TEST_F(PageCacheTest, BadInputIsRefusedAndChangesNothing) {
  const std::string key64(64, 'k'), ns128(128, 'n');
  const std::string key65(65, 'k'), ns129(129, 'n');
  auto publish = [&](absl::string_view ns, PublishItem item,
                     bool acquire = false, OwnerTag session = kNoOwner) {
    // A valid item first: it must not be published either.
    return cache_->Publish(ns, {{"ok", "", 10}, item}, acquire, session);
  };
  EXPECT_ERROR(InvalidArgument, publish("ns", {"", "", 1}));
  EXPECT_ERROR(InvalidArgument, publish("ns", {key65, "", 1}));
  EXPECT_ERROR(InvalidArgument, publish("ns", {"a", key65, 1}));
  EXPECT_ERROR(InvalidArgument, publish("ns", {"a", "", 100}));
  EXPECT_ERROR(InvalidArgument, publish("", {"a", "", 1}));
  EXPECT_ERROR(InvalidArgument, publish(ns129, {"a", "", 1}));
  EXPECT_ERROR(InvalidArgument, publish("ns", {"a", "", 1}, true, kNoOwner));
  EXPECT_ERROR(InvalidArgument, cache_->Lookup("ns", {"a", ""}, false, 0));
  EXPECT_ERROR(InvalidArgument, cache_->Lookup("ns", {key65}, false, 0));
  EXPECT_ERROR(InvalidArgument, cache_->Lookup(ns129, {"a"}, false, 0));
  EXPECT_ERROR(InvalidArgument, cache_->Lookup("ns", {"a"}, true, kNoOwner));
  const CacheStats stats = cache_->Stats();
  EXPECT_TRUE(stats.namespaces.empty());
  EXPECT_EQ(CacheCounters{}, stats.total);
  EXPECT_FALSE(cache_->IsCached(10));
  // The limits themselves are fine.
  EXPECT_EQ(Outcome::kCached, Publish(key64, 1, key64, ns128).outcome);
  EXPECT_EQ((Pages{1}), Find({key64}, ns128));
}

TEST_F(PageCacheTest, CountsPerNamespaceAndInAll) {
  Publish("a", 1, "", "one");
  Publish("b", 2, "a", "one");
  Publish("a", 3, "", "one");  // already cached
  Publish("x", 2, "", "one");  // conflict
  Publish("a", 4, "", "two");
  Publish("b", 5, "", "two");
  Find({"a", "b", "c"}, "one");
  absl::StatusOr<LookupResult> r = cache_->Lookup("two", {"b"}, true, kAlice);
  ASSERT_OK(r);
  Find({"zz"}, "three");
  Evict(1);  // two's a: published before one's b was looked up
  const CacheCounters one{.cached = 2,
                          .referenced = 0,
                          .evictable = 1,
                          .hits = 2,
                          .misses = 1,
                          .evictions = 0,
                          .already_cached = 1,
                          .conflicts = 1};
  const CacheCounters two{.cached = 1,
                          .referenced = 1,
                          .evictable = 0,
                          .hits = 1,
                          .misses = 0,
                          .evictions = 1,
                          .already_cached = 0,
                          .conflicts = 0};
  EXPECT_EQ(one, cache_->CountersOf("one"));
  EXPECT_EQ(two, cache_->CountersOf("two"));
  const CacheStats stats = cache_->Stats();
  ASSERT_EQ(2u, stats.namespaces.size());
  EXPECT_EQ("one", stats.namespaces[0].name);
  EXPECT_EQ(one, stats.namespaces[0].counters);
  EXPECT_EQ("two", stats.namespaces[1].name);
  const CacheCounters total{.cached = 3,
                            .referenced = 1,
                            .evictable = 1,
                            .hits = 3,
                            .misses = 2,
                            .evictions = 1,
                            .already_cached = 1,
                            .conflicts = 1};
  EXPECT_EQ(total, stats.total);
}

TEST_F(PageCacheTest, EmptyCallsChangeNothing) {
  absl::StatusOr<std::vector<PublishResult>> r =
      cache_->Publish("ns", {}, true, kAlice);
  ASSERT_OK(r);
  EXPECT_TRUE(r->empty());
  EXPECT_EQ(0u, *cache_->Release(kAlice, {}));
  EXPECT_TRUE(Evict(0).empty());
  EXPECT_TRUE(Evict(10).empty());
  EXPECT_EQ(0u, cache_->ReferencesHeldBy(kAlice));
}

TEST_F(PageCacheTest, MemoryGrowsByAChunkOfEntriesAtTheFirstPublish) {
  const uint64_t empty = cache_->MemoryBytes();
  EXPECT_GT(empty, 0u);  // the key index, sized for every page
  // 100 entries of 104 bytes (key and digest inline), 64-byte aligned.
  constexpr uint64_t kChunk = (100 * 104 + 63) / 64 * 64;
  Publish("a", 1);
  EXPECT_EQ(empty + kChunk, cache_->MemoryBytes());
  Publish("b", 99);
  EXPECT_EQ(empty + kChunk, cache_->MemoryBytes());
}

// Entries live in chunks of 65,536 pages, made at a chunk's first publish.
TEST(PageCacheChunkTest, PagesOfEveryChunkAndTheLastPartialOne) {
  constexpr uint64_t kPages = 3 * 65536 + 5;
  std::unique_ptr<PageCache> cache = MakeCache(kPages);
  const std::vector<uint64_t> pages = {65535, 65536, kPages - 1, 0};
  for (uint64_t p : pages) {
    ASSERT_OK(cache->Publish("ns", absl::StrCat("k", p), "", p));
  }
  EXPECT_FALSE(cache->IsCached(2 * 65536));  // a chunk never made
  EXPECT_FALSE(cache->IsCached(kPages));
  EXPECT_EQ(0u, cache->References(2 * 65536 + 1));
  EXPECT_EQ(4u, cache->cached_pages());
  absl::StatusOr<LookupResult> r = cache->Lookup(
      "ns", {"k65535", "k65536", absl::StrCat("k", kPages - 1), "k0"}, true,
      kAlice);
  ASSERT_OK(r);
  EXPECT_EQ(pages, r->pages);
  EXPECT_OK(cache->CheckConsistency());
  EXPECT_EQ(4u, cache->ReleaseAll(kAlice));
  EXPECT_EQ(4u, cache->Evict(10).size());
  EXPECT_OK(cache->CheckConsistency());
}

TEST(PageCacheNamespaceTest, NamespacesRunOutWithResourceExhausted) {
  std::unique_ptr<PageCache> cache = MakeCache(kMaxCacheNamespaces + 1);
  for (uint64_t i = 0; i < kMaxCacheNamespaces; ++i) {
    ASSERT_OK(cache->Publish(absl::StrCat("ns", i), "k", "", i));
  }
  EXPECT_ERROR(ResourceExhausted,
               cache->Publish("one more", "k", "", kMaxCacheNamespaces));
  EXPECT_FALSE(cache->IsCached(kMaxCacheNamespaces));
  EXPECT_OK(cache->Publish("ns7", "k2", "", kMaxCacheNamespaces));
  EXPECT_EQ(kMaxCacheNamespaces, cache->Stats().namespaces.size());
  EXPECT_OK(cache->CheckConsistency());
}

// Publishers, lookers (with and without references) and evictors at once,
// with a stand-in for the allocator: a free list that every page leaves when
// a publisher takes it (evicting when it is short, as Alloc will) and
// returns to when a background evictor evicts it or a publish does not keep
// it. While a looker holds a reference, the page must stay
// cached, not free, and hold the key it was found under.
class PageCacheConcurrencyTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kPages = 512;
  static constexpr int kChains = 96;  // 96 x 8 keys > 512 pages: pressure
  static constexpr int kChainLength = 8;
  static constexpr int kIterations = 20000;

  static std::string Key(int chain, int i) {
    return absl::StrCat("chain", chain, "/", i);
  }
  static uint64_t KeyId(int chain, int i) {
    return static_cast<uint64_t>(chain) * kChainLength + i + 1;
  }

  std::vector<uint64_t> TakePages(size_t n) {
    absl::MutexLock lock(&free_mu_);
    std::vector<uint64_t> pages;
    while (pages.size() < n && !free_.empty()) {
      pages.push_back(free_.back());
      free_.pop_back();
      is_free_[pages.back()].store(false);
    }
    return pages;
  }
  void GivePages(const std::vector<uint64_t>& pages) {
    absl::MutexLock lock(&free_mu_);
    for (uint64_t p : pages) {
      is_free_[p].store(true);
      free_.push_back(p);
    }
  }

  void Publisher(int seed) {
    std::mt19937 rng(seed);
    for (int it = 0; it < kIterations; ++it) {
      const int chain = static_cast<int>(rng() % kChains);
      const int length = 1 + static_cast<int>(rng() % kChainLength);
      std::vector<uint64_t> pages = TakePages(length);
      if (pages.size() < static_cast<size_t>(length)) {
        // As Alloc will: evict what is missing, and take those pages.
        for (uint64_t p : cache_->Evict(length - pages.size())) {
          ASSERT_FALSE(is_free_[p].load());
          ASSERT_FALSE(cache_->IsCached(p));
          pages.push_back(p);
        }
      }
      std::vector<std::string> keys;
      std::vector<PublishItem> items;
      for (size_t i = 0; i < pages.size(); ++i) {
        keys.push_back(Key(chain, static_cast<int>(i)));
        key_of_page_[pages[i]].store(KeyId(chain, static_cast<int>(i)));
      }
      for (size_t i = 0; i < pages.size(); ++i) {
        items.push_back(
            {keys[i],
             i == 0 ? absl::string_view() : absl::string_view(keys[i - 1]),
             pages[i]});
      }
      const bool acquire = rng() % 4 == 0;
      const OwnerTag session = static_cast<OwnerTag>(100 + seed);
      absl::StatusOr<std::vector<PublishResult>> r =
          cache_->Publish("ns", items, acquire, session);
      ASSERT_OK(r);
      std::vector<uint64_t> kept, back;
      for (size_t i = 0; i < pages.size(); ++i) {
        if ((*r)[i].outcome == PublishOutcome::kCached) {
          kept.push_back(pages[i]);
        } else {
          ASSERT_EQ(PublishOutcome::kAlreadyCached, (*r)[i].outcome);
          back.push_back(pages[i]);
          if (acquire) kept.push_back((*r)[i].page);
        }
      }
      GivePages(back);
      if (acquire) {
        for (uint64_t p : kept) ASSERT_FALSE(is_free_[p].load());
        ASSERT_OK(cache_->Release(session, ToPageRuns(kept)));
      }
    }
  }

  void Looker(int seed) {
    std::mt19937 rng(seed);
    const OwnerTag session = static_cast<OwnerTag>(200 + seed);
    for (int it = 0; it < kIterations; ++it) {
      const int chain = static_cast<int>(rng() % kChains);
      std::vector<std::string> keys;
      for (int i = 0; i < kChainLength; ++i) keys.push_back(Key(chain, i));
      std::vector<absl::string_view> views(keys.begin(), keys.end());
      const bool acquire = rng() % 2 == 0;
      absl::StatusOr<LookupResult> r =
          cache_->Lookup("ns", views, acquire, session);
      ASSERT_OK(r);
      ASSERT_EQ(r->hits, r->pages.size());
      if (!acquire) continue;
      for (size_t i = 0; i < r->pages.size(); ++i) {
        const uint64_t p = r->pages[i];
        ASSERT_FALSE(is_free_[p].load()) << "page " << p;
        ASSERT_TRUE(cache_->IsCached(p));
        ASSERT_GE(cache_->References(p), 1u);
        ASSERT_EQ(KeyId(chain, static_cast<int>(i)), key_of_page_[p].load());
      }
      if (rng() % 3 == 0) {
        cache_->ReleaseAll(session);
      } else if (!r->pages.empty()) {
        ASSERT_OK(cache_->Release(session, ToPageRuns(r->pages)));
      }
    }
    cache_->ReleaseAll(session);
  }

  // Keeps some pages free (background eviction at a watermark) until the
  // publishers are done.
  void Evictor() {
    for (uint64_t round = 0; publishers_left_.load() > 0; ++round) {
      if (FreePages() >= kPages / 8) {
        std::this_thread::yield();
        continue;
      }
      std::vector<uint64_t> pages = cache_->Evict(16);
      for (uint64_t p : pages) {
        ASSERT_FALSE(is_free_[p].load());
        ASSERT_FALSE(cache_->IsCached(p));
      }
      GivePages(pages);
      if (round % 64 == 0) ASSERT_OK(cache_->CheckConsistency());
    }
  }

  uint64_t FreePages() {
    absl::MutexLock lock(&free_mu_);
    return free_.size();
  }

  std::unique_ptr<PageCache> cache_ = MakeCache(kPages);
  std::atomic<int> publishers_left_{0};
  absl::Mutex free_mu_;
  std::vector<uint64_t> free_ ABSL_GUARDED_BY(free_mu_);
  std::vector<std::atomic<bool>> is_free_ =
      std::vector<std::atomic<bool>>(kPages);
  std::vector<std::atomic<uint64_t>> key_of_page_ =
      std::vector<std::atomic<uint64_t>>(kPages);
};

TEST_F(PageCacheConcurrencyTest, InvariantsHoldUnderConcurrentUse) {
  {
    absl::MutexLock lock(&free_mu_);
    for (uint64_t p = 0; p < kPages; ++p) {
      free_.push_back(p);
      is_free_[p].store(true);
    }
  }
  std::vector<std::thread> threads;
  publishers_left_.store(2);
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([this, i] {
      Publisher(i);
      publishers_left_.fetch_sub(1);
    });
    threads.emplace_back([this, i] { Looker(i); });
  }
  threads.emplace_back([this] { Evictor(); });
  for (std::thread& t : threads) t.join();

  ASSERT_OK(cache_->CheckConsistency());
  EXPECT_EQ(0u, cache_->referenced_pages());
  const CacheStats stats = cache_->Stats();
  EXPECT_GT(stats.total.hits, 0u);
  EXPECT_GT(stats.total.evictions, 0u);
  EXPECT_GT(stats.total.already_cached, 0u);
  // Every page is either free or cached, never both.
  uint64_t free_pages = 0;
  for (uint64_t p = 0; p < kPages; ++p) {
    EXPECT_NE(is_free_[p].load(), cache_->IsCached(p)) << "page " << p;
    free_pages += is_free_[p].load();
  }
  EXPECT_EQ(kPages, free_pages + cache_->cached_pages());
  // With no references left, everything can be evicted.
  const uint64_t cached = cache_->cached_pages();
  EXPECT_EQ(cached, cache_->Evict(kPages).size());
  EXPECT_EQ(0u, cache_->cached_pages());
  ASSERT_OK(cache_->CheckConsistency());
}

// References are heap: charged to the budget in steps as they come, given
// back (keeping one step) as they go, refused when the budget refuses.
TEST(PageCacheChargeTest, ReferencesAreChargedAndRefusedPastTheBudget) {
  constexpr uint64_t kStep = PageCache::kChargeStep;
  constexpr uint64_t kStepBytes = kStep * PageCache::kReferenceBytes;
  uint64_t charged = 0;
  uint64_t limit = 2 * kStepBytes;
  {
    std::unique_ptr<PageCache> cache = MakeCache(4);
    cache->set_reference_charge(PageCache::ReferenceCharge{
        [&](uint64_t bytes) {
          if (charged + bytes > limit) {
            return absl::ResourceExhaustedError("budget");
          }
          charged += bytes;
          return absl::OkStatus();
        },
        [&](uint64_t bytes) { charged -= bytes; }});
    ASSERT_OK(cache->Publish("ns", "k", "", 0));
    // One reference: one step charged.
    std::vector<absl::string_view> one = {"k"};
    ASSERT_OK(cache->Lookup("ns", one, true, kAlice));
    EXPECT_EQ(charged, kStepBytes);
    EXPECT_EQ(cache->charged_references(), kStep);
    // The same key listed kStep + 1 times: a second step.
    std::vector<absl::string_view> many(kStep + 1, "k");
    ASSERT_OK(cache->Lookup("ns", many, true, kBob));
    EXPECT_EQ(charged, 2 * kStepBytes);
    // A third step is past the budget: refused, nothing taken or counted.
    const uint64_t held = cache->ReferencesHeldBy(kAlice);
    std::vector<absl::string_view> more(kStep, "k");
    EXPECT_ERROR(ResourceExhausted, cache->Lookup("ns", more, true, kAlice));
    EXPECT_EQ(cache->ReferencesHeldBy(kAlice), held);
    EXPECT_EQ(charged, 2 * kStepBytes);
    EXPECT_EQ(cache->References(0), kStep + 2);
    // Bob lets go: one step of slack stays charged.
    EXPECT_EQ(cache->ReleaseAll(kBob), kStep + 1);
    EXPECT_EQ(charged, 2 * kStepBytes);  // 1 reference: 1 step + 1 slack
    EXPECT_EQ(cache->ReleaseAll(kAlice), 1u);
    EXPECT_EQ(charged, kStepBytes);
    EXPECT_OK(cache->CheckConsistency());
  }
  EXPECT_EQ(charged, 0u);  // the cache gave back what it held
}

}  // namespace
}  // namespace hostkv
