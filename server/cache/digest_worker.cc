#include "server/cache/digest_worker.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <utility>

#include "server/cache/page_digest.h"
#include "server/pool/host_pool.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// Whose references the worker holds on the pages it reads: the cache's own
// tag, which no session has.
constexpr OwnerTag kDigestHolder = kCacheOwner;

}  // namespace

DigestWorker::DigestWorker() : thread_([this] { Run(); }) {}

DigestWorker::~DigestWorker() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void DigestWorker::Enqueue(std::shared_ptr<HostPool> pool, absl::string_view name_space,
                           absl::Span<const uint64_t> pages,
                           absl::Span<const absl::string_view> keys) {
  if (pages.empty()) return;
  Job job{std::move(pool), std::string(name_space),
          std::vector<uint64_t>(pages.begin(), pages.end()), {}};
  job.keys.reserve(keys.size());
  for (absl::string_view key : keys) job.keys.emplace_back(key);
  absl::MutexLock lock(&mu_);
  if (queued_pages_ + pages.size() > kMaxQueuedPages) {
    if (dropped_pages_ == 0) {
      spdlog::warn("page digests: {} pages queued already; pages published past that stay "
                   "without a digest (never checked)", queued_pages_);
    }
    dropped_pages_ += pages.size();
    return;
  }
  queued_pages_ += pages.size();
  queue_.push_back(std::move(job));
}

void DigestWorker::Run() {
  // The lowest priority short of idle: on a busy node the engine's calls
  // (their request threads, the engine itself) go first, and digests are
  // taken in the gaps; SCHED_IDLE could leave them pending for good.
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19) != 0) {
    spdlog::debug("page digests: the digest thread keeps the daemon's priority");
  }
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    PageCache& cache = job.pool->cache();
    PageDigester digester(job.pool->geometry(), job.pool->base());
    for (size_t i = 0; i < job.pages.size(); ++i) {
      // One page at a time held against eviction while it is read (a key
      // evicted meanwhile is skipped; one cached again is read where it is).
      const absl::string_view key = job.keys[i];
      absl::StatusOr<std::vector<uint64_t>> held =
          cache.ReferenceKeys(job.name_space, absl::MakeConstSpan(&key, 1), kDigestHolder);
      if (!held.ok() || (*held)[0] == PageCache::kNotCached) continue;
      const uint64_t page = (*held)[0];
      cache.SetDigest(page, key, digester.Digest(page));
      cache.Release(kDigestHolder, {PageRun{page, 1}}).IgnoreError();
    }
    absl::MutexLock lock(&mu_);
    queued_pages_ -= job.pages.size();
  }
}

}  // namespace hostkv
