// Whether the storage tier answers (server/README.md, "Storage tiers", failure): every
// store call's result feeds it, and a prober asks the store once per
// interval, so that a tier that went down is seen without traffic and one
// that came back is used again by itself. While it is down, lookups do not
// ask it (misses at once) and the writer drops its pages: host-memory
// operations never wait on a dead tier. Published as the health entry
// "hostkv.tier".
#ifndef HOSTKV_SERVER_TIER_TIER_HEALTH_H_
#define HOSTKV_SERVER_TIER_TIER_HEALTH_H_

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/tier/page_tier.h"

namespace hostkv {

class TierHealth {
 public:
  using Observer = std::function<void(bool up)>;

  // Probes `tier` once now (bounded by its timeouts), then every
  // probe_interval on a thread of its own. `tier` must outlive this.
  TierHealth(PageTier* tier, absl::Duration probe_interval);
  ~TierHealth();  // stops the prober
  TierHealth(const TierHealth&) = delete;
  TierHealth& operator=(const TierHealth&) = delete;

  // Called with the state now, then on every change (from the thread that
  // saw it). Must not call back into this object.
  void SetObserver(Observer observer) ABSL_LOCKS_EXCLUDED(mu_);

  // The store answers (lookups may ask it).
  bool up() const { return up_.load(std::memory_order_acquire); }
  // It answers and does not refuse writes for lack of space: what the
  // health entry says.
  bool serving() const { return up() && !full_.load(std::memory_order_acquire); }
  // The writer may send pages: up, and not full, or full for longer than
  // the probe interval (one batch tries again).
  bool writable() const;
  // The last error that took it down or made it full ("" while serving).
  std::string last_error() const ABSL_LOCKS_EXCLUDED(mu_);

  // A store call's outcome: Unavailable, DeadlineExceeded, Unauthenticated
  // and PermissionDenied say the store cannot be used (down); anything else
  // (OK, NotFound, DataLoss, a full store's ResourceExhausted) says it
  // answered (up).
  void Report(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // A write's outcome: ResourceExhausted (Redis OOM, a full filesystem)
  // makes the tier full (not serving, though lookups still read it) until a
  // write succeeds; anything else as Report.
  void ReportWrite(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  static bool MeansDown(const absl::Status& status);
  // Of one batch's per-item outcomes: OK if any item got an answer (a
  // cluster with one master down still serves the others' keys), else the
  // last item's error (Unavailable for an empty batch).
  static absl::Status AnyAnswered(absl::Span<const absl::Status> replies);

 private:
  // Asks the store for a few absent keys (see ProbeKeys); AnyAnswered.
  absl::Status Probe();
  void ProbeLoop();
  // Calls the observer if serving() changed. REQUIRES: mu_ held.
  void NotifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  PageTier* const tier_;
  const absl::Duration probe_interval_;
  std::atomic<bool> up_{false};
  std::atomic<bool> full_{false};
  std::atomic<int64_t> retry_write_at_ns_{0};  // absl::GetCurrentTimeNanos
  bool notified_serving_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Mutex mu_;
  Observer observer_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread prober_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_TIER_HEALTH_H_
