// The daemon's Prometheus metrics that count events (RPCs, transfers,
// allocation failures, session ends); metrics_endpoint.h serves them.
// Occupancy gauges are read from the daemon's state at scrape time by
// StateCollector. A null DaemonMetrics* is allowed everywhere: nothing is
// recorded.
#ifndef HOSTKV_SERVER_OPERATIONS_DAEMON_METRICS_H_
#define HOSTKV_SERVER_OPERATIONS_DAEMON_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/copy_plan.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace hostkv {

// Thread-safe.
class DaemonMetrics {
 public:
  explicit DaemonMetrics(std::shared_ptr<prometheus::Registry> registry);

  const std::shared_ptr<prometheus::Registry>& registry() const {
    return registry_;
  }

  void RecordRpc(const char* method, absl::StatusCode code);
  // One finished transfer: `bytes` copied in `copy_time`.
  void RecordTransfer(CopyDirection direction, CopyMechanism mechanism,
                      uint64_t bytes, absl::Duration copy_time);
  // A layer signalled `since_submit` after its operation was submitted.
  void RecordLayerReady(CopyDirection direction, absl::Duration since_submit);
  // reason: "pool_full", "bad_size".
  void RecordAllocFailure(const char* reason);
  // reason: "closed", "disconnected", "lease_expired", "not_resumed".
  void RecordSessionEnd(const char* reason);
  // A session adopted from the previous daemon was resumed by its client.
  void RecordSessionResumed();
  // One adoption of a previous daemon's state at start, with its counts.
  struct Adoption {
    uint64_t sessions = 0, pages_owned = 0, pages_cached = 0,
             pages_dropped = 0, keys_dropped = 0;
  };
  void RecordAdoption(const Adoption& adoption);

 private:
  prometheus::Counter& TransferCounter(prometheus::Family<prometheus::Counter>& f,
                                       CopyDirection d, CopyMechanism m);

  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Family<prometheus::Counter>& operations_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Histogram>& copy_seconds_;
  prometheus::Family<prometheus::Histogram>& throughput_;
  prometheus::Family<prometheus::Histogram>& layer_ready_;
  prometheus::Family<prometheus::Counter>& alloc_failures_;
  prometheus::Family<prometheus::Counter>& session_ends_;
  prometheus::Family<prometheus::Counter>& restarts_;
};

const char* DirectionName(CopyDirection direction);   // "load" / "backup"
const char* MechanismName(CopyMechanism mechanism);   // "kernel" / "direct"

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_DAEMON_METRICS_H_
