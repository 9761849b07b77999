// The node's host-memory budget for pools, owned by the daemon: a pool that
// does not fit is refused before anything is created.
#ifndef HOSTKV_SERVER_POOL_MEMORY_BUDGET_H_
#define HOSTKV_SERVER_POOL_MEMORY_BUDGET_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace hostkv {

// Thread-safe.
class MemoryBudget {
 public:
  // Returns the bytes the system can still give (MemAvailable).
  using AvailableFn = std::function<uint64_t()>;

  // `budget_bytes` caps the sum of all pools (0: no cap beyond what is
  // available). `reserve_bytes` is kept free for everything else on the node,
  // as SGLang keeps 10 GiB.
  MemoryBudget(uint64_t budget_bytes, uint64_t reserve_bytes,
               AvailableFn available);

  // Reserves `bytes` for pool `what`. Returns ResourceExhausted, saying how
  // much was requested and how much is left and to shrink the pool, if it
  // exceeds the budget or the available memory minus the reserve.
  absl::Status Reserve(const std::string& what, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Release(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t budget_bytes() const { return budget_bytes_; }
  uint64_t reserved_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // What this process may still allocate: MemAvailable from /proc/meminfo,
  // capped by the cgroup (v2) limit minus the cgroup's usage when the daemon
  // runs in a container with a memory limit. 0 if unreadable.
  static uint64_t SystemAvailableBytes();

  // The cgroup's headroom from the texts of memory.max and memory.current;
  // UINT64_MAX when there is no limit ("max") or the texts do not parse.
  static uint64_t CgroupHeadroom(const std::string& max_text,
                                 const std::string& current_text);

 private:
  const uint64_t budget_bytes_;
  const uint64_t reserve_bytes_;
  const AvailableFn available_;

  mutable absl::Mutex mu_;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

// Bytes reserved from a MemoryBudget, given back when this dies. Move-only.
class BudgetReservation {
 public:
  BudgetReservation() = default;
  BudgetReservation(MemoryBudget* budget, uint64_t bytes)
      : budget_(budget), bytes_(bytes) {}
  BudgetReservation(BudgetReservation&& o) noexcept
      : budget_(std::exchange(o.budget_, nullptr)), bytes_(o.bytes_) {}
  BudgetReservation& operator=(BudgetReservation&& o) noexcept {
    if (this != &o) {
      if (budget_ != nullptr) budget_->Release(bytes_);
      budget_ = std::exchange(o.budget_, nullptr);
      bytes_ = o.bytes_;
    }
    return *this;
  }
  ~BudgetReservation() {
    if (budget_ != nullptr) budget_->Release(bytes_);
  }

 private:
  MemoryBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

// "12.5 GiB"-style text for logs and errors.
std::string FormatBytes(uint64_t bytes);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_MEMORY_BUDGET_H_
