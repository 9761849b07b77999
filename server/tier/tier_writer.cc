#include "server/tier/tier_writer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/page_format.h"
#include "server/tier/tier_keys.h"
#include "server/tier/tier_value.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

constexpr size_t kMaxHitKeys = size_t{1} << 20;

}  // namespace

TierWriter::TierWriter(const TierConfig& config, PageTier* tier,
                       TierHealth* health, TierCounters* counters)
    : config_(config), tier_(tier), health_(health), counters_(counters) {
  if (config_.read_only) return;
  for (uint32_t i = 0; i < config_.write_threads; ++i) {
    threads_.emplace_back([this] { Run(); });
  }
}

TierWriter::~TierWriter() { Stop(); }

void TierWriter::OnPublished(const std::shared_ptr<HostPool>& pool,
                             absl::string_view name_space,
                             absl::Span<const absl::string_view> keys) {
  if (config_.read_only || config_.write_after_hits > 0 || keys.empty()) return;
  Enqueue(pool, name_space, keys);
}

void TierWriter::OnHits(const std::shared_ptr<HostPool>& pool,
                        absl::string_view name_space,
                        absl::Span<const absl::string_view> keys) {
  if (config_.read_only || config_.write_after_hits == 0 || keys.empty()) return;
  std::vector<absl::string_view> due;
  {
    absl::MutexLock lock(&mu_);
    if (hits_.size() > kMaxHitKeys) hits_.clear();
    for (absl::string_view key : keys) {
      uint32_t& hits = hits_[absl::StrCat(pool->name(), "\n", name_space.size(),
                                          ":", name_space, key)];
      if (hits < config_.write_after_hits && ++hits == config_.write_after_hits) {
        due.push_back(key);
      }
    }
  }
  if (!due.empty()) Enqueue(pool, name_space, due);
}

void TierWriter::Enqueue(const std::shared_ptr<HostPool>& pool,
                         absl::string_view name_space,
                         absl::Span<const absl::string_view> keys) {
  const uint64_t page_bytes = pool->geometry().page_bytes();
  uint64_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    for (absl::string_view key : keys) {
      if (stopping_ || !health_->writable() ||
          queued_bytes_ + page_bytes > config_.write_queue_bytes) {
        ++dropped;
        continue;
      }
      queue_.push_back({pool, std::string(name_space), std::string(key)});
      queued_bytes_ += page_bytes;
    }
    counters_->write_queue_pages.store(queue_.size());
    counters_->write_queue_bytes.store(queued_bytes_);
  }
  if (dropped > 0) {
    counters_->writes_dropped.fetch_add(dropped);
    spdlog::debug("tier {}: {} pages of pool '{}' not written ({})",
                  tier_->Describe(), dropped, pool->name(),
                  !health_->up() ? "tier down"
                  : !health_->writable() ? "tier full"
                                         : "write queue full");
  }
}

bool TierWriter::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && busy_ == 0;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void TierWriter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    counters_->writes_dropped.fetch_add(queue_.size());
    queue_.clear();
    queued_bytes_ = 0;
    counters_->write_queue_pages.store(0);
    counters_->write_queue_bytes.store(0);
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void TierWriter::Run() {
  for (;;) {
    std::vector<Item> batch;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      // One pool and namespace per batch (one ReferenceKeys call).
      const std::shared_ptr<HostPool> pool = queue_.front().pool;
      const std::string name_space = queue_.front().name_space;
      while (!queue_.empty() && batch.size() < config_.write_batch_pages &&
             queue_.front().pool == pool &&
             queue_.front().name_space == name_space) {
        queued_bytes_ -= queue_.front().pool->geometry().page_bytes();
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      ++busy_;
      counters_->write_queue_pages.store(queue_.size());
      counters_->write_queue_bytes.store(queued_bytes_);
    }
    WriteGroup(batch);
    absl::MutexLock lock(&mu_);
    --busy_;
  }
}

void TierWriter::WriteGroup(absl::Span<const Item> items) {
  HostPool& pool = *items.front().pool;
  const absl::string_view name_space = items.front().name_space;
  if (!health_->writable()) {
    counters_->writes_dropped.fetch_add(items.size());
    return;
  }
  const uint64_t fingerprint = PoolFingerprint(pool);
  // Stored as the namespace owner's values (published pages have one).
  const std::optional<std::string> scope =
      pool.namespaces().TierScopeOf(name_space);
  if (!scope.has_value()) {
    counters_->write_failures.fetch_add(items.size());
    spdlog::warn("tier {}: pages of namespace '{}' of pool '{}' not written: "
                 "the namespace has no owner", tier_->Describe(),
                 std::string(name_space), pool.name());
    return;
  }
  // Pages another node (or an earlier write) stored already are not sent
  // again: one round trip asks for the leading ones.
  std::vector<TierKey> all_keys;
  all_keys.reserve(items.size());
  for (const Item& item : items) {
    all_keys.push_back(ToTierKey(fingerprint, *scope, name_space, item.key));
  }
  // Its failure (e.g. a cluster master down) only means none is skipped:
  // the puts' own outcomes decide the tier's health.
  absl::StatusOr<uint64_t> stored = tier_->CountPrefix(all_keys);
  const size_t skip = stored.ok() ? std::min<size_t>(*stored, items.size()) : 0;
  counters_->already_stored.fetch_add(skip);
  items = items.subspan(skip);
  if (items.empty()) return;
  std::vector<absl::string_view> keys;
  keys.reserve(items.size());
  for (const Item& item : items) keys.push_back(item.key);
  absl::StatusOr<std::vector<uint64_t>> pages =
      pool.cache().ReferenceKeys(name_space, keys, kTierOwner);
  if (!pages.ok()) {
    counters_->write_failures.fetch_add(items.size());
    spdlog::warn("tier {}: pages of pool '{}' not written: {}",
                 tier_->Describe(), pool.name(), pages.status().ToString());
    return;
  }
  const PoolGeometry& g = pool.geometry();
  // The digests taken at publish: a page whose bytes no longer match is
  // not written (nor served again).
  const std::vector<std::optional<uint32_t>> digests = pool.cache().DigestsOf(*pages);
  std::vector<TierKey> tier_keys;
  std::vector<std::string> values;
  std::vector<PageRun> held;
  uint64_t mismatched = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t page = (*pages)[i];
    if (page == PageCache::kNotCached) continue;
    held.push_back({page, 1});
    std::string value = FrameValueFilled(
        fingerprint, g.page_bytes(),
        [&](char* flat) {
          CopyPageToFlat(g, pool.base(), page, reinterpret_cast<uint8_t*>(flat));
        },
        ValueBinding(all_keys[skip + i]));
    if (digests[i].has_value() && FrameChecksum(value) != *digests[i]) {
      pool.cache().DropMismatched(name_space, keys[i], page);
      ++mismatched;
      continue;
    }
    tier_keys.push_back(std::move(all_keys[skip + i]));
    values.push_back(std::move(value));
  }
  if (mismatched > 0) {
    spdlog::warn("tier {}: {} pages of namespace '{}' of pool '{}' no longer match their "
                 "digests: not written, dropped from the cache", tier_->Describe(),
                 mismatched, std::string(name_space), pool.name());
  }
  counters_->writes_skipped.fetch_add(items.size() - values.size());
  if (!held.empty()) {
    if (absl::Status s = pool.cache().Release(kTierOwner, held).status();
        !s.ok()) {
      spdlog::error("tier writer: references on pool '{}' not dropped: {}",
                    pool.name(), s.ToString());
    }
  }
  if (values.empty()) return;
  std::vector<absl::string_view> views(values.begin(), values.end());
  const absl::Time start = absl::Now();
  std::vector<absl::Status> results = tier_->Put(tier_keys, views);
  counters_->put_latency.Record(absl::Now() - start);
  uint64_t ok = 0;
  uint64_t bytes = 0;
  absl::Status first_error;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok()) {
      ++ok;
      bytes += views[i].size();
    } else if (first_error.ok()) {
      first_error = results[i];
    }
  }
  counters_->written.fetch_add(ok);
  counters_->written_bytes.fetch_add(bytes);
  counters_->write_failures.fetch_add(results.size() - ok);
  // A store refusing writes for space is full; otherwise the tier is down
  // only when no item got an answer (see Fetch).
  absl::Status outcome = TierHealth::AnyAnswered(results);
  for (const absl::Status& result : results) {
    if (absl::IsResourceExhausted(result)) outcome = result;
  }
  health_->ReportWrite(outcome);
  if (!first_error.ok()) {
    spdlog::warn("tier {}: {} of {} pages of pool '{}' not written: {}",
                 tier_->Describe(), results.size() - ok, results.size(),
                 pool.name(), first_error.ToString());
  }
}

}  // namespace hostkv
