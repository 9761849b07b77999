// A fixed set of threads that runs data-parallel loops (the CPU copy path).
#ifndef HOSTKV_KERNELS_WORKER_POOL_H_
#define HOSTKV_KERNELS_WORKER_POOL_H_

#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace hostkv {

// Thread-safe; ParallelFor calls from several threads are serialized.
// Makes the calling thread batch work (SCHED_BATCH): copy threads, which
// must not preempt request threads when they wake.
void RunAsBatchWork();

class WorkerPool {
 public:
  // Starts num_threads - 1 workers; the calling thread is the last one.
  explicit WorkerPool(size_t num_threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  size_t num_threads() const { return workers_.size() + 1; }

  // Runs fn(0) .. fn(shards - 1), spread over the threads, and returns when
  // all have returned.
  void ParallelFor(size_t shards, const std::function<void(size_t)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void WorkerLoop();
  // Claims and runs shards of the current loop until none are left.
  void RunShards() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex loop_mu_;  // serializes ParallelFor callers
  absl::Mutex mu_;
  const std::function<void(size_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t shards_ ABSL_GUARDED_BY(mu_) = 0;
  size_t next_shard_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_shards_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_WORKER_POOL_H_
