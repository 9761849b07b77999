// The bookkeeping of a GPU backend's operations in flight, free of CUDA so
// that its lifetime rules are tested on the CPU (tests/server/
// gpu_op_tracker_test.cc): which operations are on a stream, how many per
// session, which waits for "KV written" are overdue.
#ifndef HOSTKV_SERVER_TRANSFER_GPU_OP_TRACKER_H_
#define HOSTKV_SERVER_TRANSFER_GPU_OP_TRACKER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/pool/slot_allocator.h"
#include "server/transfer/transfer_engine.h"

namespace hostkv {

// Owns each operation from the moment its copies are on a stream until the
// completion thread (or the watchdog) takes it out. Thread-safe.
//
// Lifetime rule: whoever uses an operation's import outside the tracker's
// lock holds a std::shared_ptr<DeviceImport> of its own (Watch() hands out
// such references), because the operation may be taken and finished -- and
// with it the last reference to the import dropped, its stream destroyed --
// at any moment after it was added.
class GpuOpTracker {
 public:
  struct Entry {
    std::unique_ptr<TransferOp> op;
    bool failed = false;
    absl::Time enqueued;
    // A wait for "KV written" still pending at this time is released and the
    // operation reported failed. InfiniteFuture without such a wait.
    absl::Time wait_deadline = absl::InfiniteFuture();
    // Backend resources of the operation (a staging block); run by the one
    // who finishes it, after the stream passed it.
    std::function<void()> release;
  };
  // What the watchdog looks at, outside the lock: the import kept alive.
  struct Watched {
    uint64_t id;
    uint64_t op_id;
    std::shared_ptr<DeviceImport> import;
    bool wait_overdue;  // wait_deadline has passed
    uint64_t wait_value;
  };

  // Counts an operation of `owner` as in flight (before its copies are
  // enqueued, so AwaitIdle cannot pass in between).
  void Begin(OwnerTag owner) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes ownership of `entry` and returns its id.
  uint64_t Add(std::unique_ptr<Entry> entry) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes operation `id` out; null if someone else already did.
  std::unique_ptr<Entry> Take(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes every operation out (the context failed).
  std::vector<std::unique_ptr<Entry>> TakeAll() ABSL_LOCKS_EXCLUDED(mu_);
  // The operations in flight, each with its own reference to its import.
  std::vector<Watched> Watch(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // An operation of `owner` has ended (after Begin). `on_idle` runs under
  // the lock when it was the owner's last, so that nothing of the owner can
  // Begin in between.
  void End(OwnerTag owner, const std::function<void()>& on_idle)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until no operation of `owner` (of anyone if nullopt) is in
  // flight, or `timeout` passed; true if idle.
  bool AwaitIdle(std::optional<OwnerTag> owner, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Entry>> ops_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<OwnerTag, uint32_t> in_flight_ ABSL_GUARDED_BY(mu_);
  uint32_t total_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

// Runs `fn` at most once, whoever calls first (the import's destructor or
// the code that failed to create it). Thread-safe.
class CloseOnce {
 public:
  CloseOnce() = default;
  explicit CloseOnce(std::function<void()> fn) : fn_(std::move(fn)) {}
  CloseOnce(const CloseOnce&) = delete;
  CloseOnce& operator=(const CloseOnce&) = delete;
  CloseOnce& operator=(CloseOnce&& other) ABSL_LOCKS_EXCLUDED(mu_) {
    std::function<void()> fn = other.Release();
    absl::MutexLock lock(&mu_);
    fn_ = std::move(fn);
    return *this;
  }
  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    std::function<void()> fn = Release();
    if (fn) fn();
  }

 private:
  std::function<void()> Release() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::function<void()> fn = std::move(fn_);
    fn_ = nullptr;
    return fn;
  }
  absl::Mutex mu_;
  std::function<void()> fn_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TRANSFER_GPU_OP_TRACKER_H_
