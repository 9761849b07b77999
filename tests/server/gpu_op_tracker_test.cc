// The CUDA-free bookkeeping of the GPU backend: counts per session, Take
// once, bounded AwaitIdle, and CloseOnce (a failed import creation must not
// release its signal-word claim twice). The lifetime of imports seen by the
// watchdog is checked with real imports in gpu_routing_test.cc.
#include "server/transfer/gpu_op_tracker.h"

#include <atomic>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace hostkv {
namespace {

std::unique_ptr<GpuOpTracker::Entry> EntryOf(uint64_t op_id, uint64_t wait,
                                             absl::Time deadline) {
  auto entry = std::make_unique<GpuOpTracker::Entry>();
  entry->op = std::make_unique<TransferOp>();
  entry->op->op_id = op_id;
  entry->op->wait_kv_written = wait;
  entry->wait_deadline = deadline;
  return entry;
}

TEST(GpuOpTrackerTest, TakeHandsAnOperationOutOnce) {
  GpuOpTracker tracker;
  tracker.Begin(OwnerTag{1});
  const uint64_t id = tracker.Add(EntryOf(5, 0, absl::InfiniteFuture()));
  EXPECT_EQ(1u, tracker.size());
  std::unique_ptr<GpuOpTracker::Entry> first = tracker.Take(id);
  ASSERT_NE(nullptr, first);
  EXPECT_EQ(5u, first->op->op_id);
  EXPECT_EQ(nullptr, tracker.Take(id));  // the watchdog came second
  EXPECT_EQ(0u, tracker.size());
}

TEST(GpuOpTrackerTest, WatchFlagsOverdueWaitsOnly) {
  GpuOpTracker tracker;
  const absl::Time now = absl::Now();
  tracker.Begin(OwnerTag{1});
  tracker.Add(EntryOf(1, 0, absl::InfiniteFuture()));
  tracker.Begin(OwnerTag{1});
  tracker.Add(EntryOf(2, 7, now - absl::Seconds(1)));
  tracker.Begin(OwnerTag{1});
  tracker.Add(EntryOf(3, 8, now + absl::Seconds(60)));
  int overdue = 0;
  for (const GpuOpTracker::Watched& w : tracker.Watch(now)) {
    if (w.wait_overdue) {
      ++overdue;
      EXPECT_EQ(2u, w.op_id);
      EXPECT_EQ(7u, w.wait_value);
    }
  }
  EXPECT_EQ(1, overdue);
  EXPECT_EQ(3u, tracker.TakeAll().size());
  EXPECT_EQ(0u, tracker.size());
}

TEST(GpuOpTrackerTest, EndRunsOnIdleForTheOwnersLastOperation) {
  GpuOpTracker tracker;
  tracker.Begin(OwnerTag{1});
  tracker.Begin(OwnerTag{1});
  tracker.Begin(OwnerTag{2});
  int idle = 0;
  tracker.End(OwnerTag{1}, [&] { ++idle; });
  EXPECT_EQ(0, idle);
  EXPECT_FALSE(tracker.AwaitIdle(OwnerTag{1}, absl::Milliseconds(1)));
  tracker.End(OwnerTag{1}, [&] { ++idle; });
  EXPECT_EQ(1, idle);
  EXPECT_TRUE(tracker.AwaitIdle(OwnerTag{1}, absl::ZeroDuration()));
  EXPECT_FALSE(tracker.AwaitIdle(std::nullopt, absl::Milliseconds(1)));
  std::thread ender([&] { tracker.End(OwnerTag{2}, nullptr); });
  EXPECT_TRUE(tracker.AwaitIdle(std::nullopt, absl::Seconds(10)));
  ender.join();
}

TEST(CloseOnceTest, RunsExactlyOnceWhoeverCallsFirst) {
  int runs = 0;
  auto once = std::make_shared<CloseOnce>();
  *once = CloseOnce([&] { ++runs; });
  // The import's destructor and the failed Create's caller both call it.
  std::function<void()> from_destructor = [once] { once->Run(); };
  from_destructor();
  once->Run();
  EXPECT_EQ(1, runs);
}

TEST(CloseOnceTest, ConcurrentCallersRunItOnce) {
  std::atomic<int> runs{0};
  CloseOnce once([&] { runs.fetch_add(1); });
  std::thread a([&] { once.Run(); });
  std::thread b([&] { once.Run(); });
  a.join();
  b.join();
  EXPECT_EQ(1, runs.load());
}

TEST(CloseOnceTest, EmptyDoesNothing) {
  CloseOnce once;
  once.Run();
  SUCCEED();
}

}  // namespace
}  // namespace hostkv
