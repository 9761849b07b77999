// Write-behind of published pages to the storage tier (server/README.md, "Storage
// tiers"): the request that published them only queues their keys; writer
// threads later reference each page (PageCache::ReferenceKeys, so that no
// eviction frees it mid-copy), copy it out framed (tier_value.h), drop the
// reference and store the batch. The queue is bounded in bytes: past the
// bound, or while the tier is down, a page is not queued (dropped, counted).
// A page evicted before its turn is skipped. With write_after_hits N > 0, a
// page is queued on its Nth lookup hit instead of at publish.
#ifndef HOSTKV_SERVER_TIER_TIER_WRITER_H_
#define HOSTKV_SERVER_TIER_TIER_WRITER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/pool/host_pool.h"
#include "server/tier/page_tier.h"
#include "server/tier/tier_config.h"
#include "server/tier/tier_health.h"
#include "server/tier/tier_stats.h"

namespace hostkv {

class TierWriter {
 public:
  // Borrows tier, health and counters, which must outlive it.
  TierWriter(const TierConfig& config, PageTier* tier, TierHealth* health,
             TierCounters* counters);
  ~TierWriter();  // Stop()
  TierWriter(const TierWriter&) = delete;
  TierWriter& operator=(const TierWriter&) = delete;

  // Keys just published in `pool` (only with write_after_hits 0).
  void OnPublished(const std::shared_ptr<HostPool>& pool,
                   absl::string_view name_space,
                   absl::Span<const absl::string_view> keys)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Keys a lookup found (counts hits with write_after_hits > 0).
  void OnHits(const std::shared_ptr<HostPool>& pool,
              absl::string_view name_space,
              absl::Span<const absl::string_view> keys) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until nothing is queued or being written, at most `timeout`;
  // false on timeout. For tests and shutdown.
  bool Flush(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops what is queued (counted as dropped) and stops the threads after
  // their current batch. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Item {
    std::shared_ptr<HostPool> pool;
    std::string name_space;
    std::string key;
  };

  void Enqueue(const std::shared_ptr<HostPool>& pool,
               absl::string_view name_space,
               absl::Span<const absl::string_view> keys)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Writes items (one pool and namespace).
  void WriteGroup(absl::Span<const Item> items);

  const TierConfig config_;
  PageTier* const tier_;
  TierHealth* const health_;
  TierCounters* const counters_;

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t busy_ ABSL_GUARDED_BY(mu_) = 0;  // threads writing a batch
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // write_after_hits > 0: hits per (pool, namespace, key) not yet written;
  // a written key stays at the bound. Cleared when it passes kMaxHitKeys.
  absl::flat_hash_map<std::string, uint32_t> hits_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_TIER_WRITER_H_
