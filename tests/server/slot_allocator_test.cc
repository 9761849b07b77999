#include "server/pool/slot_allocator.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

#include "gtest/gtest.h"
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
  Alloc(10, kAlice);                       // [0, 10)
  Alloc(10, kBob);                         // [10, 20)
  ASSERT_OK(alloc_.Free({{2, 3}, {7, 2}}, kAlice));
  EXPECT_EQ((std::vector<PageRun>{{2, 3}, {7, 2}, {20, 1}}), Alloc(6, kBob));
}

TEST_F(SlotAllocatorTest, FullPoolIsResourceExhaustedAndNamesTheFreeCount) {
  Alloc(95, kAlice);
  absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(6, kBob);
  EXPECT_ERROR(ResourceExhausted, runs);
  EXPECT_NE(std::string::npos, runs.status().message().find("5 of 100 free"));
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

  // Allocate zeroes (inline, no background thread here) what it takes.
  absl::StatusOr<std::vector<PageRun>> runs = alloc_.Allocate(7, kBob);
  ASSERT_OK(runs);
  EXPECT_EQ((std::vector<PageRun>{{10, 5}, {0, 2}}), Scrubbed());
  EXPECT_EQ((std::vector<PageRun>{{0, 2}, {10, 5}}), *runs);
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
  EXPECT_EQ("pool full: 9 pages requested, 8 of 100 free", runs.status().message());
  EXPECT_TRUE(Scrubbed().empty());  // nothing zeroed for a refused request
  EXPECT_EQ(8u, alloc_.free_pages());
  EXPECT_OK(alloc_.Allocate(8, kBob));  // free + scrubbing suffice
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

}  // namespace
}  // namespace hostkv
