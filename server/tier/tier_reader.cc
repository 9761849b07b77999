#include "server/tier/tier_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "kernels/page_format.h"
#include "server/cache/page_cache.h"
#include "server/tier/tier_value.h"
#include "server/tier/tier_keys.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

constexpr size_t kQueuedFetchesPerThread = 4;

std::vector<uint64_t> PagesOf(const std::vector<PageRun>& runs) {
  std::vector<uint64_t> pages;
  for (const PageRun& run : runs) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      pages.push_back(p);
    }
  }
  return pages;
}

}  // namespace

TierReader::TierReader(const TierConfig& config, PageTier* tier,
                       TierHealth* health, TierCounters* counters)
    : config_(config), tier_(tier), health_(health), counters_(counters) {
  for (uint32_t i = 0; i < config_.fetch_threads; ++i) {
    threads_.emplace_back([this] { Run(); });
  }
}

TierReader::~TierReader() { Stop(); }

std::shared_ptr<TierFetch> TierReader::Start(std::shared_ptr<HostPool> pool,
                                             std::string name_space,
                                             std::string parent_key,
                                             std::vector<std::string> keys,
                                             Principal who) {
  if (keys.empty() || !health_->up()) return nullptr;
  auto fetch = std::make_shared<TierFetch>();
  absl::MutexLock lock(&mu_);
  if (stopping_ ||
      queue_.size() >= kQueuedFetchesPerThread * config_.fetch_threads) {
    return nullptr;
  }
  queue_.push_back({fetch, std::move(pool), std::move(name_space),
                    std::move(parent_key), std::move(keys), std::move(who)});
  return fetch;
}

void TierReader::Stop() {
  std::deque<Job> abandoned;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    abandoned.swap(queue_);
  }
  for (Job& job : abandoned) job.fetch->done_.Notify();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void TierReader::Run() {
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
    job.fetch->published_ = health_->up() ? Fetch(job) : 0;
    job.fetch->done_.Notify();
  }
}

uint64_t TierReader::Fetch(const Job& job) {
  HostPool& pool = *job.pool;
  const uint64_t fingerprint = PoolFingerprint(pool);
  const uint64_t page_bytes = pool.geometry().page_bytes();
  // The values of the namespace's owner, or of the caller, who would own it
  // by publishing what is brought in: never another user's.
  const std::string scope = pool.namespaces().TierScope(job.name_space, job.who);
  std::vector<TierKey> tier_keys;
  tier_keys.reserve(job.keys.size());
  for (const std::string& key : job.keys) {
    tier_keys.push_back(ToTierKey(fingerprint, scope, job.name_space, key));
  }
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<std::string>> values = tier_->Get(tier_keys);
  counters_->get_latency.Record(absl::Now() - start);
  // The usable prefix; every key is counted by what became of it.
  std::vector<absl::string_view> pages;
  std::vector<uint32_t> digests;  // the values' checksums: the pages' digests
  std::vector<absl::Status> outcomes;
  uint64_t misses = 0, corrupt = 0, failures = 0, bytes = 0;
  std::vector<TierKey> damaged_keys;
  for (size_t i = 0; i < values.size(); ++i) {
    absl::Status status = values[i].status();
    outcomes.push_back(status);
    absl::StatusOr<absl::string_view> page;
    if (status.ok()) {
      bytes += values[i]->size();
      page = UnframeValue(*values[i], fingerprint, page_bytes, ValueBinding(tier_keys[i]));
      status = page.status();
    }
    if (status.ok() && pages.size() == i) {
      pages.push_back(*page);
      digests.push_back(FrameChecksum(*values[i]));
      continue;
    }
    if (!status.ok() && !absl::IsNotFound(status)) {
      // Its next miss says the tier failed it (hostkv why).
      pool.cache().NoteDropped(job.name_space, job.keys[i], MissReason::kTierFailed);
    }
    if (status.ok() || absl::IsNotFound(status)) {
      ++misses;  // absent, or present past the first gap (not served)
    } else if (absl::IsDataLoss(status)) {
      ++corrupt;
      pool.cache().CountTierRefused(1);
      // A damaged value (torn, corrupted) goes, so that the next writer of
      // the key replaces it; another writer's (version, geometry) stays.
      const bool damaged =
          !values[i].ok() || !IsForeignValue(*values[i], fingerprint);
      if (damaged) damaged_keys.push_back(tier_keys[i]);
      spdlog::warn("tier {}: the value of key {} in namespace '{}' (pool "
                   "'{}') is not served{}: {}",
                   tier_->Describe(), absl::BytesToHexString(job.keys[i]),
                   job.name_space, pool.name(),
                   damaged ? " and is deleted" : "",
                   std::string(status.message()));
    } else {
      ++failures;
    }
  }
  // One master of a cluster down fails its keys only: the tier is down
  // when no key got an answer.
  health_->Report(TierHealth::AnyAnswered(outcomes));
  if (!damaged_keys.empty()) {
    if (absl::Status s = tier_->Delete(damaged_keys); !s.ok()) {
      spdlog::warn("tier {}: damaged values not deleted: {}", tier_->Describe(),
                   s.ToString());
    }
  }
  counters_->read_misses.fetch_add(misses);
  counters_->read_corrupt.fetch_add(corrupt);
  counters_->read_failures.fetch_add(failures);
  counters_->read_bytes.fetch_add(bytes);
  if (pages.empty()) return 0;
  const uint64_t published = Publish(job, pages, digests);
  counters_->read_hits.fetch_add(published);
  return published;
}

uint64_t TierReader::Publish(const Job& job,
                             const std::vector<absl::string_view>& pages,
                             const std::vector<uint32_t>& digests) {
  HostPool& pool = *job.pool;
  if (absl::Status s =
          pool.namespaces().ClaimOrCheck(pool.name(), job.name_space, job.who);
      !s.ok()) {
    spdlog::debug("tier reader: pages for namespace '{}' of pool '{}' not "
                  "brought in: {}", job.name_space, pool.name(), s.ToString());
    return 0;
  }
  SlotAllocator& allocator = pool.allocator();
  PageCache& cache = pool.cache();
  // Free pages, and where they are short, the coldest unreferenced cached
  // pages, as an allocation takes them (the pages asked for now are hotter).
  const uint64_t unreferenced = cache.cached_pages() - cache.referenced_pages();
  const uint64_t n = std::min<uint64_t>(
      pages.size(), allocator.free_pages() + unreferenced);
  absl::StatusOr<std::vector<PageRun>> runs =
      n == 0 ? absl::ResourceExhaustedError("no free or evictable page")
             // Never waits for a pool still filling: a fetch it cannot
             // place now counts as no space.
             : allocator.Allocate(
                   n, kTierOwner,
                   [&cache](uint64_t needed) {
                     return cache.EvictForAllocation(needed);
                   },
                   absl::InfinitePast());
  if (!runs.ok()) {
    counters_->fetch_no_space.fetch_add(pages.size());
    return 0;
  }
  counters_->fetch_no_space.fetch_add(pages.size() - n);
  const std::vector<uint64_t> targets = PagesOf(*runs);
  for (size_t i = 0; i < targets.size(); ++i) {
    CopyFlatToPage(pool.geometry(),
                   reinterpret_cast<const uint8_t*>(pages[i].data()),
                   targets[i], pool.base());
  }
  const auto give_back = [&](const std::vector<PageRun>& back) {
    absl::Status s = allocator.Reclaim(back, kTierOwner).status();
    if (s.ok()) s = allocator.Free(back, kTierOwner).status();
    if (!s.ok()) {
      spdlog::error("tier reader: pages of pool '{}' not freed: {}",
                    pool.name(), s.ToString());
    }
  };
  if (absl::Status s = allocator.Cache(*runs, kTierOwner).status(); !s.ok()) {
    spdlog::error("tier reader: pages of pool '{}' not cached: {}",
                  pool.name(), s.ToString());
    if (s = allocator.Free(*runs, kTierOwner).status(); !s.ok()) {
      spdlog::error("tier reader: pages of pool '{}' not freed: {}",
                    pool.name(), s.ToString());
    }
    return 0;
  }
  std::vector<PublishItem> items(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    items[i] = {job.keys[i], i == 0 ? absl::string_view(job.parent_key)
                                    : absl::string_view(job.keys[i - 1]),
                targets[i]};
  }
  absl::StatusOr<std::vector<PublishResult>> results =
      pool.cache().Publish(job.name_space, items, /*acquire=*/false, kNoOwner);
  if (!results.ok()) {
    spdlog::warn("tier reader: pages for namespace '{}' of pool '{}' not "
                 "published: {}", job.name_space, pool.name(),
                 results.status().ToString());
    give_back(*runs);
    return 0;
  }
  // A key another fetch (or a publisher) cached meanwhile keeps its page.
  std::vector<uint64_t> unused;
  for (size_t i = 0; i < results->size(); ++i) {
    if ((*results)[i].outcome != PublishOutcome::kCached) {
      unused.push_back(targets[i]);
    } else {
      // The value's checksum, checked against its bytes: the page's digest.
      pool.cache().SetDigest(targets[i], job.keys[i], digests[i]);
    }
  }
  if (!unused.empty()) give_back(ToPageRuns(unused));
  return targets.size() - unused.size();
}

}  // namespace hostkv
