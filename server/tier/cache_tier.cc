#include "server/tier/cache_tier.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace hostkv {

absl::StatusOr<std::unique_ptr<CacheTier>> CacheTier::Open(
    const TierConfig& config) {
  absl::StatusOr<std::unique_ptr<PageTier>> store = OpenTier(config);
  if (!store.ok()) return store.status();
  auto tier = std::make_unique<CacheTier>(config, *std::move(store));
  spdlog::info("tier {}: {}; write-behind {} (queue {} bytes), read-through "
               "of up to {} pages per lookup within {}",
               tier->Describe(), tier->health().up() ? "serving" : "NOT serving",
               config.read_only ? "off (read-only)"
               : config.write_after_hits == 0
                   ? std::string("at publish")
                   : "after " + std::to_string(config.write_after_hits) + " hits",
               config.write_queue_bytes, config.fetch_pages,
               absl::FormatDuration(config.fetch_wait));
  return tier;
}

CacheTier::CacheTier(const TierConfig& config, std::unique_ptr<PageTier> store)
    : config_(config),
      store_(std::move(store)),
      health_(store_.get(), config.probe_interval),
      writer_(config, store_.get(), &health_, &counters_),
      reader_(config, store_.get(), &health_, &counters_) {}

CacheTier::~CacheTier() { Stop(); }

void CacheTier::Stop() {
  writer_.Stop();
  reader_.Stop();
}

}  // namespace hostkv
