// The command rings' share of the daemon: how many rings all users and each
// uid may hold, the memory of their segments (charged to the memory
// budget), and the CPU their threads may spend per uid. A ring holds a
// RingGrant for as long as its thread runs; the grant gives its count and
// memory back when it dies.
//
// Why a CPU share per uid: a ring call costs the daemon far more than the
// client (re-marking a slot submitted is a 4-byte store; the daemon copies
// and parses up to 256 KiB and runs the call), so the daemon measures the
// CPU each uid's ring threads use (calls and the spin after them) and makes
// a uid's rings wait once they used more than their share. A uid can then
// take no more than --ring_cpu_per_uid cores however it writes its rings.
#ifndef HOSTKV_SERVER_SERVICE_RING_QUOTA_H_
#define HOSTKV_SERVER_SERVICE_RING_QUOTA_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/pool/memory_budget.h"

namespace hostkv {

struct RingLimits {
  uint32_t max_rings = 256;         // all users together
  uint32_t max_rings_per_uid = 16;  // one uid's rings
  // Cores one uid's ring threads may use on average; 0: no bound.
  double cpu_per_uid = 1.0;
  // CPU a uid may use at once above its average (a burst of calls).
  absl::Duration cpu_burst = absl::Milliseconds(50);
  // How long a ring thread polls after a call before it sleeps.
  absl::Duration spin = absl::Microseconds(250);
};

// One uid's ring CPU: a bucket of CPU time filled at `cpu_per_uid` cores,
// at most `cpu_burst` full, that the uid's ring threads draw from; and at
// most ceil(cpu_per_uid) of the uid's calls run at once, so that its rings
// waking together (when the bucket refills) take no more CPUs than that.
// Thread-safe.
class RingCpuAccount {
 public:
  RingCpuAccount(double cores, absl::Duration burst);

  // Takes `cpu` (spent on this uid's rings) from the bucket; it may go
  // below zero.
  void Charge(absl::Duration cpu) ABSL_LOCKS_EXCLUDED(mu_);
  // How long the uid's rings must wait before they serve again: zero while
  // the bucket is not below zero (always zero without a bound).
  absl::Duration Overdrawn() ABSL_LOCKS_EXCLUDED(mu_);
  // CPU charged so far (tests, stats).
  absl::Duration charged() const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until fewer than ceil(cores) of the uid's calls run (at once
  // without a bound), or until `stopped()` (asked now and then) says so.
  // Returns true if the caller may run its call, and must then call
  // EndCall() after it; false if it stopped.
  bool BeginCall(absl::FunctionRef<bool()> stopped) ABSL_LOCKS_EXCLUDED(mu_);
  void EndCall() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Refill(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const double cores_;
  const absl::Duration burst_;
  const uint32_t max_running_;  // 0: no bound
  mutable absl::Mutex mu_;
  uint32_t running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration balance_ ABSL_GUARDED_BY(mu_);
  absl::Time filled_ ABSL_GUARDED_BY(mu_);
  absl::Duration charged_ ABSL_GUARDED_BY(mu_);
};

class RingQuota;
class RingThreads;

// One ring's place in the quota: its count, its memory reservation, its
// uid's CPU account and the uid's ring threads. Move-only; gives the count and memory back when it
// dies. A default-constructed grant counts nothing and bounds no CPU (rings
// started by tests).
class RingGrant {
 public:
  RingGrant() = default;
  RingGrant(RingGrant&&) noexcept = default;
  RingGrant& operator=(RingGrant&&) noexcept;
  ~RingGrant();

  // Null for a default-constructed grant.
  RingCpuAccount* cpu() const { return cpu_.get(); }
  const std::shared_ptr<RingThreads>& threads() const { return threads_; }

 private:
  friend class RingQuota;
  struct Shared;
  RingGrant(std::shared_ptr<Shared> quota, uid_t uid,
            std::shared_ptr<RingCpuAccount> cpu,
            std::shared_ptr<RingThreads> threads, BudgetReservation memory);
  void GiveBack();

  std::shared_ptr<Shared> quota_;
  uid_t uid_ = 0;
  std::shared_ptr<RingCpuAccount> cpu_;
  std::shared_ptr<RingThreads> threads_;
  BudgetReservation memory_;
};

// Thread-safe. Grants may outlive the quota.
class RingQuota {
 public:
  // `budget` may be null (no memory is charged).
  RingQuota(RingLimits limits, MemoryBudget* budget);

  // A ring of `segment_bytes` for `uid`. Returns ResourceExhausted if all
  // users' or this uid's rings are taken, or if the memory budget refuses
  // the segment.
  absl::StatusOr<RingGrant> Grant(uid_t uid, uint64_t segment_bytes);

  // Rings granted and not given back, of all users / of `uid`.
  uint32_t rings() const;
  uint32_t rings_of(uid_t uid) const;
  // The threads serving `uid`'s rings; null while it holds none.
  std::shared_ptr<RingThreads> threads_of(uid_t uid) const;

 private:
  const RingLimits limits_;
  MemoryBudget* const budget_;
  std::shared_ptr<RingGrant::Shared> shared_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_RING_QUOTA_H_
