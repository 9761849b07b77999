// WorkerPool::ParallelFor: every shard runs exactly once, on the pool's
// threads, for any number of threads, shards, calls and callers.
#include "kernels/worker_pool.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hostkv {
namespace {

// Per-shard run counts of one ParallelFor.
class ShardCounter {
 public:
  explicit ShardCounter(size_t shards)
      : counts_(std::make_unique<std::atomic<int>[]>(shards)), shards_(shards) {
    for (size_t i = 0; i < shards; ++i) counts_[i] = 0;
  }

  std::function<void(size_t)> Fn() {
    return [this](size_t shard) {
      if (shard >= shards_) {
        out_of_range_.fetch_add(1);
        return;
      }
      counts_[shard].fetch_add(1);
    };
  }

  // Shards that did not run exactly once, plus calls with a bad index.
  size_t Wrong() const {
    size_t wrong = out_of_range_.load();
    for (size_t i = 0; i < shards_; ++i) wrong += counts_[i].load() != 1;
    return wrong;
  }

 private:
  std::unique_ptr<std::atomic<int>[]> counts_;
  const size_t shards_;
  std::atomic<size_t> out_of_range_{0};
};

class WorkerPoolTest : public ::testing::TestWithParam<size_t> {};

TEST_P(WorkerPoolTest, ReportsItsThreadCount) {
  WorkerPool pool(GetParam());
  EXPECT_EQ(GetParam(), pool.num_threads());
}

TEST_P(WorkerPoolTest, ZeroShardsRunsNothing) {
  WorkerPool pool(GetParam());
  std::atomic<int> calls{0};
  pool.ParallelFor(0, [&](size_t) { calls.fetch_add(1); });
  EXPECT_EQ(0, calls.load());
}

TEST_P(WorkerPoolTest, OneShardRunsOnceOnTheCaller) {
  WorkerPool pool(GetParam());
  std::vector<size_t> seen;
  std::thread::id runner;
  pool.ParallelFor(1, [&](size_t shard) {
    seen.push_back(shard);
    runner = std::this_thread::get_id();
  });
  EXPECT_EQ(std::vector<size_t>{0}, seen);
  EXPECT_EQ(std::this_thread::get_id(), runner);
}

TEST_P(WorkerPoolTest, EveryShardRunsExactlyOnce) {
  WorkerPool pool(GetParam());
  for (size_t shards : {2u, 3u, 4u, 5u, 7u, 64u, 1000u}) {
    ShardCounter counter(shards);
    pool.ParallelFor(shards, counter.Fn());
    EXPECT_EQ(0u, counter.Wrong()) << shards << " shards";
  }
}

TEST_P(WorkerPoolTest, AllShardsAreDoneWhenParallelForReturns) {
  WorkerPool pool(GetParam());
  constexpr size_t kShards = 32;
  std::atomic<size_t> finished{0};
  pool.ParallelFor(kShards, [&](size_t) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    finished.fetch_add(1);
  });
  EXPECT_EQ(kShards, finished.load());
}

TEST_P(WorkerPoolTest, RepeatedCallsEachRunEveryShardOnce) {
  WorkerPool pool(GetParam());
  for (int call = 0; call < 500; ++call) {
    const size_t shards = 1 + call % 9;
    ShardCounter counter(shards);
    pool.ParallelFor(shards, counter.Fn());
    ASSERT_EQ(0u, counter.Wrong()) << "call " << call;
  }
}

TEST_P(WorkerPoolTest, ConcurrentCallersEachGetTheirOwnShards) {
  WorkerPool pool(GetParam());
  constexpr int kCalls = 200;
  std::atomic<int> wrong{0};
  auto caller = [&](size_t shards) {
    for (int call = 0; call < kCalls; ++call) {
      ShardCounter counter(shards);
      pool.ParallelFor(shards, counter.Fn());
      wrong.fetch_add(static_cast<int>(counter.Wrong()));
    }
  };
  std::thread a(caller, 5);
  std::thread b(caller, 13);
  caller(1);  // the single-shard fast path, alongside
  a.join();
  b.join();
  EXPECT_EQ(0, wrong.load());
}

TEST_P(WorkerPoolTest, ShardsRunOnAtMostNumThreadsThreads) {
  WorkerPool pool(GetParam());
  std::mutex mu;
  std::set<std::thread::id> threads;
  pool.ParallelFor(200, [&](size_t) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    std::lock_guard<std::mutex> lock(mu);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_GE(threads.size(), 1u);
  EXPECT_LE(threads.size(), pool.num_threads());
}

INSTANTIATE_TEST_SUITE_P(Threads, WorkerPoolTest, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return "t" + std::to_string(info.param);
                         });

TEST(WorkerPoolConcurrencyTest, ShardsRunInParallel) {
  // Each of the 4 shards waits until all 4 have started: it only finishes
  // if the pool's 4 threads run them at the same time.
  constexpr size_t kThreads = 4;
  WorkerPool pool(kThreads);
  std::atomic<size_t> started{0};
  std::atomic<size_t> timed_out{0};
  pool.ParallelFor(kThreads, [&](size_t) {
    started.fetch_add(1);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < kThreads) {
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out.fetch_add(1);
        return;
      }
      std::this_thread::yield();
    }
  });
  EXPECT_EQ(kThreads, started.load());
  EXPECT_EQ(0u, timed_out.load());
}

TEST(WorkerPoolConcurrencyTest, ManyPoolsStartAndStopCleanly) {
  for (int i = 0; i < 50; ++i) {
    WorkerPool pool(1 + i % 5);
    if (i % 2 == 0) {
      ShardCounter counter(8);
      pool.ParallelFor(8, counter.Fn());
      ASSERT_EQ(0u, counter.Wrong());
    }
  }
}

}  // namespace
}  // namespace hostkv
