#include "server/cache/page_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"
#include "server/cache/page_cache_entry.h"
#include "server/operations/crash_point.h"

namespace hostkv {

absl::Status CheckCacheNamespace(absl::string_view name_space) {
  if (name_space.empty() || name_space.size() > kMaxCacheNamespaceBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache namespace is ", name_space.size(), " bytes; namespaces are 1..",
        kMaxCacheNamespaceBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckCacheKey(absl::string_view key, size_t index, bool parent) {
  if ((key.empty() && !parent) || key.size() > kMaxCacheKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(parent ? "parent key " : "cache key ", index, " is ",
                     key.size(), " bytes; keys are ", parent ? "0" : "1", "..",
                     kMaxCacheKeyBytes, " bytes"));
  }
  return absl::OkStatus();
}

namespace {

constexpr uint64_t kMaxReferences = UINT32_MAX;

absl::Status NoSession() {
  return absl::InvalidArgumentError("a reference needs a session");
}

absl::Status TooManyReferences() {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the pool's cache holds its limit of ", kMaxReferences, " references"));
}

}  // namespace

std::vector<PageRun> ToPageRuns(absl::Span<const uint64_t> pages) {
  std::vector<PageRun> runs;
  for (uint64_t page : pages) {
    if (!runs.empty() &&
        runs.back().first_page + runs.back().num_pages == page) {
      ++runs.back().num_pages;
    } else {
      runs.push_back({page, 1});
    }
  }
  return runs;
}

size_t PageCache::HashOf(uint16_t ns, absl::string_view key) {
  return absl::Hash<std::pair<uint16_t, absl::string_view>>{}({ns, key});
}

uint64_t PageCache::KeyOnlyHash(absl::string_view key) {
  return absl::Hash<absl::string_view>{}(key);
}

size_t PageCache::KeyHash::operator()(uint32_t page) const {
  const Entry& e = cache->AtUnchecked(page);
  return HashOf(e.ns, e.Key());
}

bool PageCache::KeyEq::operator()(uint32_t page, const KeyRef& key) const {
  const Entry& e = cache->AtUnchecked(page);
  return e.ns == key.ns && e.Key() == key.key;
}

absl::StatusOr<std::unique_ptr<PageCache>> PageCache::Create(
    uint64_t num_pages) {
  if (num_pages == 0 || num_pages > kMaxCachePages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a page cache holds 1..", kMaxCachePages, " pages, not ", num_pages));
  }
  return std::unique_ptr<PageCache>(new PageCache(num_pages));
}

PageCache::PageCache(uint64_t num_pages)
    : num_pages_(num_pages),
      chunks_((num_pages + kChunkMask) >> kChunkBits),
      keys_(0, KeyHash{this}, KeyEq{this}),
      history_(MissHistory::SlotsFor(num_pages)) {
  static_assert(sizeof(Entry) == 104);
  // Room for every page at a load factor below 25/32, where the index
  // cleans its tombstones in place: it never grows (no rehash of millions of
  // entries while mu_ is held).
  keys_.reserve(num_pages + num_pages / 8 + 1);
}

PageCache::~PageCache() {
  if (charged_refs_ != 0 && charge_.release) {
    charge_.release(charged_refs_ * kReferenceBytes);
  }
}

absl::Status PageCache::ChargeReferences(uint64_t more) {
  if (more > kMaxReferences - total_refs_) return TooManyReferences();
  const uint64_t needed = total_refs_ + more;
  if (needed <= charged_refs_ || !charge_.reserve) return absl::OkStatus();
  const uint64_t steps = (needed - charged_refs_ + kChargeStep - 1) / kChargeStep;
  RETURN_IF_ERROR(charge_.reserve(steps * kChargeStep * kReferenceBytes));
  charged_refs_ += steps * kChargeStep;
  return absl::OkStatus();
}

void PageCache::UnchargeReferences() {
  if (!charge_.release || charged_refs_ < total_refs_ + 2 * kChargeStep) return;
  const uint64_t keep =
      (total_refs_ + kChargeStep - 1) / kChargeStep * kChargeStep + kChargeStep;
  charge_.release((charged_refs_ - keep) * kReferenceBytes);
  charged_refs_ = keep;
}

uint64_t PageCache::charged_references() const {
  absl::MutexLock lock(&mu_);
  return charged_refs_;
}

PageCache::Entry& PageCache::At(uint32_t page) {
  return chunks_[page >> kChunkBits][page & kChunkMask];
}

const PageCache::Entry& PageCache::At(uint32_t page) const {
  return chunks_[page >> kChunkBits][page & kChunkMask];
}

const PageCache::Entry& PageCache::AtUnchecked(uint32_t page) const {
  return chunks_[page >> kChunkBits][page & kChunkMask];
}

bool PageCache::CachedLocked(uint64_t page) const {
  return page < num_pages_ && chunks_[page >> kChunkBits] != nullptr &&
         At(static_cast<uint32_t>(page)).key_size > 0;
}

void PageCache::EnsureChunk(uint32_t page) {
  Chunk& chunk = chunks_[page >> kChunkBits];
  if (chunk != nullptr) return;
  const uint64_t first = page & ~uint64_t{kChunkMask};
  const uint64_t entries =
      std::min<uint64_t>(kChunkMask + 1, num_pages_ - first);
  // Zeroed: key_size 0, nothing cached.
  chunk.reset(static_cast<Entry*>(AllocateMaybeHuge(entries * sizeof(Entry))));
  chunk_bytes_ += AllocatedSize(entries * sizeof(Entry));
}

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
size_t AlignmentFor(size_t bytes) {
  return bytes >= kHugePage ? kHugePage : 64;
}
}  // namespace

size_t PageCache::AllocatedSize(size_t bytes) {
  const size_t align = AlignmentFor(bytes);
  return (bytes + align - 1) / align * align;
}

void* PageCache::AllocateMaybeHuge(size_t bytes) {
  const size_t size = AllocatedSize(bytes);
  void* p = std::aligned_alloc(AlignmentFor(bytes), size);
  if (p == nullptr) throw std::bad_alloc();
  if (size >= kHugePage) madvise(p, size, MADV_HUGEPAGE);  // a hint
  std::memset(p, 0, size);
  return p;
}

void PageCache::Prefetch(uint32_t page) const {
  if (page == kNone) return;
  // An entry spans two cache lines.
  const char* p = reinterpret_cast<const char*>(&At(page));
  __builtin_prefetch(p);
  __builtin_prefetch(p + sizeof(Entry) - 1);
}

void PageCache::Count(uint16_t ns, uint64_t CacheCounters::*field,
                      int64_t delta) {
  namespaces_[ns].counters.*field += static_cast<uint64_t>(delta);
  total_.*field += static_cast<uint64_t>(delta);
}

// ---- Publish ----------------------------------------------------------

absl::Status PageCache::CheckPublish(absl::string_view name_space,
                                     absl::Span<const PublishItem> items,
                                     bool acquire, OwnerTag session) const {
  RETURN_IF_ERROR(CheckCacheNamespace(name_space));
  if (acquire && session == kNoOwner) return NoSession();
  for (size_t i = 0; i < items.size(); ++i) {
    RETURN_IF_ERROR(CheckCacheKey(items[i].key, i, false));
    RETURN_IF_ERROR(CheckCacheKey(items[i].parent_key, i, true));
    if (items[i].page >= num_pages_) {
      return absl::InvalidArgumentError(
          absl::StrCat("page ", items[i].page, " of item ", i,
                       " is outside the pool of ", num_pages_, " pages"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint16_t> PageCache::InternLocked(absl::string_view name_space) {
  auto it = namespace_ids_.find(name_space);
  if (it != namespace_ids_.end()) return it->second;
  if (namespaces_.size() >= kMaxCacheNamespaces) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the pool's cache has its ", kMaxCacheNamespaces, " namespaces"));
  }
  const auto id = static_cast<uint16_t>(namespaces_.size());
  namespaces_.push_back({std::string(name_space), {}});
  namespace_ids_.emplace(std::string(name_space), id);
  return id;
}

uint32_t PageCache::FindLocked(const KeyRef& key) const {
  auto it = keys_.find(key);
  return it == keys_.end() ? kNone : *it;
}

PublishResult PageCache::PublishOneLocked(uint16_t ns, const PublishItem& item,
                                          size_t hash, uint32_t parent,
                                          uint32_t* page_out) {
  const auto page = static_cast<uint32_t>(item.page);
  *page_out = kNone;
  if (CachedLocked(page)) {
    Count(ns, &CacheCounters::conflicts, 1);
    return {PublishOutcome::kConflict, page};
  }
  // One probe finds the key or makes its slot. The entry is filled first:
  // probes compare keys through the entries.
  EnsureChunk(page);
  Entry& e = At(page);
  e.ns = ns;
  e.key_size = static_cast<uint8_t>(item.key.size());
  std::memcpy(e.key, item.key.data(), item.key.size());
  bool inserted = false;
  auto it = keys_.lazy_emplace(KeyRef{ns, item.key, hash},
                               [&](const auto& construct) {
                                 inserted = true;
                                 construct(page);
                               });
  if (!inserted) {
    e.key_size = 0;
    Count(ns, &CacheCounters::already_cached, 1);
    *page_out = *it;
    return {PublishOutcome::kAlreadyCached, *it};
  }
  e.last_use = ++clock_;
  e.parent = parent;
  e.children = 0;
  e.refs = 0;
  e.flags = 0;  // its digest comes after the publish (SetDigest)
  e.digest = 0;
  if (parent != kNone) AddChild(parent);
  LinkHot(page);
  if (ledger_ != nullptr) {
    ledger_->RecordCached(page, namespaces_[ns].name, item.key,
                          parent == kNone ? CacheLedger::kNoParent : parent,
                          e.last_use);
    CrashPoint("publish_item");
  }
  Count(ns, &CacheCounters::cached, 1);
  Count(ns, &CacheCounters::evictable, 1);
  history_.Published(ns, hash, KeyOnlyHash(item.key));
  *page_out = page;
  return {PublishOutcome::kCached, page};
}

absl::StatusOr<std::vector<PublishResult>> PageCache::Publish(
    absl::string_view name_space, absl::Span<const PublishItem> items,
    bool acquire, OwnerTag session) {
  RETURN_IF_ERROR(CheckPublish(name_space, items, acquire, session));
  absl::MutexLock lock(&mu_);
  if (acquire) RETURN_IF_ERROR(ChargeReferences(items.size()));
  ASSIGN_OR_RETURN(const uint16_t ns, InternLocked(name_space));
  const size_t n = items.size();
  std::vector<PublishResult> results(n);
  std::vector<uint32_t> pages(n);
  std::vector<size_t> hashes(n);
  for (size_t i = 0; i < n + kLookahead; ++i) {
    if (i < n) {
      hashes[i] = HashOf(ns, items[i].key);
      keys_.prefetch(KeyRef{ns, items[i].key, hashes[i]});
    }
    if (i < kLookahead) continue;
    const size_t j = i - kLookahead;
    const PublishItem& item = items[j];
    // The usual parent is the item before (a prompt's pages in order).
    uint32_t parent = kNone;
    if (j > 0 && pages[j - 1] != kNone && item.parent_key == items[j - 1].key) {
      parent = pages[j - 1];
    } else if (!item.parent_key.empty()) {
      parent =
          FindLocked(KeyRef{ns, item.parent_key, HashOf(ns, item.parent_key)});
    }
    results[j] = PublishOneLocked(ns, item, hashes[j], parent, &pages[j]);
  }
  // Last item first, so that the first ends up hottest.
  SessionRefs* held = acquire ? &refs_[session] : nullptr;
  for (size_t i = n; i-- > 0;) {
    if (pages[i] == kNone) continue;
    if (held != nullptr) AddRef(pages[i], *held);
    Touch(pages[i]);
  }
  if (held != nullptr && held->total == 0) refs_.erase(session);
  return results;
}

absl::StatusOr<PublishResult> PageCache::Publish(absl::string_view name_space,
                                                 absl::string_view key,
                                                 absl::string_view parent_key,
                                                 uint64_t page) {
  const PublishItem item{key, parent_key, page};
  ASSIGN_OR_RETURN(std::vector<PublishResult> results,
                   Publish(name_space, {item}, false, kNoOwner));
  return results[0];
}

// ---- Lookup -----------------------------------------------------------

absl::StatusOr<LookupResult> PageCache::Lookup(
    absl::string_view name_space, absl::Span<const absl::string_view> keys,
    bool acquire, OwnerTag session, bool count_misses) {
  RETURN_IF_ERROR(CheckCacheNamespace(name_space));
  if (acquire && session == kNoOwner) return NoSession();
  for (size_t i = 0; i < keys.size(); ++i) {
    RETURN_IF_ERROR(CheckCacheKey(keys[i], i, false));
  }
  LookupResult result;
  absl::MutexLock lock(&mu_);
  auto ns_it = namespace_ids_.find(name_space);
  if (ns_it == namespace_ids_.end()) {
    if (count_misses) {
      CountLookupLocked(MissHistory::kUnknownNamespace, name_space, keys, 0);
    }
    return result;
  }
  const uint16_t ns = ns_it->second;
  const size_t n = keys.size();
  std::vector<size_t> hashes(n);
  result.pages.reserve(n);
  for (size_t i = 0; i < n + kLookahead; ++i) {
    if (i < n) {
      hashes[i] = HashOf(ns, keys[i]);
      keys_.prefetch(KeyRef{ns, keys[i], hashes[i]});
    }
    if (i < kLookahead) continue;
    const size_t j = i - kLookahead;
    const uint32_t page = FindLocked(KeyRef{ns, keys[j], hashes[j]});
    if (page == kNone) break;
    result.pages.push_back(page);
    // Touch below will move it and its neighbours in the LRU list.
    const Entry& e = At(page);
    if (Evictable(e)) {
      Prefetch(e.colder);
      Prefetch(e.hotter);
    }
  }
  const size_t hits = result.pages.size();
  if (acquire) {
    if (absl::Status charged = ChargeReferences(hits); !charged.ok()) {
      if (n > 0) CountRefusedLocked(name_space, keys[0]);
      return charged;
    }
  }
  Count(ns, &CacheCounters::hits, static_cast<int64_t>(hits));
  if (count_misses) CountLookupLocked(ns, name_space, keys, hits);
  result.hits = hits;
  SessionRefs* held = acquire && hits > 0 ? &refs_[session] : nullptr;
  // Last hit first, so that the first ends up hottest.
  for (size_t i = hits; i-- > 0;) {
    const auto page = static_cast<uint32_t>(result.pages[i]);
    if (held != nullptr) AddRef(page, *held);
    Touch(page);
  }
  return result;
}

void PageCache::CountLookupMisses(absl::string_view name_space,
                                  absl::Span<const absl::string_view> keys, size_t hits) {
  absl::MutexLock lock(&mu_);
  const auto it = namespace_ids_.find(name_space);
  CountLookupLocked(it == namespace_ids_.end() ? MissHistory::kUnknownNamespace : it->second,
                    name_space, keys, hits);
}

void PageCache::CountLookupLocked(uint16_t ns, absl::string_view name_space,
                                  absl::Span<const absl::string_view> keys, size_t hits) {
  const size_t n = keys.size();
  if (ns == MissHistory::kUnknownNamespace) {
    total_.misses += n;
    unknown_namespace_misses_ += n;
    if (n > 0) {
      history_.CountLookup(ns, false);
      history_.CountMiss(ns, name_space, keys[0], history_.Explain(ns, 0, KeyOnlyHash(keys[0])),
                         absl::Now());
    }
    return;
  }
  Count(ns, &CacheCounters::misses, static_cast<int64_t>(n - hits));
  if (n == 0) return;
  history_.CountLookup(ns, hits > 0 || history_.EverPublished(HashOf(ns, keys[0])));
  if (hits < n) {
    history_.CountMiss(ns, name_space, keys[hits],
                       history_.Explain(ns, HashOf(ns, keys[hits]), KeyOnlyHash(keys[hits])),
                       absl::Now());
  }
}

absl::StatusOr<std::vector<uint64_t>> PageCache::ReferenceKeys(
    absl::string_view name_space, absl::Span<const absl::string_view> keys,
    OwnerTag holder) {
  RETURN_IF_ERROR(CheckCacheNamespace(name_space));
  if (holder == kNoOwner) return NoSession();
  for (size_t i = 0; i < keys.size(); ++i) {
    RETURN_IF_ERROR(CheckCacheKey(keys[i], i, false));
  }
  std::vector<uint64_t> pages(keys.size(), kNotCached);
  absl::MutexLock lock(&mu_);
  auto ns_it = namespace_ids_.find(name_space);
  if (ns_it == namespace_ids_.end()) return pages;
  RETURN_IF_ERROR(ChargeReferences(keys.size()));
  const uint16_t ns = ns_it->second;
  SessionRefs* held = nullptr;
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t page =
        FindLocked(KeyRef{ns, keys[i], HashOf(ns, keys[i])});
    if (page == kNone) continue;
    if (held == nullptr) held = &refs_[holder];
    AddRef(page, *held);
    pages[i] = page;
  }
  return pages;
}

// ---- Eviction ---------------------------------------------------------

void PageCache::EvictColdestLocked(size_t hash, uint32_t for_session, absl::Time now) {
  const uint32_t page = coldest_;
  Entry& e = At(page);
  Unlink(page);
  if (!e.detached()) {  // a detached entry's key went when it was detached
    keys_.erase(keys_.find(KeyRef{e.ns, e.Key(), hash}));
    evictions_.Record(e.ns, e.Key());
    history_.Evicted(e.ns, hash, for_session, now);
    if (ledger_ != nullptr) {
      ledger_->RecordEvicted(page);
      CrashPoint("evict");
    }
  }
  if ((e.flags & Entry::kDigestKnown) != 0) --digests_known_;
  const bool was_detached = e.detached();
  if (was_detached) --detached_;
  e.key_size = 0;
  e.flags = 0;
  Count(e.ns, &CacheCounters::cached, -1);
  Count(e.ns, &CacheCounters::evictable, -1);
  if (!was_detached) Count(e.ns, &CacheCounters::evictions, 1);
  if (e.parent != kNone) DropChild(e.parent);
}

EvictionList PageCache::ListEvictions(absl::string_view name_space,
                                      uint64_t after, uint32_t max_keys) const {
  absl::MutexLock lock(&mu_);
  const auto it = namespace_ids_.find(name_space);
  if (it == namespace_ids_.end()) return evictions_.Read(0, after, 0);
  return evictions_.Read(it->second, after, max_keys);
}

std::vector<uint64_t> PageCache::EvictForAllocation(uint64_t needed,
                                                     uint32_t for_session) {
  absl::MutexLock lock(&mu_);
  if (total_.cached - total_.referenced < needed) return {};
  return EvictLocked(needed, for_session);
}

std::vector<uint64_t> PageCache::Evict(uint64_t max_pages) {
  absl::MutexLock lock(&mu_);
  return EvictLocked(max_pages, 0);
}

std::vector<uint64_t> PageCache::EvictLocked(uint64_t max_pages, uint32_t for_session) {
  const absl::Time now = absl::Now();
  std::vector<uint64_t> pages;
  pages.reserve(std::min(max_pages, total_.evictable));
  while (pages.size() < max_pages && coldest_ != kNone) {
    const uint32_t page = coldest_;
    const Entry& e = At(page);
    // The next victim is (but for a parent this frees) the hotter
    // neighbour. Prefetching index slots further ahead measured no better
    // here (a 16-deep ring of hashed victims was slower at 10^7 pages).
    Prefetch(e.hotter);
    Prefetch(e.parent);
    EvictColdestLocked(HashOf(e.ns, e.Key()), for_session, now);
    pages.push_back(page);
  }
  return pages;
}

}  // namespace hostkv
