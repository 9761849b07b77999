// The daemon's thread that takes the digests of published pages
// (page_digest.h) after the publish, off the engine's path: Publish queues
// the pages it cached and returns; the worker reads each page and hands its
// digest to the pool's page cache. A page's digest is pending until then:
// hits on it are served unchecked (counted as unverified), and a restart
// adopts it unchecked. While it reads a page the worker holds a reference
// on it (PageCache::ReferenceKeys, as the cache's own holder), so the page
// is not evicted and reused under it. The queue is bounded (kMaxQueuedPages); pages past
// it stay without a digest. The thread runs at nice 19, so that on a busy
// node it takes no CPU from the engine's calls.
#ifndef HOSTKV_SERVER_CACHE_DIGEST_WORKER_H_
#define HOSTKV_SERVER_CACHE_DIGEST_WORKER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace hostkv {

class HostPool;

// The daemon's digest flags (daemon_options.h).
struct PageDigestOptions {
  // Take a digest of every published page (--page_digests).
  bool enabled = true;
  // The share of hits whose bytes are checked against their digest before
  // Lookup returns them (--verify_hits, 0..1).
  double verify_hits = 0.01;
};

class DigestWorker {
 public:
  // ~100 bytes a queued page (its number and key): at most ~26 MiB.
  static constexpr uint64_t kMaxQueuedPages = uint64_t{1} << 18;

  DigestWorker();
  ~DigestWorker();  // stops: queued pages stay without a digest
  DigestWorker(const DigestWorker&) = delete;
  DigestWorker& operator=(const DigestWorker&) = delete;

  // Queues the pages just cached in `pool` under `keys` (one per page) in
  // `name_space`. Never waits for digest work (a short lock).
  void Enqueue(std::shared_ptr<HostPool> pool, absl::string_view name_space,
               absl::Span<const uint64_t> pages, absl::Span<const absl::string_view> keys)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    std::shared_ptr<HostPool> pool;
    std::string name_space;
    std::vector<uint64_t> pages;
    std::vector<std::string> keys;
  };
  void Run();

  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_pages_ ABSL_GUARDED_BY(mu_) = 0;  // in queue_ and the running job
  uint64_t dropped_pages_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CACHE_DIGEST_WORKER_H_
