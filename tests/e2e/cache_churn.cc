#include "tests/e2e/cache_churn.h"

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hostkv/client.h"
#include "hostkv/shm_device_buffer.h"

namespace hostkv::testing {
namespace {

// The churn pool's geometry (ChurnPoolSpecText).
constexpr uint32_t kLayers = 2;
constexpr uint32_t kPageSize = 16;
constexpr uint64_t kStride = 2 * 32 * 2;  // 2 heads x 32 dims x bf16
constexpr uint64_t kPageBytes = 2 * kLayers * kPageSize * kStride;
constexpr uint64_t kDeviceSlots = 512;
// 64 chains of up to 8 pages: twice the pool's 257 pages, so that the
// cache fills the pool and allocations evict.
constexpr uint64_t kChains = 64;
constexpr uint64_t kChainPages = 8;
constexpr uint64_t kChainTokens = kChainPages * kPageSize;
// Where each kind of step puts its rows in the device buffers.
constexpr uint64_t kPublishSlots = 0;
constexpr uint64_t kLoadSlots = kChainTokens;
constexpr uint64_t kCopySlots = 2 * kChainTokens;

std::string Key(uint64_t chain, uint64_t page) {
  return absl::StrCat("chain-", chain, "/page-", page);
}

// Byte `b` of token `token` of a chain, plane kv, layer l: what every
// publisher of the chain's keys writes.
uint8_t Byte(uint64_t chain, uint32_t kv, uint32_t l, uint64_t token,
             uint64_t b) {
  return static_cast<uint8_t>(chain * 37 + kv * 7 + l * 13 + token * 3 + b + 1);
}

// Pages found or published with references, covering tokens [0, pages * 16)
// of `chain`.
struct Reference {
  uint64_t chain = 0;
  std::vector<PageRange> pages;
  uint64_t num_pages = 0;
};

class CacheChurner {
 public:
  CacheChurner(Client& client, std::string pool, uint64_t seed)
      : client_(client), pool_(std::move(pool)), rng_(seed) {}

  absl::Status Setup() {
    auto device = ShmDeviceBuffer::Create(2 * kLayers * kDeviceSlots * kStride);
    if (!device.ok()) return device.status();
    device_ = std::make_unique<ShmDeviceBuffer>(std::move(*device));
    std::vector<v1::DeviceBuffer> k, v;
    for (uint32_t l = 0; l < kLayers; ++l) {
      k.push_back(device_->Describe((2 * l) * kDeviceSlots * kStride,
                                    kDeviceSlots * kStride));
      v.push_back(device_->Describe((2 * l + 1) * kDeviceSlots * kStride,
                                    kDeviceSlots * kStride));
    }
    auto import = client_.RegisterDeviceBuffers(pool_, kDeviceSlots, k, v);
    if (!import.ok()) return import.status();
    import_ = *import;
    return absl::OkStatus();
  }

  void Step(CacheChurnResult& r) {
    ++r.churn.operations;
    switch (rng_() % 8) {
      case 0:
      case 1:
        return Publish(r);
      case 2:
      case 3:
        return LookupAndLoad(r);
      case 4:
        return LookupOnly(r);
      case 5:
        if (!refs_.empty())
          return CopyAndCheck(refs_[rng_() % refs_.size()], r);
        return LookupAndLoad(r);
      case 6:
        if (!refs_.empty()) return ReleaseOne(rng_() % refs_.size(), r);
        return Publish(r);
      default:
        return Pressure(r);
    }
  }

  void ReleaseAll(CacheChurnResult& r) {
    while (!refs_.empty()) ReleaseOne(refs_.size() - 1, r);
  }

 private:
  uint8_t* Row(uint32_t kv, uint32_t layer, uint64_t slot) {
    return device_->data() + ((2 * layer + kv) * kDeviceSlots + slot) * kStride;
  }
  void Fail(const std::string& what, CacheChurnResult& r) {
    if (++r.churn.unexpected_errors == 1) r.churn.first_error = what;
  }
  bool Expect(const absl::Status& s, const std::string& what,
              CacheChurnResult& r) {
    if (s.ok()) return true;
    Fail(absl::StrCat(what, ": ", s.ToString()), r);
    return false;
  }
  static bool PoolFull(const absl::Status& s) {
    return s.code() == absl::StatusCode::kResourceExhausted;
  }
  std::vector<std::string> ChainKeys(uint64_t chain) {
    std::vector<std::string> keys;
    for (uint64_t j = 0; j < kChainPages; ++j) keys.push_back(Key(chain, j));
    return keys;
  }

  // Loads `pages` (tokens [0, n) of `chain`) into the slots at `at`, cleared
  // first, and checks every byte of every layer as it is signalled.
  void LoadAndCheck(uint64_t chain, const std::vector<PageRange>& pages,
                    uint64_t at, CacheChurnResult& r) {
    const uint64_t tokens = CountTokens(pages, kPageSize);
    for (uint32_t kv = 0; kv < 2; ++kv)
      for (uint32_t l = 0; l < kLayers; ++l)
        std::memset(Row(kv, l, at), 0, tokens * kStride);
    auto op = client_.Load(pool_, import_, pages, {{at, tokens}});
    if (!Expect(op.status(), "load", r)) return;
    for (uint32_t l = 0; l < kLayers; ++l) {
      if (!Expect(client_.WaitLayer(*op, l), "wait layer", r)) return;
      for (uint32_t kv = 0; kv < 2; ++kv)
        for (uint64_t t = 0; t < tokens; ++t)
          for (uint64_t b = 0; b < kStride; ++b, ++r.churn.bytes_checked)
            r.churn.mismatches +=
                Row(kv, l, at + t)[b] != Byte(chain, kv, l, t, b);
    }
  }

  // Backs up pages 0..n-1 of a chain and publishes them, as a chain of
  // parents; with acquire, keeps the references to load later.
  void Publish(CacheChurnResult& r) {
    const uint64_t chain = rng_() % kChains;
    const uint64_t n = 1 + rng_() % kChainPages;
    const bool acquire = rng_() % 2 == 0;
    auto pages = client_.Alloc(pool_, n * kPageSize);
    if (!pages.ok()) {
      if (!PoolFull(pages.status())) Expect(pages.status(), "alloc", r);
      return;
    }
    for (uint32_t kv = 0; kv < 2; ++kv)
      for (uint32_t l = 0; l < kLayers; ++l)
        for (uint64_t t = 0; t < n * kPageSize; ++t)
          for (uint64_t b = 0; b < kStride; ++b)
            Row(kv, l, kPublishSlots + t)[b] = Byte(chain, kv, l, t, b);
    auto op = client_.Backup(pool_, import_, *pages,
                             {{kPublishSlots, n * kPageSize}});
    if (!Expect(op.status(), "backup", r) ||
        !Expect(client_.Wait(*op), "wait backup", r)) {
      Expect(client_.Free(pool_, *pages).status(), "free after a failed backup",
             r);
      return;
    }
    std::vector<CacheItem> items;
    uint64_t j = 0;
    for (const PageRange& run : *pages)
      for (uint64_t p = 0; p < run.num_pages; ++p, ++j)
        items.push_back({Key(chain, j), j == 0 ? "" : Key(chain, j - 1),
                         run.first_page + p});
    auto published =
        client_.Publish(pool_, kCacheChurnNamespace, items, acquire);
    if (!published.ok()) {
      if (PoolFull(published.status())) {  // reference limit
        Expect(client_.Free(pool_, *pages).status(), "free unpublished", r);
      } else {
        Expect(published.status(), "publish", r);
      }
      return;
    }
    if (published->items.size() != n ||
        published->cached + published->already_cached != n) {
      return Fail(
          absl::StrCat("publish of ", n, " pages: ", published->items.size(),
                       " results, ", published->cached, " cached, ",
                       published->already_cached, " already cached"),
          r);
    }
    Reference ref{chain, {}, n};
    for (size_t i = 0; i < n; ++i) {
      const PublishedPage& out = published->items[i];
      if (out.outcome == v1::PUBLISH_CACHED && out.page != items[i].page) {
        return Fail("PUBLISH_CACHED names another page than the item's", r);
      }
      if (out.outcome != v1::PUBLISH_CACHED &&
          out.outcome != v1::PUBLISH_ALREADY_CACHED) {
        return Fail(absl::StrCat("publish outcome ", out.outcome,
                                 " for distinct pages"),
                    r);
      }
      ref.pages.push_back({out.page, 1});
    }
    r.pages_published += published->cached;
    r.already_cached += published->already_cached;
    // Pages whose key was cached already stay ours: free them.
    const std::vector<PageRange> ours = PagesNotCached(items, *published);
    if (!ours.empty())
      Expect(client_.Free(pool_, ours).status(), "free not cached", r);
    if (acquire) KeepOrRelease(std::move(ref), r);
  }

  void KeepOrRelease(Reference ref, CacheChurnResult& r) {
    refs_.push_back(std::move(ref));
    if (refs_.size() > 3) ReleaseOne(0, r);
  }

  // Lookup with acquire of a whole chain; loads what it found and checks it.
  void LookupAndLoad(CacheChurnResult& r) {
    const uint64_t chain = rng_() % kChains;
    auto found =
        client_.Lookup(pool_, kCacheChurnNamespace, ChainKeys(chain), true);
    if (!found.ok()) {
      if (!PoolFull(found.status()))
        Expect(found.status(), "lookup acquire", r);
      return;
    }
    if (found->hits > kChainPages) return Fail("more hits than keys", r);
    if (found->hits == 0) return;
    r.hits += found->hits;
    LoadAndCheck(chain, found->pages, kLoadSlots, r);
    KeepOrRelease({chain, found->pages, found->hits}, r);
  }

  void LookupOnly(CacheChurnResult& r) {
    auto found = client_.Lookup(pool_, kCacheChurnNamespace,
                                ChainKeys(rng_() % kChains), false);
    if (!Expect(found.status(), "lookup", r)) return;
    if (found->hits > kChainPages) Fail("more hits than keys", r);
  }

  // CopyPages of referenced cached pages into pages of our own, which then
  // load as the chain's bytes; the cached pages load so too, still.
  void CopyAndCheck(const Reference& ref, CacheChurnResult& r) {
    auto own = client_.Alloc(pool_, ref.num_pages * kPageSize);
    if (!own.ok()) {
      if (!PoolFull(own.status())) Expect(own.status(), "alloc for copy", r);
      return;
    }
    auto copied = client_.CopyPages(pool_, ref.pages, *own);
    if (Expect(copied.status(), "copy pages", r)) {
      if (copied->pages != ref.num_pages ||
          copied->bytes != ref.num_pages * kPageBytes) {
        Fail(absl::StrCat("CopyPages of ", ref.num_pages, " pages answered ",
                          copied->pages, " pages, ", copied->bytes, " bytes"),
             r);
      }
      r.pages_copied += copied->pages;
      LoadAndCheck(ref.chain, *own, kCopySlots, r);
      LoadAndCheck(ref.chain, ref.pages, kLoadSlots, r);
    }
    Expect(client_.Free(pool_, *own).status(), "free copy", r);
  }

  // Drops a reference, after checking that the cached page is not ours to
  // free (FailedPrecondition, nothing freed).
  void ReleaseOne(size_t i, CacheChurnResult& r) {
    const Reference ref = refs_[i];
    refs_.erase(refs_.begin() + i);
    const absl::Status refused =
        client_.Free(pool_, {{ref.pages[0].first_page, 1}}).status();
    if (refused.code() != absl::StatusCode::kFailedPrecondition) {
      Fail(absl::StrCat("Free of a cached page: ", refused.ToString()), r);
    }
    auto released = client_.Release(pool_, ref.pages);
    if (!Expect(released.status(), "release", r)) return;
    if (*released != ref.num_pages) {
      Fail(absl::StrCat("Release of ", ref.num_pages, " references dropped ",
                        *released),
           r);
    }
  }

  // A large allocation, freed at once: evicts cached pages nobody
  // references when the free ones do not suffice.
  void Pressure(CacheChurnResult& r) {
    const uint64_t pages = 64 + rng_() % 128;
    auto got = client_.Alloc(pool_, pages * kPageSize);
    if (!got.ok()) {
      if (!PoolFull(got.status())) Expect(got.status(), "pressure alloc", r);
      return;
    }
    ++r.pressure_allocs;
    Expect(client_.Free(pool_, *got).status(), "pressure free", r);
  }

  Client& client_;
  const std::string pool_;
  std::mt19937_64 rng_;
  std::unique_ptr<ShmDeviceBuffer> device_;
  uint64_t import_ = 0;
  std::vector<Reference> refs_;  // at most 3, oldest first
};

}  // namespace

CacheChurnResult RunCacheChurn(const std::string& target,
                               const std::string& pool, uint64_t seed,
                               absl::Duration duration) {
  CacheChurnResult r;
  auto client = Client::Connect(target, absl::StrCat("cache-churn-", seed));
  if (!client.ok()) {
    r.churn.unexpected_errors = 1;
    r.churn.first_error = client.status().ToString();
    return r;
  }
  CacheChurner churner(**client, pool, seed);
  if (absl::Status s = churner.Setup(); !s.ok()) {
    r.churn.unexpected_errors = 1;
    r.churn.first_error = s.ToString();
    return r;
  }
  const absl::Time end = absl::Now() + duration;
  while (absl::Now() < end) churner.Step(r);
  churner.ReleaseAll(r);
  return r;
}

}  // namespace hostkv::testing
