#include "tests/e2e/tier_nodes.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hostkv::testing {
namespace {

constexpr uint32_t kPageTokens = 16;
constexpr uint64_t kPoolPages = 256;

// MHA, 4 layers, 2 KV heads of 64 bf16 values: 32 KiB pages.
v1::PoolSpec TierPoolSpec() {
  v1::PoolSpec spec;
  spec.set_name(kTierPool);
  spec.set_page_size(kPageTokens);
  spec.set_capacity_tokens(kPoolPages * kPageTokens);
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  spec.mutable_geometry()->mutable_mha()->set_num_layers(4);
  spec.mutable_geometry()->mutable_mha()->set_num_kv_heads(2);
  spec.mutable_geometry()->mutable_mha()->set_head_dim(64);
  return spec;
}

std::vector<std::string> DaemonArgs(const std::string& tier_url,
                                    std::vector<std::string> extra) {
  // Fast store timeouts; a lookup may wait long for its fetch (a slow,
  // sanitized daemon must not turn a hit into a miss).
  std::vector<std::string> args = {"--tier=" + tier_url, "--tier_timeout=300ms",
                                   "--tier_fetch_wait=5s"};
  for (std::string& arg : extra) args.push_back(std::move(arg));
  return args;
}

}  // namespace

std::string PageData(const std::string& key, uint64_t page_bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : key) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  std::string data(page_bytes, '\0');
  for (uint64_t i = 0; i < page_bytes; ++i) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    data[i] = static_cast<char>(h >> 56);
  }
  return data;
}

std::vector<std::string> ChainKeys(const std::string& prefix, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i)
    keys.push_back(absl::StrFormat("%s-%02d", prefix, i));
  return keys;
}

TierNode::TierNode(const std::string& tier_url,
                   std::vector<std::string> extra_args)
    : daemon_(DaemonArgs(tier_url, std::move(extra_args))) {
  if (!daemon_.started()) {
    error_ = "hostkvd did not start: " + daemon_.log();
    return;
  }
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(daemon_.target(), "engine");
  if (!client.ok()) {
    error_ = "connect: " + client.status().ToString();
    return;
  }
  engine_ = *std::move(client);
  absl::StatusOr<v1::Pool> pool = engine_->CreatePool(TierPoolSpec());
  if (!pool.ok()) {
    error_ = "CreatePool: " + pool.status().ToString();
    return;
  }
  page_bytes_ = pool->page_bytes();
}

absl::Status TierNode::PublishChain(const std::vector<std::string>& keys) {
  absl::StatusOr<std::vector<PageRange>> pages =
      engine_->Alloc(kTierPool, keys.size() * kPageTokens);
  if (!pages.ok()) return pages.status();
  std::string data;
  for (const std::string& key : keys) data += PageData(key, page_bytes_);
  if (absl::Status s = engine_->WritePages(kTierPool, *pages, data); !s.ok()) {
    return s;
  }
  std::vector<CacheItem> items;
  size_t i = 0;
  for (const PageRange& run : *pages) {
    for (uint64_t p = 0; p < run.num_pages; ++p, ++i) {
      items.push_back({keys[i], i == 0 ? "" : keys[i - 1], run.first_page + p});
    }
  }
  absl::StatusOr<PublishOutcomes> published =
      engine_->Publish(kTierPool, kTierNamespace, items);
  if (!published.ok()) return published.status();
  if (published->cached != keys.size()) {
    return absl::InternalError(
        absl::StrCat(published->cached, " of ", keys.size(), " keys cached"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> TierNode::LookupAndCheck(
    const std::vector<std::string>& keys) {
  absl::StatusOr<LookupResult> found =
      engine_->Lookup(kTierPool, kTierNamespace, keys, /*acquire=*/true);
  if (!found.ok()) return found.status();
  if (found->hits == 0) return 0;
  absl::StatusOr<std::string> read =
      engine_->ReadPages(kTierPool, found->pages);
  absl::Status released = engine_->Release(kTierPool, found->pages).status();
  if (!read.ok()) return read.status();
  if (!released.ok()) return released;
  if (read->size() != found->hits * page_bytes_) {
    return absl::InternalError(absl::StrCat(
        "read ", read->size(), " bytes for ", found->hits, " pages"));
  }
  for (uint64_t i = 0; i < found->hits; ++i) {
    if (read->compare(i * page_bytes_, page_bytes_,
                      PageData(keys[i], page_bytes_)) != 0) {
      return absl::DataLossError(
          absl::StrCat("the page of ", keys[i], " has other bytes"));
    }
  }
  return found->hits;
}

absl::Status TierNode::AllocAndFree() {
  absl::StatusOr<std::vector<PageRange>> pages =
      engine_->Alloc(kTierPool, kPageTokens);
  if (!pages.ok()) return pages.status();
  return engine_->Free(kTierPool, *pages).status();
}

v1::TierStats TierNode::Tier() {
  absl::StatusOr<v1::GetPoolStatsResponse> stats =
      engine_->GetPoolStats(kTierPool);
  return stats.ok() ? stats->tier() : v1::TierStats();
}

bool TierNode::WaitWritten(uint64_t n) {
  return PollUntil([&] { return Tier().written() >= n; });
}

bool TierNode::WaitTierHealth(bool serving) {
  return PollUntil([&] {
    absl::StatusOr<bool> health = CheckHealth(daemon_.target(), "hostkv.tier");
    return health.ok() && *health == serving;
  });
}

bool TierNode::WaitLog(const std::string& text) {
  return PollUntil([&] { return log().find(text) != std::string::npos; });
}

}  // namespace hostkv::testing
