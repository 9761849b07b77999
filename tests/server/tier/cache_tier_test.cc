// The storage tier's policy over the request layer and a real FileTier: two
// pools of one geometry stand for two nodes' pools (the tier key depends on
// the geometry, not the pool), so that pages one publishes and the
// write-behind stores are found by the other's lookups, brought into its
// free pages byte-exact, and counted.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/service/request_handler.h"
#include "server/tier/cache_tier.h"
#include "server/tier/file_tier.h"
#include "tests/server/handler_fixture.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

// A file tier that can be made full (puts refused) or down (nothing
// answers), as a Redis at maxmemory or a killed one would be.
class SwitchableTier : public PageTier {
 public:
  enum Mode { kOk, kFull, kDown };
  explicit SwitchableTier(std::unique_ptr<PageTier> inner) : inner_(std::move(inner)) {}
  std::string Describe() const override { return inner_->Describe(); }
  std::vector<absl::Status> Put(absl::Span<const TierKey> keys,
                                absl::Span<const absl::string_view> values) override {
    if (mode == kDown) ++calls_while_down;
    if (mode != kOk) {
      return std::vector<absl::Status>(
          keys.size(), mode == kFull ? absl::ResourceExhaustedError("OOM")
                                     : absl::UnavailableError("down"));
    }
    return inner_->Put(keys, values);
  }
  std::vector<absl::StatusOr<std::string>> Get(absl::Span<const TierKey> keys) override {
    if (mode == kDown) {
      // The health probe's keys (tier_health.cc) are not the cache's calls.
      if (keys.empty() || keys[0].name_space != "hostkv.probe") ++calls_while_down;
      return std::vector<absl::StatusOr<std::string>>(keys.size(),
                                                      absl::UnavailableError("down"));
    }
    return inner_->Get(keys);
  }
  absl::StatusOr<uint64_t> CountPrefix(absl::Span<const TierKey> keys) override {
    if (mode == kDown) return absl::UnavailableError("down");
    return inner_->CountPrefix(keys);
  }
  absl::Status Delete(absl::Span<const TierKey> keys) override {
    return inner_->Delete(keys);
  }
  std::atomic<Mode> mode{kOk};
  // Puts and gets (not the health probe's) asked of it while down.
  std::atomic<int> calls_while_down{0};

 private:
  std::unique_ptr<PageTier> inner_;
};

// Pools any user may use (a test looks up as another uid).
RequestLimits AnyUserLimits() {
  RequestLimits limits{1 << 16, Prefix()};
  limits.pool_access = v1::POOL_ACCESS_ANY;
  return limits;
}

class CacheTierTest : public HandlerFixture {
 protected:
  CacheTierTest() : HandlerFixture(AnyUserLimits()) {
    char pattern[] = "/tmp/hostkv-cache-tier-XXXXXX";
    dir_ = mkdtemp(pattern);
  }
  ~CacheTierTest() override {
    handler_.set_tier(nullptr);
    tier_.reset();
    std::filesystem::remove_all(dir_);
  }

  void UseFileTier(TierConfig config = {}) {
    config.url = "file:" + dir_;
    config.fsync = false;
    config.probe_interval = absl::Milliseconds(50);
    auto store = FileTier::Open(dir_, FileTierOptions{.fsync = false});
    ASSERT_OK(store);
    tier_ = std::make_unique<CacheTier>(config, *std::move(store));
    handler_.set_tier(tier_.get());
  }

  // Over a SwitchableTier on the test's directory, in `mode` from the
  // start; returns it.
  SwitchableTier* UseSwitchableTier(SwitchableTier::Mode mode = SwitchableTier::kOk) {
    auto files = FileTier::Open(dir_, FileTierOptions{.fsync = false});
    EXPECT_OK(files);
    auto store = std::make_unique<SwitchableTier>(*std::move(files));
    SwitchableTier* raw = store.get();
    raw->mode = mode;
    TierConfig config;
    config.url = "file:" + dir_;
    config.probe_interval = absl::Milliseconds(20);
    tier_ = std::make_unique<CacheTier>(config, std::move(store));
    handler_.set_tier(tier_.get());
    tier_->health().SetObserver([this](bool serving) {
      absl::MutexLock lock(&changes_mu_);  // called from the prober's thread
      health_changes_.push_back(serving);
    });
    return raw;
  }

  bool WaitServing(bool serving) {
    for (int i = 0; i < 500 && tier_->health().serving() != serving; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return tier_->health().serving() == serving;
  }

  void CreatePools() {
    CreatePool("p");
    CreatePool("q");
  }

  // Publishes keys k<first>.. on pages of pool `pool` written with bytes
  // derived from each key; returns the pages.
  std::vector<uint64_t> PublishFilled(const SessionId& s, const std::string& pool,
                                      int first, int count) {
    v1::AllocRequest alloc;
    alloc.set_session_id(s);
    alloc.set_pool(pool);
    alloc.set_num_tokens(count * kPageSize);
    auto pages = handler_.Alloc(alloc);
    EXPECT_OK(pages);
    std::vector<uint64_t> flat;
    for (const auto& run : pages->pages()) {
      for (uint64_t p = run.first_page(); p < run.first_page() + run.num_pages(); ++p) {
        flat.push_back(p);
      }
    }
    v1::PublishRequest publish;
    publish.set_session_id(s);
    publish.set_pool(pool);
    publish.set_namespace_("model-a");
    for (int i = 0; i < count; ++i) {
      v1::WritePagesRequest write;
      write.set_session_id(s);
      write.set_pool(pool);
      auto* run = write.add_pages();
      run->set_first_page(flat[i]);
      run->set_num_pages(1);
      write.set_data(PageBytes(first + i));
      EXPECT_OK(handler_.WritePages(write));
      auto* item = publish.add_items();
      item->set_key(absl::StrCat("k", first + i));
      item->set_page(flat[i]);
      if (i > 0) item->set_parent_key(absl::StrCat("k", first + i - 1));
    }
    EXPECT_OK(handler_.Publish(publish));
    return flat;
  }

  std::string PageBytes(int key) {
    std::string bytes(Pool("p").geometry().page_bytes(), '\0');
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>(key * 131 + i * 7 + 3);
    }
    return bytes;
  }

  HostPool& Pool(const std::string& name) { return **pools_.Get(name); }

  absl::StatusOr<v1::LookupResponse> LookupIn(const SessionId& s,
                                              const std::string& pool, int first,
                                              int count, bool acquire = true,
                                              absl::Time deadline = absl::InfiniteFuture()) {
    v1::LookupRequest request;
    request.set_session_id(s);
    request.set_pool(pool);
    request.set_namespace_("model-a");
    request.set_acquire(acquire);
    for (int i = 0; i < count; ++i) request.add_keys(absl::StrCat("k", first + i));
    return handler_.Lookup(request, deadline);
  }

  std::string ReadPage(const SessionId& s, const std::string& pool, uint64_t page) {
    v1::ReadPagesRequest request;
    request.set_session_id(s);
    request.set_pool(pool);
    auto* run = request.add_pages();
    run->set_first_page(page);
    run->set_num_pages(1);
    auto r = handler_.ReadPages(request);
    EXPECT_OK(r);
    return r.ok() ? r->data() : "";
  }

  std::vector<uint64_t> Pages(const v1::LookupResponse& r) {
    std::vector<uint64_t> out;
    for (const auto& run : r.pages()) {
      for (uint64_t p = run.first_page(); p < run.first_page() + run.num_pages(); ++p) {
        out.push_back(p);
      }
    }
    return out;
  }

  std::string dir_;
  std::unique_ptr<CacheTier> tier_;
  // What the health entry was told.
  std::vector<bool> HealthChanges() {
    absl::MutexLock lock(&changes_mu_);
    return health_changes_;
  }
  absl::Mutex changes_mu_;
  std::vector<bool> health_changes_ ABSL_GUARDED_BY(changes_mu_);
};

TEST_F(CacheTierTest, PublishedPagesReachTheOtherPoolByteExact) {
  UseFileTier();
  CreatePools();
  const SessionId writer = OpenSession();
  PublishFilled(writer, "p", 0, 4);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  TierCountersSnapshot c = tier_->Counters();
  EXPECT_EQ(c.written, 4u);
  EXPECT_EQ(c.written_bytes, 4 * (Pool("p").geometry().page_bytes() + 32));
  EXPECT_EQ(c.write_queue_pages, 0u);

  const SessionId reader = OpenSession();
  auto found = LookupIn(reader, "q", 0, 6);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits(), 4u);  // k4, k5 were never published
  const std::vector<uint64_t> pages = Pages(*found);
  ASSERT_EQ(pages.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(ReadPage(reader, "q", pages[i]), PageBytes(i)) << "key k" << i;
  }
  c = tier_->Counters();
  EXPECT_EQ(c.read_hits, 4u);
  EXPECT_EQ(c.read_misses, 2u);
  EXPECT_EQ(c.read_corrupt, 0u);
  // The cache counts the hits the tier brought, and only the final misses.
  const CacheCounters q = Pool("q").cache().CountersOf("model-a");
  EXPECT_EQ(q.hits, 4u);
  EXPECT_EQ(q.misses, 2u);
  EXPECT_EQ(q.cached, 4u);
  EXPECT_EQ(q.referenced, 4u);  // acquired by the lookup
  ASSERT_OK(Pool("q").cache().CheckConsistency());
  // A second lookup is served from host memory.
  auto again = LookupIn(reader, "q", 0, 4, false);
  ASSERT_OK(again);
  EXPECT_EQ(again->hits(), 4u);
  EXPECT_EQ(tier_->Counters().read_hits, 4u);
}

TEST_F(CacheTierTest, ACorruptedOrForeignValueIsAMissNeverServed) {
  UseFileTier();
  CreatePools();
  const SessionId writer = OpenSession();
  PublishFilled(writer, "p", 0, 3);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  // Flip one page byte of k1's value.
  auto* files = dynamic_cast<FileTier*>(&tier_->store());
  ASSERT_NE(files, nullptr);
  const std::string path = files->PathOf(
      ToTierKey(PoolFingerprint(Pool("p")),
                *Pool("p").namespaces().TierScopeOf("model-a"), "model-a", "k1"));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    f.seekg(40);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x01;
    f.seekp(40);
    f.write(&byte, 1);
  }
  const SessionId reader = OpenSession();
  auto found = LookupIn(reader, "q", 0, 3);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits(), 1u);  // k0 only: k1 is refused, k2 is past the gap
  EXPECT_EQ(ReadPage(reader, "q", Pages(*found)[0]), PageBytes(0));
  const TierCountersSnapshot c = tier_->Counters();
  EXPECT_EQ(c.read_hits, 1u);
  EXPECT_EQ(c.read_corrupt, 1u);
  EXPECT_EQ(c.read_misses, 1u);
  EXPECT_EQ(Pool("q").cache().cached_pages(), 1u);
  // The damaged value is gone, so that the next publisher of k1 stores it
  // again (the write-behind skips keys the store has).
  EXPECT_FALSE(std::filesystem::exists(path));
  PublishFilled(reader, "q", 1, 1);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_TRUE(std::filesystem::exists(path));
  CreatePool("r");
  auto healed = LookupIn(reader, "r", 0, 3, false);
  ASSERT_OK(healed);
  EXPECT_EQ(healed->hits(), 3u);
}

TEST_F(CacheTierTest, PagesTheStoreHasAreNotWrittenAgain) {
  UseFileTier();
  CreatePools();
  const SessionId a = OpenSession();
  PublishFilled(a, "p", 0, 4);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  ASSERT_EQ(tier_->Counters().written, 4u);
  // Another "node" publishes the same prompt, and two more pages.
  const SessionId b = OpenSession();
  PublishFilled(b, "q", 0, 6);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  const TierCountersSnapshot c = tier_->Counters();
  EXPECT_EQ(c.already_stored, 4u);
  EXPECT_EQ(c.written, 6u);
}

TEST_F(CacheTierTest, ATruncatedFileIsAMiss) {
  UseFileTier();
  CreatePools();
  const SessionId writer = OpenSession();
  PublishFilled(writer, "p", 0, 2);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  auto* files = dynamic_cast<FileTier*>(&tier_->store());
  const std::string path = files->PathOf(
      ToTierKey(PoolFingerprint(Pool("p")),
                *Pool("p").namespaces().TierScopeOf("model-a"), "model-a", "k0"));
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  const SessionId reader = OpenSession();
  auto found = LookupIn(reader, "q", 0, 2);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits(), 0u);
  EXPECT_EQ(tier_->Counters().read_corrupt, 1u);
  EXPECT_EQ(Pool("q").cache().cached_pages(), 0u);
  EXPECT_EQ(Pool("q").allocator().free_pages(), Pool("q").allocator().num_pages());
}

TEST_F(CacheTierTest, APoolOfAnotherGeometryDoesNotSeeThePages) {
  UseFileTier();
  CreatePool("p");
  v1::CreatePoolRequest create;
  *create.mutable_spec() = Spec("r");
  create.mutable_spec()->mutable_geometry()->set_dtype(v1::DTYPE_FP16);
  create.set_session_id(OpenSession());
  ASSERT_OK(handler_.CreatePool(create));
  const SessionId writer = OpenSession();
  PublishFilled(writer, "p", 0, 2);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  auto found = LookupIn(writer, "r", 0, 2);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits(), 0u);
  EXPECT_EQ(tier_->Counters().read_misses, 2u);  // other keys: not found
}

TEST_F(CacheTierTest, FetchesEvictColdCachedPagesWhenFreeOnesAreShort) {
  UseFileTier();
  CreatePools();
  const SessionId writer = OpenSession();
  PublishFilled(writer, "p", 0, 6);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  // Pool q: every page cached, in another namespace, unreferenced.
  const SessionId filler = OpenSession();
  const uint64_t total = Pool("q").allocator().num_pages();
  v1::AllocRequest alloc;
  alloc.set_session_id(filler);
  alloc.set_pool("q");
  alloc.set_num_tokens(total * kPageSize);
  auto pages = handler_.Alloc(alloc);
  ASSERT_OK(pages);
  v1::PublishRequest publish;
  publish.set_session_id(filler);
  publish.set_pool("q");
  publish.set_namespace_("cold");
  uint64_t n = 0;
  for (const auto& run : pages->pages()) {
    for (uint64_t p = run.first_page(); p < run.first_page() + run.num_pages(); ++p) {
      auto* item = publish.add_items();
      item->set_key(absl::StrCat("cold", n++));
      item->set_page(p);
    }
  }
  ASSERT_OK(handler_.Publish(publish));
  ASSERT_EQ(Pool("q").allocator().free_pages(), 0u);
  auto found = LookupIn(writer, "q", 0, 6);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(ReadPage(writer, "q", Pages(*found)[i]), PageBytes(i));
  }
  EXPECT_EQ(Pool("q").cache().CountersOf("cold").evictions, 6u);
  EXPECT_EQ(tier_->Counters().fetch_no_space, 0u);
  ASSERT_OK(Pool("q").cache().CheckConsistency());
}

TEST_F(CacheTierTest, FetchesNeverTakeASessionsPages) {
  UseFileTier();
  CreatePools();
  const SessionId writer = OpenSession();
  PublishFilled(writer, "p", 0, 6);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  // Pool q: all but 2 pages held by a session.
  const SessionId hog = OpenSession();
  const uint64_t total = Pool("q").allocator().num_pages();
  v1::AllocRequest alloc;
  alloc.set_session_id(hog);
  alloc.set_pool("q");
  alloc.set_num_tokens((total - 2) * kPageSize);
  ASSERT_OK(handler_.Alloc(alloc));
  auto found = LookupIn(writer, "q", 0, 6, false);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits(), 2u);
  const TierCountersSnapshot c = tier_->Counters();
  EXPECT_EQ(c.read_hits, 2u);
  EXPECT_EQ(c.fetch_no_space, 4u);
}

TEST_F(CacheTierTest, WriteAfterHitsWritesOnTheNthHitOnly) {
  TierConfig config;
  config.write_after_hits = 2;
  UseFileTier(config);
  CreatePools();
  const SessionId s = OpenSession();
  PublishFilled(s, "p", 0, 2);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_EQ(tier_->Counters().written, 0u);
  ASSERT_OK(LookupIn(s, "p", 0, 1, false));  // k0: 1 hit
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_EQ(tier_->Counters().written, 0u);
  ASSERT_OK(LookupIn(s, "p", 0, 2, false));  // k0: 2 hits, k1: 1
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_EQ(tier_->Counters().written, 1u);
  ASSERT_OK(LookupIn(s, "p", 0, 2, false));  // k0: written already; k1: 2
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_EQ(tier_->Counters().written, 2u);
}

TEST_F(CacheTierTest, AFullWriteQueueDropsAndCounts) {
  TierConfig config;
  config.write_queue_bytes = 0;  // nothing fits
  UseFileTier(config);
  CreatePools();
  const SessionId s = OpenSession();
  PublishFilled(s, "p", 0, 3);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  const TierCountersSnapshot c = tier_->Counters();
  EXPECT_EQ(c.written, 0u);
  EXPECT_EQ(c.writes_dropped, 3u);
}

TEST_F(CacheTierTest, ReadOnlyNeverWrites) {
  TierConfig config;
  config.read_only = true;
  UseFileTier(config);
  CreatePools();
  const SessionId s = OpenSession();
  PublishFilled(s, "p", 0, 3);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_EQ(tier_->Counters().written, 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(CacheTierTest, ADownTierIsNotAskedAndHostOperationsGoOn) {
  SwitchableTier* down = UseSwitchableTier(SwitchableTier::kDown);
  EXPECT_FALSE(tier_->health().up());
  CreatePools();
  const SessionId s = OpenSession();
  PublishFilled(s, "p", 0, 2);
  auto found = LookupIn(s, "p", 0, 4);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits(), 2u);
  ASSERT_OK(LookupIn(s, "q", 0, 4));
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_EQ(down->calls_while_down.load(), 0);  // neither written to nor read from
  const TierCountersSnapshot c = tier_->Counters();
  EXPECT_EQ(c.writes_dropped, 2u);
  EXPECT_EQ(Pool("q").cache().CountersOf("model-a").misses, 0u);
  EXPECT_EQ(Pool("q").cache().Stats().total.misses, 4u);
  EXPECT_EQ(Pool("p").cache().CountersOf("model-a").misses, 2u);
}

TEST_F(CacheTierTest, AFullTierIsNotServingStillReadAndTakesWritesAgain) {
  SwitchableTier* store = UseSwitchableTier();
  CreatePools();
  const SessionId s = OpenSession();
  PublishFilled(s, "p", 0, 2);  // written while it has room
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  ASSERT_EQ(tier_->Counters().written, 2u);
  store->mode = SwitchableTier::kFull;
  PublishFilled(s, "p", 2, 2);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_FALSE(tier_->health().serving());
  EXPECT_TRUE(tier_->health().up());
  EXPECT_GE(tier_->Counters().write_failures, 1u);
  // Reads go on: pool q finds what was written before it filled up.
  auto found = LookupIn(s, "q", 0, 4, false);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits(), 2u);
  // Room again: the next write after the retry interval succeeds.
  store->mode = SwitchableTier::kOk;
  absl::SleepFor(absl::Milliseconds(40));
  PublishFilled(s, "p", 4, 1);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_TRUE(tier_->health().serving());
  EXPECT_EQ(tier_->Counters().written, 3u);
  EXPECT_EQ(HealthChanges(), (std::vector<bool>{true, false, true}));
}

TEST_F(CacheTierTest, ATierThatWentDownIsSeenByTheProberAndComesBackByItself) {
  SwitchableTier* store = UseSwitchableTier();
  CreatePools();
  const SessionId s = OpenSession();
  ASSERT_TRUE(tier_->health().serving());
  store->mode = SwitchableTier::kDown;
  ASSERT_TRUE(WaitServing(false));  // no traffic needed: the prober saw it
  PublishFilled(s, "p", 0, 2);      // host operations go on
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_EQ(tier_->Counters().writes_dropped, 2u);
  auto found = LookupIn(s, "p", 0, 2, false);
  ASSERT_OK(found);
  EXPECT_EQ(found->hits(), 2u);
  store->mode = SwitchableTier::kOk;
  ASSERT_TRUE(WaitServing(true));
  PublishFilled(s, "p", 2, 2);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  EXPECT_EQ(tier_->Counters().written, 2u);
  auto other = LookupIn(s, "q", 2, 2, false);
  ASSERT_OK(other);
  EXPECT_EQ(other->hits(), 2u);
  EXPECT_EQ(HealthChanges(), (std::vector<bool>{true, false, true}));
}

TEST_F(CacheTierTest, ALookupWaitsNoLongerThanItsDeadline) {
  TierConfig config;
  config.fetch_wait = absl::ZeroDuration();  // never wait
  UseFileTier(config);
  CreatePools();
  const SessionId s = OpenSession();
  PublishFilled(s, "p", 0, 3);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  auto found = LookupIn(s, "q", 0, 3, false);
  ASSERT_OK(found);
  // Whatever arrived in time is a hit; the rest arrives for the next lookup.
  // (The fetch counts its hits just after it publishes the pages.)
  for (int i = 0; i < 200 && (Pool("q").cache().cached_pages() < 3 ||
                              tier_->Counters().read_hits < 3);
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Pool("q").cache().cached_pages(), 3u);
  auto later = LookupIn(s, "q", 0, 3, false);
  ASSERT_OK(later);
  EXPECT_EQ(later->hits(), 3u);
  const TierCountersSnapshot c = tier_->Counters();
  EXPECT_EQ(c.read_hits, 3u);
  // A lookup that answered with fewer hits stopped waiting (a late fetch);
  // one whose fetch ended just after the wait may still see every page.
  EXPECT_LE(c.fetches_late, 1u);
  if (found->hits() < 3) EXPECT_EQ(c.fetches_late, 1u);
}

// Namespaces are the daemon's, not a pool's: another user's lookup in
// another pool fetches nothing of the owner's values. (A fetch that brings
// pages claims the namespace for its caller: tests/e2e/tenants_cache_test.)
TEST_F(CacheTierTest, AnotherUsersLookupInAnotherPoolFetchesNothing) {
  UseFileTier();
  CreatePools();
  const SessionId writer = OpenSession();
  PublishFilled(writer, "p", 0, 2);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  // Another user looks up keys the tier does not have: nothing claimed.
  const uint32_t other_uid = getuid() + 1000;
  const SessionId stranger = OpenSession(true, other_uid);
  v1::LookupRequest nothing;
  nothing.set_session_id(stranger);
  nothing.set_pool("q");
  nothing.set_namespace_("model-b");
  nothing.add_keys("absent");
  auto missed = handler_.Lookup(nothing);
  ASSERT_OK(missed);
  EXPECT_EQ(missed->hits(), 0u);
  EXPECT_FALSE(Pool("q").namespaces().OwnerOf("model-b").has_value());
  // The writer's namespace is the writer's in pool "q" too.
  const uint64_t reads = tier_->Counters().read_hits;
  auto refused = LookupIn(stranger, "q", 0, 2, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied)
      << refused.status();
  EXPECT_EQ(tier_->Counters().read_hits, reads);
  EXPECT_EQ(Pool("q").cache().cached_pages(), 0u);
  auto owner = Pool("q").namespaces().OwnerOf("model-a");
  ASSERT_TRUE(owner.has_value());
  EXPECT_EQ(owner->uid, getuid());
}

TEST_F(CacheTierTest, GetPoolStatsReportsTheTier) {
  UseFileTier();
  CreatePools();
  const SessionId s = OpenSession();
  PublishFilled(s, "p", 0, 2);
  ASSERT_TRUE(tier_->writer().Flush(absl::Seconds(10)));
  ASSERT_OK(LookupIn(s, "q", 0, 3));
  auto stats = handler_.GetPoolStats(v1::GetPoolStatsRequest());
  ASSERT_OK(stats);
  ASSERT_TRUE(stats->has_tier());
  EXPECT_EQ(stats->tier().url(), "file:" + dir_);
  EXPECT_TRUE(stats->tier().serving());
  EXPECT_EQ(stats->tier().written(), 2u);
  EXPECT_EQ(stats->tier().read_hits(), 2u);
  EXPECT_EQ(stats->tier().read_misses(), 1u);
  EXPECT_EQ(stats->tier().get_calls(), 1u);
  EXPECT_GE(stats->tier().put_calls(), 1u);
}

}  // namespace
}  // namespace hostkv
