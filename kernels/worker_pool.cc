#include "kernels/worker_pool.h"

#include <pthread.h>
#include <sched.h>

namespace hostkv {

WorkerPool::WorkerPool(size_t num_threads) {
  for (size_t i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void WorkerPool::ParallelFor(size_t shards,
                             const std::function<void(size_t)>& fn) {
  if (shards == 0) return;
  if (shards == 1 || workers_.empty()) {
    for (size_t i = 0; i < shards; ++i) fn(i);
    return;
  }
  absl::MutexLock loop_lock(&loop_mu_);
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    shards_ = shards;
    next_shard_ = 0;
    done_shards_ = 0;
    ++generation_;
  }
  RunShards();
  absl::MutexLock lock(&mu_);
  auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_shards_ == shards_;
  };
  mu_.Await(absl::Condition(&all_done));
  fn_ = nullptr;
}

void WorkerPool::RunShards() {
  while (true) {
    const std::function<void(size_t)>* fn;
    size_t shard;
    {
      absl::MutexLock lock(&mu_);
      if (fn_ == nullptr || next_shard_ >= shards_) return;
      fn = fn_;
      shard = next_shard_++;
    }
    (*fn)(shard);
    absl::MutexLock lock(&mu_);
    ++done_shards_;
  }
}

void RunAsBatchWork() {
  // SCHED_BATCH: no wake-up preemption. A copy that starts must not push a
  // request thread (gRPC, a command ring) off its CPU before it answered;
  // CPU time is shared as for any other thread. Unprivileged; if it fails
  // the thread runs as before.
  sched_param param{};
  pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
}

void WorkerPool::WorkerLoop() {
  RunAsBatchWork();
  uint64_t seen = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || (generation_ != seen && fn_ != nullptr);
      };
      mu_.Await(absl::Condition(&has_work));
      if (stop_) return;
      seen = generation_;
    }
    RunShards();
  }
}

}  // namespace hostkv
