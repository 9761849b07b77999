#include "server/pool/slot_allocator.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/cache/page_cache.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr OwnerTag kAlice = 1;
constexpr OwnerTag kBob = 2;

class SlotAllocatorTest : public ::testing::Test {
 protected:
  std::vector<PageRun> Alloc(uint64_t pages, OwnerTag owner) {
    absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(pages, owner);
    EXPECT_OK(runs);
    return runs.ok() ? *runs : std::vector<PageRun>{};
  }
  SlotAllocator alloc_{100};
};

TEST_F(SlotAllocatorTest, AllocatesLowestPagesAsOneRun) {
  EXPECT_EQ((std::vector<PageRun>{{0, 10}}), Alloc(10, kAlice));
  EXPECT_EQ((std::vector<PageRun>{{10, 5}}), Alloc(5, kBob));
  EXPECT_EQ(85u, alloc_.free_pages());
  EXPECT_EQ(10u, alloc_.pages_owned_by(kAlice));
  EXPECT_EQ(5u, alloc_.pages_owned_by(kBob));
}

TEST_F(SlotAllocatorTest, ReusesHolesAndReturnsSeveralRuns) {
  Alloc(10, kAlice);  // [0, 10)
  Alloc(10, kBob);    // [10, 20)
  ASSERT_OK(alloc_.Free({{2, 3}, {7, 2}}, kAlice));
  EXPECT_EQ((std::vector<PageRun>{{2, 3}, {7, 2}, {20, 1}}), Alloc(6, kBob));
}

TEST_F(SlotAllocatorTest, FullPoolIsResourceExhaustedAndNamesTheFreeCount) {
  Alloc(95, kAlice);
  absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(6, kBob);
  EXPECT_ERROR(ResourceExhausted, runs);
  EXPECT_NE(std::string::npos, runs.status().message().find("5 of 100 are free"));
  EXPECT_EQ(5u, alloc_.free_pages());  // nothing taken
}

TEST_F(SlotAllocatorTest, ZeroPagesIsInvalid) {
  EXPECT_ERROR(InvalidArgument, alloc_.Allocate(0, kAlice));
}

TEST_F(SlotAllocatorTest, DoubleFreeIsRefused) {
  Alloc(4, kAlice);
  ASSERT_OK(alloc_.Free({{0, 4}}, kAlice));
  EXPECT_ERROR(FailedPrecondition, alloc_.Free({{0, 4}}, kAlice));
  EXPECT_EQ(100u, alloc_.free_pages());
}

TEST_F(SlotAllocatorTest, ForeignFreeIsRefusedAndChangesNothing) {
  Alloc(4, kAlice);
  Alloc(4, kBob);
  absl::StatusOr<uint64_t> freed = alloc_.Free({{4, 4}}, kAlice);
  EXPECT_ERROR(FailedPrecondition, freed);
  EXPECT_NE(std::string::npos,
            freed.status().message().find("belongs to another session"));
  EXPECT_EQ(4u, alloc_.pages_owned_by(kBob));
  EXPECT_EQ(4u, alloc_.pages_owned_by(kAlice));
}

TEST_F(SlotAllocatorTest, PageListedTwiceFreesNothing) {
  Alloc(8, kAlice);
  EXPECT_ERROR(FailedPrecondition, alloc_.Free({{0, 4}, {3, 2}}, kAlice));
  EXPECT_EQ(8u, alloc_.pages_owned_by(kAlice));
  EXPECT_EQ(92u, alloc_.free_pages());
  ASSERT_OK(alloc_.CheckOwned({{0, 8}}, kAlice));  // all still Alice's
}

TEST_F(SlotAllocatorTest, OutOfRangeAndEmptyRunsAreInvalid) {
  Alloc(100, kAlice);
  EXPECT_ERROR(InvalidArgument, alloc_.Free({{99, 2}}, kAlice));
  EXPECT_ERROR(InvalidArgument, alloc_.Free({{100, 1}}, kAlice));
  EXPECT_ERROR(InvalidArgument, alloc_.Free({{UINT64_MAX, 2}}, kAlice));
  EXPECT_ERROR(InvalidArgument, alloc_.Free({{5, 0}}, kAlice));
  EXPECT_EQ(0u, alloc_.free_pages());
}

TEST_F(SlotAllocatorTest, FreedNeighboursCoalesceIntoOneExtent) {
  Alloc(100, kAlice);
  ASSERT_OK(alloc_.Free({{10, 10}}, kAlice));
  ASSERT_OK(alloc_.Free({{30, 10}}, kAlice));
  EXPECT_EQ(2u, alloc_.free_extents());
  ASSERT_OK(alloc_.Free({{20, 10}}, kAlice));
  EXPECT_EQ(1u, alloc_.free_extents());
  EXPECT_EQ((std::vector<PageRun>{{10, 30}}), Alloc(30, kBob));
}

TEST_F(SlotAllocatorTest, FreeAllOwnedByReleasesOnlyThatOwner) {
  Alloc(10, kAlice);
  Alloc(10, kBob);
  Alloc(10, kAlice);
  EXPECT_EQ(20u, alloc_.FreeAllOwnedBy(kAlice));
  EXPECT_EQ(0u, alloc_.pages_owned_by(kAlice));
  EXPECT_EQ(10u, alloc_.pages_owned_by(kBob));
  EXPECT_EQ(90u, alloc_.free_pages());
  EXPECT_EQ(0u, alloc_.FreeAllOwnedBy(kAlice));
  ASSERT_OK(alloc_.CheckOwned({{10, 10}}, kBob));
  EXPECT_ERROR(FailedPrecondition, alloc_.CheckOwned({{0, 1}}, kAlice));
}

TEST_F(SlotAllocatorTest, PinnedPagesCannotBeFreedReadOrHandedOver) {
  Alloc(4, kAlice);
  ASSERT_OK(alloc_.Pin({{1, 2}}, kAlice));
  ASSERT_OK(alloc_.Pin({{2, 1}}, kAlice));  // two copies touch page 2
  EXPECT_ERROR(FailedPrecondition, alloc_.Pin({{0, 1}}, kBob));
  EXPECT_ERROR(FailedPrecondition, alloc_.Free({{0, 4}}, kAlice));
  EXPECT_ERROR(FailedPrecondition, alloc_.CheckOwnedIdle({{2, 1}}, kAlice));
  EXPECT_ERROR(FailedPrecondition, alloc_.HandOver({{1, 1}}, kAlice, kBob));
  EXPECT_OK(alloc_.CheckOwned({{0, 4}}, kAlice));
  EXPECT_OK(alloc_.CheckOwnedIdle({{0, 1}, {3, 1}}, kAlice));
  alloc_.Unpin({{1, 2}});
  EXPECT_ERROR(FailedPrecondition, alloc_.Free({{2, 1}}, kAlice));
  alloc_.Unpin({{2, 1}});
  EXPECT_OK(alloc_.Free({{0, 4}}, kAlice));
}

TEST_F(SlotAllocatorTest, HandOverMovesPagesAndUsage) {
  Alloc(6, kAlice);
  auto moved = alloc_.HandOver({{0, 3}, {2, 2}}, kAlice, kBob);  // page 2 twice
  ASSERT_OK(moved);
  EXPECT_EQ(4u, *moved);
  EXPECT_EQ(2u, alloc_.pages_owned_by(kAlice));
  EXPECT_EQ(4u, alloc_.pages_owned_by(kBob));
  EXPECT_OK(alloc_.CheckOwned({{0, 4}}, kBob));
  EXPECT_ERROR(FailedPrecondition, alloc_.HandOver({{0, 1}}, kAlice, kBob));
}

TEST_F(SlotAllocatorTest, HandOverToItselfMovesNothing) {
  Alloc(3, kAlice);
  auto moved = alloc_.HandOver({{0, 3}}, kAlice, kAlice);
  ASSERT_OK(moved);
  EXPECT_EQ(0u, *moved);
  EXPECT_EQ(3u, alloc_.pages_owned_by(kAlice));
  EXPECT_EQ(3u, alloc_.FreeAllOwnedBy(kAlice));  // found by the fuzzer
  EXPECT_EQ(100u, alloc_.free_pages());
}

TEST_F(SlotAllocatorTest, UsageByOwnerCountsPages) {
  Alloc(3, kAlice);
  Alloc(7, kBob);
  const auto usage = alloc_.UsageByOwner();
  EXPECT_EQ(2u, usage.size());
  EXPECT_EQ(3u, usage.at(kAlice));
  EXPECT_EQ(7u, usage.at(kBob));
}

TEST(SlotAllocatorChurnTest, RandomAllocFreeKeepsCountsConsistent) {
  SlotAllocator alloc(1000);
  std::vector<std::vector<PageRun>> held;
  uint64_t seed = 12345, held_pages = 0;
  for (int i = 0; i < 5000; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    if ((seed >> 33) % 2 == 0 || held.empty()) {
      const uint64_t n = 1 + (seed >> 40) % 50;
      auto runs = alloc.Allocate(n, 1);
      if (runs.ok()) {
        held.push_back(*runs);
        held_pages += n;
      } else {
        EXPECT_ERROR(ResourceExhausted, runs);
      }
    } else {
      const size_t k = (seed >> 20) % held.size();
      auto freed = alloc.Free(held[k], 1);
      ASSERT_OK(freed);
      held_pages -= *freed;
      held.erase(held.begin() + k);
    }
    ASSERT_EQ(1000 - held_pages, alloc.free_pages());
  }
  for (const auto& runs : held) ASSERT_OK(alloc.Free(runs, 1));
  EXPECT_EQ(1000u, alloc.free_pages());
  EXPECT_EQ(1u, alloc.free_extents());
}

// With a ScrubFn: freed pages are zeroed (here: recorded) before reuse.
class ScrubbingAllocatorTest : public ::testing::Test {
 protected:
  std::vector<PageRun> Scrubbed() {
    absl::MutexLock lock(&mu_);
    return scrubbed_;
  }
  absl::Mutex mu_;
  std::vector<PageRun> scrubbed_ ABSL_GUARDED_BY(mu_);
  SlotAllocator alloc_{100, [this](const PageRun& run) {
                         absl::MutexLock lock(&mu_);
                         scrubbed_.push_back(run);
                       }};
};

TEST_F(ScrubbingAllocatorTest, FreedPagesScrubBeforeReuseAndCountAsFree) {
  ASSERT_OK(alloc_.Allocate(100, kAlice));
  ASSERT_OK(alloc_.Free({{10, 5}}, kAlice));
  EXPECT_EQ(95u, alloc_.FreeAllOwnedBy(kAlice));  // [0,10) and [15,100)
  EXPECT_EQ(100u, alloc_.scrubbing_pages());
  EXPECT_EQ(100u, alloc_.free_pages());
  const SlotAllocator::Occupancy occupancy = alloc_.Snapshot();
  EXPECT_EQ(100u, occupancy.free_pages);
  EXPECT_TRUE(occupancy.usage.empty());
  EXPECT_EQ(0u, alloc_.free_extents());  // nothing zeroed yet
  EXPECT_TRUE(Scrubbed().empty());       // Free itself zeroes nothing

  // Allocate zeroes (inline, no background thread here) what it takes,
  // the pages of the ended session first (FreeAllOwnedBy: nobody takes them
  // back), before Alice's own Free.
  absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(7, kBob);
  ASSERT_OK(runs);
  EXPECT_EQ((std::vector<PageRun>{{0, 7}}), Scrubbed());
  EXPECT_EQ((std::vector<PageRun>{{0, 7}}), *runs);
  EXPECT_EQ(93u, alloc_.free_pages());
  EXPECT_EQ(93u, alloc_.scrubbing_pages());
  EXPECT_EQ(7u, alloc_.pages_owned_by(kBob));
}

TEST_F(ScrubbingAllocatorTest, ZeroedPagesAreTakenFirst) {
  ASSERT_OK(alloc_.Allocate(10, kAlice));
  ASSERT_OK(alloc_.Free({{0, 10}}, kAlice));
  absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(90, kBob);
  ASSERT_OK(runs);
  EXPECT_EQ((std::vector<PageRun>{{10, 90}}), *runs);  // never-used pages
  EXPECT_TRUE(Scrubbed().empty());
}

TEST_F(ScrubbingAllocatorTest, ExhaustionCountsScrubbingPagesAndIsExact) {
  ASSERT_OK(alloc_.Allocate(95, kAlice));
  ASSERT_OK(alloc_.Free({{0, 3}}, kAlice));  // 5 free + 3 scrubbing
  absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(9, kBob);
  EXPECT_ERROR(ResourceExhausted, runs);
  EXPECT_EQ("pool full: asked for 9 pages, 8 of 100 are free",
            runs.status().message());
  EXPECT_TRUE(Scrubbed().empty());  // nothing zeroed for a refused request
  EXPECT_EQ(8u, alloc_.free_pages());
  EXPECT_OK(alloc_.Allocate(8, kBob));  // free + scrubbing suffice
}

// Zeroing off the allocation path: a page that holds only a session's own
// bytes goes back to it unzeroed; every other session gets zeroed pages.
TEST_F(ScrubbingAllocatorTest, FreedPagesGoBackToTheirSessionUnzeroed) {
  ASSERT_OK(alloc_.Allocate(100, kAlice));
  ASSERT_OK(alloc_.Free({{20, 10}}, kAlice));
  absl::StatusOr<std::vector<PageRun>> again = alloc_.Allocate(10, kAlice);
  ASSERT_OK(again);
  EXPECT_EQ((std::vector<PageRun>{{20, 10}}), *again);
  EXPECT_TRUE(Scrubbed().empty());  // its own bytes: nothing to zero
  EXPECT_EQ(0u, alloc_.scrubbing_pages());
  EXPECT_EQ(100u, alloc_.pages_owned_by(kAlice));

  ASSERT_OK(alloc_.Free({{20, 10}}, kAlice));
  absl::StatusOr<std::vector<PageRun>> bobs = alloc_.Allocate(10, kBob);
  ASSERT_OK(bobs);
  EXPECT_EQ((std::vector<PageRun>{{20, 10}}), *bobs);
  EXPECT_EQ((std::vector<PageRun>{{20, 10}}), Scrubbed());  // Alice's bytes
}

TEST_F(ScrubbingAllocatorTest, OwnPagesFirstThenZeroedOnesNeverAnothersUnzeroed) {
  ASSERT_OK(alloc_.Allocate(50, kAlice));   // [0, 50)
  ASSERT_OK(alloc_.Allocate(50, kBob));     // [50, 100)
  ASSERT_OK(alloc_.Free({{0, 3}}, kAlice));
  ASSERT_OK(alloc_.Free({{50, 4}}, kBob));
  // Alice asks for 5: her 3 back unzeroed, 2 of Bob's zeroed first.
  absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(5, kAlice);
  ASSERT_OK(runs);
  EXPECT_EQ((std::vector<PageRun>{{0, 3}, {50, 2}}), *runs);
  EXPECT_EQ((std::vector<PageRun>{{50, 2}}), Scrubbed());
  EXPECT_EQ(52u, alloc_.pages_owned_by(kAlice));
  EXPECT_EQ(2u, alloc_.scrubbing_pages());  // Bob's [52, 54)
  EXPECT_EQ(2u, alloc_.free_pages());
}

TEST_F(ScrubbingAllocatorTest, EvictedPagesGoBackUnzeroedOnlyToTheirPublisher) {
  ASSERT_OK(alloc_.Allocate(100, kAlice));
  ASSERT_OK(alloc_.Cache({{10, 6}}, kAlice));
  // The cache evicts a chain leaf first: pages in descending order. They
  // are freed as one run holding Alice's bytes; Bob's two come zeroed, from
  // the run's start.
  auto evict = [](uint64_t) { return std::vector<uint64_t>{15, 14, 13, 12, 11, 10}; };
  absl::StatusOr<std::vector<PageRun>> bobs = alloc_.Allocate(2, kBob, evict);
  ASSERT_OK(bobs);
  EXPECT_EQ((std::vector<PageRun>{{10, 2}}), *bobs);
  EXPECT_EQ((std::vector<PageRun>{{10, 2}}), Scrubbed());
  EXPECT_EQ(0u, alloc_.cached_pages());
  EXPECT_EQ(4u, alloc_.scrubbing_pages());
  // Alice, who published them, takes the other four back unzeroed.
  absl::StatusOr<std::vector<PageRun>> alices = alloc_.Allocate(4, kAlice);
  ASSERT_OK(alices);
  EXPECT_EQ((std::vector<PageRun>{{12, 4}}), *alices);
  EXPECT_EQ((std::vector<PageRun>{{10, 2}}), Scrubbed());  // nothing more
  EXPECT_EQ(0u, alloc_.scrubbing_pages());
}

TEST_F(ScrubbingAllocatorTest, TheBackgroundScrubberLeavesASessionItsFreshPages) {
  ASSERT_OK(alloc_.Allocate(10, kAlice));
  ASSERT_OK(alloc_.Free({{0, 5}}, kAlice));   // Alice may take these back
  EXPECT_EQ(5u, alloc_.FreeAllOwnedBy(kAlice));  // ended: nobody's
  const absl::Time start = absl::Now();
  ASSERT_TRUE(alloc_.ScrubPending(100));  // nobody's pages: at once
  EXPECT_EQ((std::vector<PageRun>{{5, 5}}), Scrubbed());
  ASSERT_TRUE(alloc_.ScrubPending(100));  // Alice's: after the window
  EXPECT_GE(absl::Now() - start, SlotAllocator::kReuseWindow);
  EXPECT_EQ((std::vector<PageRun>{{5, 5}, {0, 5}}), Scrubbed());
  EXPECT_EQ(0u, alloc_.scrubbing_pages());
  EXPECT_EQ(1u, alloc_.free_extents());
}

TEST(ScrubbingAllocatorWaitTest, AllocateWaitsForTheBatchBeingScrubbed) {
  // Plain atomics, not absl::Notification: the TSan build's shim for the
  // (uninstrumented) Abseil mutex does not follow Notification's waits.
  std::atomic<bool> scrubbing{false}, release{false};
  auto wait_for = [](const std::atomic<bool>& flag) {
    while (!flag.load()) absl::SleepFor(absl::Milliseconds(1));
  };
  SlotAllocator alloc(10, [&](const PageRun&) {
    scrubbing = true;
    wait_for(release);
  });
  ASSERT_OK(alloc.Allocate(10, kAlice));
  EXPECT_EQ(10u, alloc.FreeAllOwnedBy(kAlice));
  // The background scrubber takes every pending page and is slow.
  std::thread scrubber([&] { EXPECT_TRUE(alloc.ScrubPending(100)); });
  wait_for(scrubbing);
  EXPECT_EQ(10u, alloc.free_pages());
  std::atomic<bool> done{false};
  std::thread client([&] {
    EXPECT_OK(alloc.Allocate(4, kBob));  // nothing pending: waits
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(done.load());
  // Exhaustion is still decided at once, without waiting.
  EXPECT_ERROR(ResourceExhausted, alloc.Allocate(11, kBob));
  release = true;
  client.join();
  scrubber.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(4u, alloc.pages_owned_by(kBob));
  EXPECT_EQ(6u, alloc.free_pages());
  EXPECT_EQ(0u, alloc.scrubbing_pages());
  alloc.StopScrubbing();
  EXPECT_FALSE(alloc.ScrubPending(100));
}

TEST(ScrubbingAllocatorChurnTest, ConcurrentAllocFreeWithScrubberKeepsCounts) {
  SlotAllocator alloc(256, [](const PageRun&) {});
  std::thread scrubber([&] {
    while (alloc.ScrubPending(3)) {
    }
  });
  std::vector<std::thread> clients;
  for (OwnerTag owner = 1; owner <= 4; ++owner) {
    clients.emplace_back([&alloc, owner] {
      uint64_t seed = owner;
      for (int i = 0; i < 2000; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        auto runs = alloc.Allocate(1 + (seed >> 40) % 60, owner);
        if (!runs.ok()) {
          EXPECT_ERROR(ResourceExhausted, runs);
          continue;
        }
        if ((seed >> 33) % 2 == 0) {
          EXPECT_OK(alloc.Free(*runs, owner));
        } else {
          alloc.FreeAllOwnedBy(owner);
        }
        const SlotAllocator::Occupancy o = alloc.Snapshot();
        uint64_t used = 0;
        for (const auto& [tag, pages] : o.usage) used += pages;
        EXPECT_EQ(256u, o.free_pages + used);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  alloc.StopScrubbing();
  scrubber.join();
  EXPECT_EQ(256u, alloc.free_pages());
  EXPECT_TRUE(alloc.UsageByOwner().empty());
}

// Cached pages: owner kCacheOwner, freed through the scrub path.
class CachedPagesTest : public ScrubbingAllocatorTest {
 protected:
  // Sums of a snapshot: free + usage + cached, which must be num_pages.
  uint64_t Accounted() {
    const SlotAllocator::Occupancy o = alloc_.Snapshot();
    uint64_t pages = o.free_pages + o.cached_pages;
    for (const auto& [owner, n] : o.usage) pages += n;
    return pages;
  }
  static absl::Status AllowAll(const std::vector<PageRun>&) {
    return absl::OkStatus();
  }
};

constexpr absl::string_view kCachedMessage =
    "is cached: it belongs to the page cache, not to a session";

TEST_F(CachedPagesTest, CacheMovesIdlePagesToTheCacheAndCountsThemApart) {
  ASSERT_OK(alloc_.Allocate(10, kAlice));
  absl::StatusOr<uint64_t> moved = alloc_.Cache({{2, 3}, {3, 1}}, kAlice);
  ASSERT_OK(moved);
  EXPECT_EQ(3u, *moved);  // page 3 listed twice, moved once
  EXPECT_EQ(7u, alloc_.pages_owned_by(kAlice));
  EXPECT_EQ(3u, alloc_.cached_pages());
  EXPECT_EQ(0u, alloc_.pages_owned_by(kCacheOwner));
  EXPECT_FALSE(alloc_.UsageByOwner().contains(kCacheOwner));
  const SlotAllocator::Occupancy o = alloc_.Snapshot();
  EXPECT_EQ(90u, o.free_pages);
  EXPECT_EQ(3u, o.cached_pages);
  EXPECT_EQ(7u, o.usage.at(kAlice));
  EXPECT_EQ(100u, Accounted());
}

TEST_F(CachedPagesTest, CacheIsAllOrNothingWithTheErrorsOfCheckOwnedIdle) {
  ASSERT_OK(alloc_.Allocate(10, kAlice));
  ASSERT_OK(alloc_.Allocate(5, kBob));  // [10, 15)
  ASSERT_OK(alloc_.Pin({{4, 1}}, kAlice));
  EXPECT_ERROR(FailedPrecondition, alloc_.Cache({{0, 5}}, kAlice));  // pinned
  EXPECT_ERROR(FailedPrecondition, alloc_.Cache({{0, 2}, {10, 1}}, kAlice));
  EXPECT_ERROR(FailedPrecondition, alloc_.Cache({{20, 1}}, kAlice));  // free
  EXPECT_ERROR(InvalidArgument, alloc_.Cache({{99, 2}}, kAlice));
  EXPECT_ERROR(InvalidArgument, alloc_.Cache({{0, 1}}, kCacheOwner));
  EXPECT_EQ(0u, alloc_.cached_pages());
  EXPECT_EQ(10u, alloc_.pages_owned_by(kAlice));
  alloc_.Unpin({{4, 1}});
  ASSERT_OK(alloc_.Cache({{0, 10}}, kAlice));
  EXPECT_EQ(0u, alloc_.pages_owned_by(kAlice));
  EXPECT_FALSE(alloc_.UsageByOwner().contains(kAlice));
  EXPECT_ERROR(FailedPrecondition, alloc_.Cache({{0, 1}}, kAlice));  // twice
}

TEST_F(CachedPagesTest, SessionCallsNeverMatchACachedPage) {
  ASSERT_OK(alloc_.Allocate(10, kAlice));
  ASSERT_OK(alloc_.Cache({{2, 3}}, kAlice));
  const std::vector<PageRun> cached = {{3, 1}};
  for (absl::Status s : {alloc_.CheckOwned(cached, kAlice),
                         alloc_.CheckOwnedIdle(cached, kAlice),
                         alloc_.Free(cached, kAlice).status(),
                         alloc_.HandOver(cached, kAlice, kBob).status(),
                         alloc_.Pin(cached, kAlice)}) {
    EXPECT_ERROR(FailedPrecondition, s);
    EXPECT_EQ(absl::StrCat("page 3 ", kCachedMessage), s.message());
  }
  // kCacheOwner is no session's tag.
  EXPECT_ERROR(InvalidArgument, alloc_.Allocate(1, kCacheOwner));
  EXPECT_ERROR(InvalidArgument, alloc_.CheckOwned(cached, kCacheOwner));
  EXPECT_ERROR(InvalidArgument, alloc_.Pin(cached, kCacheOwner));
  EXPECT_ERROR(InvalidArgument, alloc_.Free(cached, kCacheOwner));
  EXPECT_ERROR(InvalidArgument, alloc_.HandOver({{0, 1}}, kAlice, kCacheOwner));
  EXPECT_ERROR(InvalidArgument, alloc_.HandOver(cached, kCacheOwner, kBob));
  EXPECT_EQ(0u, alloc_.FreeAllOwnedBy(kCacheOwner));
  EXPECT_EQ(7u, alloc_.FreeAllOwnedBy(kAlice));
  EXPECT_EQ(3u, alloc_.cached_pages());
  EXPECT_EQ(97u, alloc_.free_pages());
  EXPECT_EQ(100u, Accounted());
}

TEST_F(CachedPagesTest, UncacheOfIdlePagesScrubsThemBeforeReuse) {
  ASSERT_OK(alloc_.Allocate(100, kAlice));
  ASSERT_OK(alloc_.Cache({{0, 4}, {10, 2}}, kAlice));
  absl::StatusOr<uint64_t> freed = alloc_.Uncache({{10, 2}, {0, 4}});
  ASSERT_OK(freed);
  EXPECT_EQ(6u, *freed);
  EXPECT_EQ(0u, alloc_.cached_pages());
  EXPECT_EQ(6u, alloc_.scrubbing_pages());
  EXPECT_EQ(6u, alloc_.free_pages());
  EXPECT_TRUE(Scrubbed().empty());  // zeroed when needed, not by Uncache
  absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(6, kBob);
  ASSERT_OK(runs);
  EXPECT_EQ((std::vector<PageRun>{{0, 4}, {10, 2}}), *runs);
  EXPECT_EQ((std::vector<PageRun>{{0, 4}, {10, 2}}), Scrubbed());
  EXPECT_EQ(100u, Accounted());
}

TEST_F(CachedPagesTest, UncacheIsAllOrNothing) {
  ASSERT_OK(alloc_.Allocate(10, kAlice));
  ASSERT_OK(alloc_.Cache({{0, 4}}, kAlice));
  EXPECT_ERROR(FailedPrecondition, alloc_.Uncache({{0, 5}}));   // 4: Alice's
  EXPECT_ERROR(FailedPrecondition, alloc_.Uncache({{50, 1}}));  // free
  EXPECT_ERROR(FailedPrecondition, alloc_.Uncache({{0, 2}, {1, 1}}));  // twice
  EXPECT_ERROR(InvalidArgument, alloc_.Uncache({{0, 0}}));
  EXPECT_ERROR(InvalidArgument, alloc_.Uncache({{99, 5}}));
  EXPECT_EQ(4u, alloc_.cached_pages());
  EXPECT_EQ(90u, alloc_.free_pages());
}

TEST_F(CachedPagesTest, UncacheOfAPageBeingReadFreesItAtItsLastUnpin) {
  ASSERT_OK(alloc_.Allocate(100, kAlice));
  ASSERT_OK(alloc_.Cache({{0, 4}}, kAlice));
  ASSERT_OK(alloc_.PinForRead({{1, 2}}, kBob, AllowAll));  // two loads
  ASSERT_OK(alloc_.PinForRead({{2, 1}}, kBob, AllowAll));
  absl::StatusOr<uint64_t> freed = alloc_.Uncache({{0, 4}});
  ASSERT_OK(freed);
  EXPECT_EQ(2u, *freed);  // 0 and 3 now
  EXPECT_EQ(2u, alloc_.cached_pages());
  EXPECT_EQ(2u, alloc_.pages_freed_when_unpinned());
  EXPECT_EQ(2u, alloc_.free_pages());
  EXPECT_EQ(100u, Accounted());
  // Evicted: no new reader, no way back, no second free.
  absl::Status pin = alloc_.PinForRead({{1, 1}}, kBob, AllowAll);
  EXPECT_ERROR(FailedPrecondition, pin);
  EXPECT_NE(std::string::npos, pin.message().find("evicted"));
  EXPECT_ERROR(FailedPrecondition, alloc_.Reclaim({{1, 1}}, kBob));
  EXPECT_ERROR(FailedPrecondition, alloc_.Uncache({{1, 1}}));

  alloc_.Unpin({{1, 2}});  // page 1 done, page 2 still read
  EXPECT_EQ(1u, alloc_.cached_pages());
  EXPECT_EQ(1u, alloc_.pages_freed_when_unpinned());
  EXPECT_EQ(3u, alloc_.free_pages());
  alloc_.Unpin({{2, 1}});
  EXPECT_EQ(0u, alloc_.cached_pages());
  EXPECT_EQ(0u, alloc_.pages_freed_when_unpinned());
  EXPECT_EQ(4u, alloc_.scrubbing_pages());
  EXPECT_TRUE(Scrubbed().empty());
  absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(4, kBob);
  ASSERT_OK(runs);
  EXPECT_EQ((std::vector<PageRun>{{0, 4}}), *runs);
  EXPECT_EQ(4u, [&] {
    uint64_t n = 0;
    for (const PageRun& r : Scrubbed()) n += r.num_pages;
    return n;
  }());  // all four zeroed before reuse
}

TEST_F(CachedPagesTest, PinForReadPinsOwnPagesAndCachedPagesTheCheckAllows) {
  ASSERT_OK(alloc_.Allocate(10, kAlice));  // [0, 10)
  ASSERT_OK(alloc_.Allocate(5, kBob));     // [10, 15)
  ASSERT_OK(alloc_.Cache({{0, 4}}, kAlice));
  std::vector<std::vector<PageRun>> asked;
  auto check = [&](const std::vector<PageRun>& cached) {
    asked.push_back(cached);
    return absl::OkStatus();
  };
  // Alice's page 4 is not Bob's to read: refused before the check.
  absl::Status s = alloc_.PinForRead({{0, 5}}, kBob, check);
  EXPECT_ERROR(FailedPrecondition, s);
  EXPECT_EQ("page 4 belongs to another session", s.message());
  EXPECT_ERROR(FailedPrecondition, alloc_.PinForRead({{20, 1}}, kBob, check));
  EXPECT_ERROR(InvalidArgument,
               alloc_.PinForRead({{0, 1}}, kCacheOwner, check));
  EXPECT_TRUE(asked.empty());
  // Own pages only: no check.
  ASSERT_OK(alloc_.PinForRead({{10, 2}}, kBob, check));
  EXPECT_TRUE(asked.empty());
  alloc_.Unpin({{10, 2}});
  // The check refuses: its error, nothing pinned.
  auto refuse = [](const std::vector<PageRun>&) {
    return absl::FailedPreconditionError("no reference");
  };
  EXPECT_ERROR(FailedPrecondition,
               alloc_.PinForRead({{1, 2}, {10, 1}}, kBob, refuse));
  EXPECT_OK(alloc_.CheckOwnedIdle({{10, 5}}, kBob));
  EXPECT_OK(alloc_.Reclaim({{1, 2}}, kBob));  // idle
  ASSERT_OK(alloc_.Cache({{1, 2}}, kBob));
  // Allowed: cached and own pages pinned together, the check asked once.
  ASSERT_OK(alloc_.PinForRead({{2, 2}, {10, 1}, {0, 1}}, kBob, check));
  EXPECT_EQ((std::vector<std::vector<PageRun>>{{{2, 2}, {0, 1}}}), asked);
  EXPECT_ERROR(FailedPrecondition, alloc_.CheckOwnedIdle({{10, 1}}, kBob));
  EXPECT_ERROR(FailedPrecondition, alloc_.Reclaim({{2, 1}}, kBob));  // pinned
  // A write pin never takes a cached page, even with the reader's tag.
  EXPECT_ERROR(FailedPrecondition, alloc_.Pin({{2, 1}}, kBob));
  alloc_.Unpin({{2, 2}, {10, 1}, {0, 1}});
  EXPECT_OK(alloc_.CheckOwnedIdle({{10, 5}}, kBob));
  EXPECT_EQ(4u, alloc_.cached_pages());
}

TEST_F(CachedPagesTest, ReclaimGivesIdleCachedPagesToASession) {
  ASSERT_OK(alloc_.Allocate(10, kAlice));
  ASSERT_OK(alloc_.Cache({{0, 4}}, kAlice));
  EXPECT_ERROR(FailedPrecondition, alloc_.Reclaim({{3, 2}}, kBob));  // 4
  EXPECT_ERROR(InvalidArgument, alloc_.Reclaim({{0, 1}}, kCacheOwner));
  absl::StatusOr<uint64_t> moved = alloc_.Reclaim({{0, 2}, {1, 1}}, kBob);
  ASSERT_OK(moved);
  EXPECT_EQ(2u, *moved);
  EXPECT_EQ(2u, alloc_.pages_owned_by(kBob));
  EXPECT_EQ(2u, alloc_.cached_pages());
  EXPECT_EQ(2u, alloc_.FreeAllOwnedBy(kBob));
  EXPECT_EQ(100u, Accounted());
}

// An evictor that hands out given pages and records what it was asked.
struct FakeEvictor {
  std::vector<uint64_t> pages;
  std::vector<uint64_t> asked;
  std::vector<uint64_t> operator()(uint64_t needed) {
    asked.push_back(needed);
    std::vector<uint64_t> out;
    while (!pages.empty() && out.size() < needed) {
      out.push_back(pages.front());
      pages.erase(pages.begin());
    }
    return out;
  }
};

TEST_F(SlotAllocatorTest, AllocateWithAnEvictorFreesWhatItEvictsAndRetries) {
  Alloc(100, kAlice);
  ASSERT_OK(alloc_.Cache({{0, 10}}, kAlice));
  FakeEvictor evictor{{5, 6, 2, 9}, {}};
  absl::StatusOr<std::vector<PageRun>> runs =
      alloc_.Allocate(3, kBob, std::ref(evictor));
  ASSERT_OK(runs);
  EXPECT_EQ((std::vector<uint64_t>{3}), evictor.asked);
  EXPECT_EQ((std::vector<PageRun>{{2, 1}, {5, 2}}), *runs);
  EXPECT_EQ(7u, alloc_.cached_pages());
  EXPECT_EQ(3u, alloc_.pages_owned_by(kBob));
  EXPECT_EQ(0u, alloc_.free_pages());
}

TEST_F(SlotAllocatorTest, AllocateWithAnEvictorDoesNotEvictWhenPagesAreFree) {
  Alloc(90, kAlice);
  ASSERT_OK(alloc_.Cache({{0, 10}}, kAlice));
  FakeEvictor evictor{{0, 1}, {}};
  ASSERT_OK(alloc_.Allocate(10, kBob, std::ref(evictor)));
  EXPECT_TRUE(evictor.asked.empty());
  EXPECT_EQ(10u, alloc_.cached_pages());
  EXPECT_ERROR(InvalidArgument, alloc_.Allocate(0, kBob, std::ref(evictor)));
  EXPECT_ERROR(InvalidArgument,
               alloc_.Allocate(1, kCacheOwner, std::ref(evictor)));
  EXPECT_TRUE(evictor.asked.empty());
}

TEST_F(SlotAllocatorTest, AllocateWithAnEvictorStillShortIsExhausted) {
  Alloc(98, kAlice);  // 2 free
  ASSERT_OK(alloc_.Cache({{0, 10}}, kAlice));
  ASSERT_OK(alloc_.PinForRead({{4, 1}}, kBob, [](const std::vector<PageRun>&) {
    return absl::OkStatus();
  }));
  FakeEvictor evictor{{3, 4}, {}};  // 4 is still read
  absl::StatusOr<std::vector<PageRun>> runs =
      alloc_.Allocate(5, kBob, std::ref(evictor));
  EXPECT_ERROR(ResourceExhausted, runs);
  EXPECT_EQ((std::vector<uint64_t>{3}), evictor.asked);
  EXPECT_EQ(
      "pool full: asked for 5 pages, 3 of 100 are free; of the 3 missing the "
      "page cache could evict 2 (1 of them still read by copies in flight); 9 "
      "pages stay cached",
      runs.status().message());
  // What was evicted stays freed (page 4 once unpinned); nothing was taken.
  EXPECT_EQ(3u, alloc_.free_pages());
  EXPECT_EQ(0u, alloc_.pages_owned_by(kBob));
  alloc_.Unpin({{4, 1}});
  EXPECT_EQ(4u, alloc_.free_pages());
  EXPECT_EQ(8u, alloc_.cached_pages());
  // With no evictor the behaviour (and message) is the old one.
  runs = alloc_.Allocate(5, kBob);
  EXPECT_EQ("pool full: asked for 5 pages, 4 of 100 are free",
            runs.status().message());
}

TEST_F(SlotAllocatorTest, AnEvictorReturningAnUncachedPageIsInternal) {
  Alloc(100, kAlice);
  ASSERT_OK(alloc_.Cache({{0, 10}}, kAlice));
  FakeEvictor evictor{{1, 50}, {}};  // 50 is Alice's
  EXPECT_ERROR(Internal, alloc_.Allocate(2, kBob, std::ref(evictor)));
  EXPECT_EQ(10u, alloc_.cached_pages());  // nothing of the list freed
  EXPECT_EQ(0u, alloc_.free_pages());
}

constexpr absl::string_view kNs = "ns";

TEST(AllocatorWithPageCacheTest, AllocateEvictsTheColdestUnreferencedPages) {
  absl::StatusOr<std::unique_ptr<PageCache>> cache = PageCache::Create(8);
  ASSERT_OK(cache);
  SlotAllocator alloc(8);
  ASSERT_OK(alloc.Allocate(8, kAlice));
  ASSERT_OK(alloc.Cache({{0, 8}}, kAlice));  // before Publish: see Reclaim
  for (uint64_t p = 0; p < 8; ++p) {
    ASSERT_OK((*cache)->Publish(kNs, absl::StrCat("k", p), "", p));
  }
  const absl::string_view k0 = "k0";
  ASSERT_OK((*cache)->Lookup(kNs, {&k0, 1}, /*acquire=*/true, kBob));
  auto evict = [&](uint64_t needed) { return (*cache)->Evict(needed); };
  absl::StatusOr<std::vector<PageRun>> runs = alloc.Allocate(3, kBob, evict);
  ASSERT_OK(runs);
  EXPECT_EQ((std::vector<PageRun>{{1, 3}}), *runs);  // 0 is referenced
  EXPECT_EQ(5u, (*cache)->cached_pages());
  EXPECT_EQ(5u, alloc.cached_pages());
  EXPECT_FALSE((*cache)->IsCached(1));
  EXPECT_TRUE((*cache)->IsCached(0));
}

// Many threads: publishers allocate (evicting through a real PageCache),
// write, cache and publish pages; readers look keys up with a reference,
// pin the pages for reading and check their bytes, dropping the reference
// before or after the pin so that pages are evicted while read.
TEST(AllocatorWithPageCacheTest, ConcurrentEvictionAndReadsKeepBytesAndCounts) {
  constexpr uint64_t kPages = 48;
  constexpr size_t kPageBytes = 16;
  constexpr int kPublishers = 2;
  constexpr int kReaders = 3;
  constexpr int kRounds = 300;
  std::vector<uint8_t> bytes(kPages * kPageBytes, 0);
  auto zero = [&](const PageRun& run) {
    std::memset(bytes.data() + run.first_page * kPageBytes, 0,
                run.num_pages * kPageBytes);
  };
  SlotAllocator alloc(kPages, zero);
  absl::StatusOr<std::unique_ptr<PageCache>> created =
      PageCache::Create(kPages);
  ASSERT_OK(created);
  PageCache& cache = **created;
  auto evict = [&](uint64_t needed) { return cache.Evict(needed); };

  absl::Mutex keys_mu;
  std::vector<std::pair<std::string, uint8_t>> keys;  // guarded by keys_mu
  std::atomic<int> publishers_left{kPublishers};
  std::atomic<uint64_t> exhausted{0}, reads{0};

  auto publisher = [&](int t) {
    const OwnerTag tag = 100 + t;
    std::mt19937 rng(t);
    for (int i = 0; i < kRounds; ++i) {
      const uint64_t n = 1 + rng() % 3;
      absl::StatusOr<std::vector<PageRun>> runs = alloc.Allocate(n, tag, evict);
      if (!runs.ok()) {
        EXPECT_ERROR(ResourceExhausted, runs);
        ++exhausted;
        continue;
      }
      std::vector<std::string> names;
      std::vector<PublishItem> items;
      // Each publisher's values are its own: 1..127, 128..254.
      const uint8_t value = static_cast<uint8_t>(1 + t * 127 + i % 127);
      for (const PageRun& run : *runs) {
        for (uint64_t p = run.first_page; p < run.first_page + run.num_pages;
             ++p) {
          for (size_t b = 0; b < kPageBytes; ++b) {
            // Scrubbed, or bytes this publisher itself wrote (its own
            // page, evicted): never the other publisher's.
            const uint8_t old = bytes[p * kPageBytes + b];
            EXPECT_TRUE(old == 0 || (old - 1) / 127 == t) << int(old);
            bytes[p * kPageBytes + b] = value;
          }
          names.push_back(absl::StrCat("t", t, "-", i, "-", p));
        }
      }
      ASSERT_OK(alloc.Cache(*runs, tag));
      size_t k = 0;
      for (const PageRun& run : *runs) {
        for (uint64_t p = run.first_page; p < run.first_page + run.num_pages;
             ++p, ++k) {
          const absl::string_view parent =
              k == 0 ? absl::string_view() : absl::string_view(names[k - 1]);
          items.push_back({names[k], parent, p});
        }
      }
      absl::StatusOr<std::vector<PublishResult>> published =
          cache.Publish(kNs, items, /*acquire=*/false, tag);
      ASSERT_OK(published);
      for (const PublishResult& r : *published) {
        EXPECT_EQ(PublishOutcome::kCached, r.outcome);
      }
      absl::MutexLock lock(&keys_mu);
      for (const std::string& name : names) keys.emplace_back(name, value);
    }
    --publishers_left;
  };

  auto reader = [&](int r) {
    const OwnerTag tag = 200 + r;
    std::mt19937 rng(1000 + r);
    auto held = [&](const std::vector<PageRun>& cached) {
      for (const PageRun& run : cached) {
        for (uint64_t p = run.first_page; p < run.first_page + run.num_pages;
             ++p) {
          if (cache.References(p) == 0) {
            return absl::FailedPreconditionError("no reference");
          }
        }
      }
      return absl::OkStatus();
    };
    for (int i = 0; publishers_left.load() > 0 || i < kRounds; ++i) {
      std::pair<std::string, uint8_t> key;
      {
        absl::MutexLock lock(&keys_mu);
        if (keys.empty()) continue;
        key = keys[rng() % keys.size()];
      }
      const absl::string_view name = key.first;
      absl::StatusOr<LookupResult> found =
          cache.Lookup(kNs, {&name, 1}, /*acquire=*/true, tag);
      ASSERT_OK(found);
      if (found->hits == 0) continue;  // evicted
      const std::vector<PageRun> run = {{found->pages[0], 1}};
      ASSERT_OK(alloc.PinForRead(run, tag, held));
      auto check_bytes = [&] {
        for (size_t b = 0; b < kPageBytes; ++b) {
          ASSERT_EQ(key.second, bytes[run[0].first_page * kPageBytes + b]);
        }
      };
      check_bytes();
      const bool release_first = rng() % 2 == 0;
      if (release_first) ASSERT_OK(cache.Release(tag, run));
      check_bytes();  // evictable now, but not freed while pinned
      alloc.Unpin(run);
      if (!release_first) ASSERT_OK(cache.Release(tag, run));
      ++reads;
    }
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kPublishers; ++t) threads.emplace_back(publisher, t);
  for (int r = 0; r < kReaders; ++r) threads.emplace_back(reader, r);
  for (std::thread& t : threads) t.join();

  EXPECT_OK(cache.CheckConsistency());
  EXPECT_EQ(0u, cache.referenced_pages());
  EXPECT_GT(cache.Stats().total.evictions, 0u);
  EXPECT_GT(reads.load(), 0u);
  EXPECT_EQ(0u, alloc.pages_freed_when_unpinned());
  EXPECT_EQ(cache.cached_pages(), alloc.cached_pages());
  SlotAllocator::Occupancy o = alloc.Snapshot();
  EXPECT_TRUE(o.usage.empty());  // every page allocated was cached
  EXPECT_EQ(kPages, o.free_pages + o.cached_pages);
  // Evict everything: all freed, and all zeroed before reuse.
  const std::vector<uint64_t> rest = cache.Evict(kPages);
  EXPECT_EQ(o.cached_pages, rest.size());
  if (!rest.empty()) ASSERT_OK(alloc.Uncache(ToPageRuns(rest)));
  EXPECT_EQ(0u, cache.cached_pages());
  EXPECT_EQ(0u, alloc.cached_pages());
  EXPECT_EQ(kPages, alloc.free_pages());
  ASSERT_OK(alloc.Allocate(kPages, kAlice));
  for (uint8_t b : bytes) ASSERT_EQ(0, b);
}

}  // namespace
}  // namespace hostkv
