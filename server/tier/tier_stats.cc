#include "server/tier/tier_stats.h"

#include <algorithm>

namespace hostkv {

void LatencyHistogram::Record(absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  const size_t bucket =
      std::lower_bound(kTierLatencyBounds.begin(), kTierLatencyBounds.end(),
                       seconds) -
      kTierLatencyBounds.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Nanoseconds(elapsed))),
      std::memory_order_relaxed);
}

LatencySnapshot LatencyHistogram::Snapshot() const {
  LatencySnapshot s;
  for (size_t i = 0; i < counts_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
  }
  s.count = count_.load(std::memory_order_relaxed);
  s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

TierCountersSnapshot TierCounters::Snapshot() const {
  TierCountersSnapshot s;
  s.written = written.load();
  s.write_failures = write_failures.load();
  s.writes_dropped = writes_dropped.load();
  s.writes_skipped = writes_skipped.load();
  s.already_stored = already_stored.load();
  s.written_bytes = written_bytes.load();
  s.write_queue_pages = write_queue_pages.load();
  s.write_queue_bytes = write_queue_bytes.load();
  s.read_hits = read_hits.load();
  s.read_misses = read_misses.load();
  s.read_corrupt = read_corrupt.load();
  s.read_failures = read_failures.load();
  s.read_bytes = read_bytes.load();
  s.fetches_late = fetches_late.load();
  s.fetch_no_space = fetch_no_space.load();
  s.put_latency = put_latency.Snapshot();
  s.get_latency = get_latency.Snapshot();
  return s;
}

}  // namespace hostkv
