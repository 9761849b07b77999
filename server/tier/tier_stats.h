// What the storage tier did (server/README.md, "Storage tiers"): counters and latency
// histograms, updated lock-free by the tier's writer and reader threads and
// read as one snapshot for GetPoolStats and /metrics.
#ifndef HOSTKV_SERVER_TIER_TIER_STATS_H_
#define HOSTKV_SERVER_TIER_TIER_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace hostkv {

// Upper bounds (seconds) of the latency buckets; a last bucket holds the
// rest.
inline constexpr std::array<double, 14> kTierLatencyBounds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};

struct LatencySnapshot {
  // counts[i]: calls that took at most kTierLatencyBounds[i] and more than
  // the bound before; counts.back(): the rest. Not cumulative.
  std::array<uint64_t, kTierLatencyBounds.size() + 1> counts{};
  uint64_t count = 0;
  double sum_seconds = 0;
};

class LatencyHistogram {
 public:
  void Record(absl::Duration elapsed);
  LatencySnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kTierLatencyBounds.size() + 1> counts_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

struct TierCountersSnapshot {
  // Write-behind, in pages: written; refused or failed by the store; not
  // queued (the queue was full, or the tier down); no longer cached when
  // their turn came (evicted); and bytes written (values, headers
  // included). Pages waiting now, and their bytes.
  uint64_t written = 0;
  uint64_t write_failures = 0;
  uint64_t writes_dropped = 0;
  uint64_t writes_skipped = 0;
  // Not written because the store had them already (another node's, or an
  // earlier write's).
  uint64_t already_stored = 0;
  uint64_t written_bytes = 0;
  uint64_t write_queue_pages = 0;
  uint64_t write_queue_bytes = 0;
  // Read-through, in keys asked for: found and brought in; not in the store;
  // found but refused (bad header, other geometry, checksum: never served);
  // the store did not answer (down, timeout); bytes read. Fetches a Lookup
  // stopped waiting for (their pages still arrive, for the next lookup);
  // values not brought in for lack of free pages.
  uint64_t read_hits = 0;
  uint64_t read_misses = 0;
  uint64_t read_corrupt = 0;
  uint64_t read_failures = 0;
  uint64_t read_bytes = 0;
  uint64_t fetches_late = 0;
  uint64_t fetch_no_space = 0;
  LatencySnapshot put_latency;  // per store call (a batch)
  LatencySnapshot get_latency;
};

// Thread-safe: every field is an atomic.
struct TierCounters {
  std::atomic<uint64_t> written{0};
  std::atomic<uint64_t> write_failures{0};
  std::atomic<uint64_t> writes_dropped{0};
  std::atomic<uint64_t> writes_skipped{0};
  std::atomic<uint64_t> already_stored{0};
  std::atomic<uint64_t> written_bytes{0};
  std::atomic<uint64_t> write_queue_pages{0};
  std::atomic<uint64_t> write_queue_bytes{0};
  std::atomic<uint64_t> read_hits{0};
  std::atomic<uint64_t> read_misses{0};
  std::atomic<uint64_t> read_corrupt{0};
  std::atomic<uint64_t> read_failures{0};
  std::atomic<uint64_t> read_bytes{0};
  std::atomic<uint64_t> fetches_late{0};
  std::atomic<uint64_t> fetch_no_space{0};
  LatencyHistogram put_latency;
  LatencyHistogram get_latency;

  TierCountersSnapshot Snapshot() const;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_TIER_STATS_H_
