// The storage tier under the page caches of every pool (server/README.md, "Storage
// tiers"): the store (PageTier), whether it answers (TierHealth), the
// write-behind of published pages (TierWriter), the read-through of lookup
// misses (TierReader) and their counters. The request layer calls it; it
// never blocks a host-memory operation on the store: writes are queued,
// and a lookup waits for a fetch only up to its deadline.
#ifndef HOSTKV_SERVER_TIER_CACHE_TIER_H_
#define HOSTKV_SERVER_TIER_CACHE_TIER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/tier/page_tier.h"
#include "server/tier/tier_config.h"
#include "server/tier/tier_health.h"
#include "server/tier/tier_keys.h"
#include "server/tier/tier_reader.h"
#include "server/tier/tier_stats.h"
#include "server/tier/tier_writer.h"

namespace hostkv {

class CacheTier {
 public:
  // Opens the store config.url names (OpenTier's errors; InvalidArgument
  // for a bad config) and starts the threads.
  static absl::StatusOr<std::unique_ptr<CacheTier>> Open(
      const TierConfig& config);
  // Over a store opened by the caller (tests).
  CacheTier(const TierConfig& config, std::unique_ptr<PageTier> store);
  ~CacheTier();  // Stop()
  CacheTier(const CacheTier&) = delete;
  CacheTier& operator=(const CacheTier&) = delete;

  const TierConfig& config() const { return config_; }
  std::string Describe() const { return store_->Describe(); }
  PageTier& store() { return *store_; }
  TierHealth& health() { return health_; }
  TierWriter& writer() { return writer_; }
  TierReader& reader() { return reader_; }
  TierCountersSnapshot Counters() const { return counters_.Snapshot(); }
  // A lookup stopped waiting for its fetch (its pages still arrive).
  void NoteLateFetch() { counters_.fetches_late.fetch_add(1); }

  // Stops the writer (dropping what is queued) and the reader. For the
  // daemon's shutdown, before the pools go. Idempotent.
  void Stop();

 private:
  const TierConfig config_;
  const std::unique_ptr<PageTier> store_;
  TierCounters counters_;
  TierHealth health_;
  TierWriter writer_;
  TierReader reader_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_CACHE_TIER_H_
