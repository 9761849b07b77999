// Read-through from the storage tier (server/README.md, "Storage tiers"): a Lookup
// that misses in host memory starts a fetch of the keys that follow its
// hits, and waits for it up to its deadline. A fetch asks the store for
// every key in one batch, keeps the values from the first key up to the
// first that is missing, unreadable or refused by its frame (tier_value.h:
// bad header, another geometry, a checksum that does not match: a miss,
// logged and counted, never served), copies them into free pages of the
// pool (where those are short, evicting the coldest unreferenced cached
// pages, as an allocation does) and publishes them under their keys, each
// the parent of the next. A fetch the lookup stopped waiting for still
// completes: its pages serve the next lookup.
#ifndef HOSTKV_SERVER_TIER_TIER_READER_H_
#define HOSTKV_SERVER_TIER_TIER_READER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/pool/host_pool.h"
#include "server/pool/pool_access.h"
#include "server/tier/page_tier.h"
#include "server/tier/tier_config.h"
#include "server/tier/tier_health.h"
#include "server/tier/tier_stats.h"

namespace hostkv {

// One fetch, shared by the lookup waiting for it and the thread running it.
class TierFetch {
 public:
  // True once the fetch is done (its pages published, or given up) by
  // `deadline`.
  bool WaitUntil(absl::Time deadline) {
    return done_.WaitForNotificationWithDeadline(deadline);
  }
  // Pages it published (valid once done).
  uint64_t published() const { return published_; }

 private:
  friend class TierReader;
  absl::Notification done_;
  uint64_t published_ = 0;
};

class TierReader {
 public:
  // Borrows tier, health and counters, which must outlive it.
  TierReader(const TierConfig& config, PageTier* tier, TierHealth* health,
             TierCounters* counters);
  ~TierReader();  // Stop()
  TierReader(const TierReader&) = delete;
  TierReader& operator=(const TierReader&) = delete;

  // Queues a fetch of `keys` into `pool` (the first one's parent is
  // parent_key, "" for none) for `who`, the lookup's caller: the pages are
  // published only if `who` may publish in the namespace (it claims one
  // nobody owns on this node, as its own publish would; a lookup whose
  // store has nothing claims nothing). Null, fetching nothing, while the
  // tier is down, when fetch_threads * 4 fetches are queued already, or
  // after Stop.
  std::shared_ptr<TierFetch> Start(std::shared_ptr<HostPool> pool,
                                   std::string name_space,
                                   std::string parent_key,
                                   std::vector<std::string> keys,
                                   Principal who) ABSL_LOCKS_EXCLUDED(mu_);

  // Abandons queued fetches (their waiters see them done, with nothing
  // published) and stops the threads after their current fetch.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    std::shared_ptr<TierFetch> fetch;
    std::shared_ptr<HostPool> pool;
    std::string name_space;
    std::string parent_key;
    std::vector<std::string> keys;
    Principal who;
  };

  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // The job's pages published (see the file comment).
  uint64_t Fetch(const Job& job);
  // Copies the values into free pages of the pool and publishes them, each
  // with its digest (the value's checked checksum); returns how many were
  // published.
  uint64_t Publish(const Job& job,
                   const std::vector<absl::string_view>& pages,
                   const std::vector<uint32_t>& digests);

  const TierConfig config_;
  PageTier* const tier_;
  TierHealth* const health_;
  TierCounters* const counters_;

  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_TIER_READER_H_
