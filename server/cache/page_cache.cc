#include "server/cache/page_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"
#include "server/cache/page_cache_entry.h"

namespace hostkv {

namespace {

constexpr uint64_t kMaxReferences = UINT32_MAX;

size_t HashKey(uint16_t ns, absl::string_view key) {
  return absl::Hash<std::pair<uint16_t, absl::string_view>>{}({ns, key});
}

absl::Status CheckNamespace(absl::string_view name_space) {
  if (name_space.empty() || name_space.size() > kMaxCacheNamespaceBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache namespace is ", name_space.size(), " bytes; namespaces are 1..",
        kMaxCacheNamespaceBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckKey(absl::string_view key, size_t index, bool parent) {
  if ((key.empty() && !parent) || key.size() > kMaxCacheKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(parent ? "parent key " : "cache key ", index, " is ",
                     key.size(), " bytes; keys are ", parent ? "0" : "1", "..",
                     kMaxCacheKeyBytes, " bytes"));
  }
  return absl::OkStatus();
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

size_t PageCache::KeyHash::operator()(uint32_t entry) const {
  const Entry& e = cache->AtUnchecked(entry);
  return HashKey(e.ns, e.Key());
}

size_t PageCache::KeyHash::operator()(const KeyRef& key) const {
  return HashKey(key.ns, key.key);
}

bool PageCache::KeyEq::operator()(uint32_t entry, const KeyRef& key) const {
  const Entry& e = cache->AtUnchecked(entry);
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
      keys_(0, KeyHash{this}, KeyEq{this}),
      page_entry_(num_pages, kNone) {
  // Room for every page at a load factor below 25/32, where the index
  // cleans its tombstones in place: it never grows (no rehash of millions of
  // entries while mu_ is held).
  static_assert(sizeof(Entry) == 104);
  keys_.reserve(num_pages + num_pages / 8 + 1);
  chunks_.reserve((num_pages >> kChunkBits) + 1);
}

PageCache::~PageCache() = default;

PageCache::Entry& PageCache::At(uint32_t index) {
  return chunks_[index >> kChunkBits][index & ((1u << kChunkBits) - 1)];
}

const PageCache::Entry& PageCache::At(uint32_t index) const {
  return chunks_[index >> kChunkBits][index & ((1u << kChunkBits) - 1)];
}

const PageCache::Entry& PageCache::AtUnchecked(uint32_t index) const {
  return chunks_[index >> kChunkBits][index & ((1u << kChunkBits) - 1)];
}

void PageCache::Count(uint16_t ns, uint64_t CacheCounters::*field,
                      int64_t delta) {
  namespaces_[ns].counters.*field += static_cast<uint64_t>(delta);
  total_.*field += static_cast<uint64_t>(delta);
}

// ---- LRU list and per-entry state -------------------------------------

bool PageCache::Evictable(const Entry& e) {
  return e.refs == 0 && e.children == 0;
}

void PageCache::LinkHot(uint32_t index) {
  Entry& e = At(index);
  e.colder = hottest_;
  e.hotter = kNone;
  if (hottest_ != kNone) {
    At(hottest_).hotter = index;
  } else {
    coldest_ = index;
  }
  hottest_ = index;
}

void PageCache::LinkCold(uint32_t index) {
  Entry& e = At(index);
  e.hotter = coldest_;
  e.colder = kNone;
  if (coldest_ != kNone) {
    At(coldest_).colder = index;
  } else {
    hottest_ = index;
  }
  coldest_ = index;
}

void PageCache::Unlink(uint32_t index) {
  Entry& e = At(index);
  if (e.colder != kNone) {
    At(e.colder).hotter = e.hotter;
  } else {
    coldest_ = e.hotter;
  }
  if (e.hotter != kNone) {
    At(e.hotter).colder = e.colder;
  } else {
    hottest_ = e.colder;
  }
}

void PageCache::Touch(uint32_t index) {
  Entry& e = At(index);
  e.last_use = ++clock_;
  if (Evictable(e) && index != hottest_) {
    Unlink(index);
    LinkHot(index);
  }
}

void PageCache::AddRef(uint32_t index) {
  Entry& e = At(index);
  if (e.refs++ == 0) {
    Count(e.ns, &CacheCounters::referenced, 1);
    if (e.children == 0) {
      Unlink(index);
      Count(e.ns, &CacheCounters::evictable, -1);
    }
  }
  ++total_refs_;
}

void PageCache::DropRefs(uint32_t index, uint32_t count) {
  Entry& e = At(index);
  e.refs -= count;
  total_refs_ -= count;
  if (e.refs == 0) {
    Count(e.ns, &CacheCounters::referenced, -1);
    e.last_use = ++clock_;
    if (e.children == 0) {
      LinkHot(index);
      Count(e.ns, &CacheCounters::evictable, 1);
    }
  }
}

void PageCache::AddChild(uint32_t parent) {
  Entry& p = At(parent);
  if (Evictable(p)) {
    Unlink(parent);
    Count(p.ns, &CacheCounters::evictable, -1);
  }
  ++p.children;
}

void PageCache::DropChild(uint32_t parent) {
  Entry& p = At(parent);
  if (--p.children > 0 || p.refs > 0) return;
  Count(p.ns, &CacheCounters::evictable, 1);
  // Sorted place at the cold end when the parent was used no later than
  // the coldest page; else the hot end (used recently, if not last).
  if (coldest_ == kNone || p.last_use <= At(coldest_).last_use) {
    LinkCold(parent);
  } else {
    LinkHot(parent);
  }
}

// ---- Publish ----------------------------------------------------------

absl::Status PageCache::CheckPublish(absl::string_view name_space,
                                     absl::Span<const PublishItem> items,
                                     bool acquire, OwnerTag session) const {
  RETURN_IF_ERROR(CheckNamespace(name_space));
  if (acquire && session == kNoOwner) {
    return absl::InvalidArgumentError("a reference needs a session");
  }
  for (size_t i = 0; i < items.size(); ++i) {
    RETURN_IF_ERROR(CheckKey(items[i].key, i, false));
    RETURN_IF_ERROR(CheckKey(items[i].parent_key, i, true));
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

uint32_t PageCache::FindLocked(uint16_t ns, absl::string_view key) const {
  auto it = keys_.find(KeyRef{ns, key});
  return it == keys_.end() ? kNone : *it;
}

uint32_t PageCache::InsertLocked(uint16_t ns, absl::string_view key,
                                 uint32_t parent, uint64_t page) {
  uint32_t index;
  if (free_entry_ != kNone) {
    index = free_entry_;
    free_entry_ = At(index).hotter;
  } else {
    index = next_fresh_entry_++;
    if ((index & ((1u << kChunkBits) - 1)) == 0) {
      chunks_.emplace_back(new Entry[size_t{1} << kChunkBits]);
    }
  }
  Entry& e = At(index);
  e.last_use = ++clock_;
  e.page = static_cast<uint32_t>(page);
  e.parent = parent;
  e.children = 0;
  e.refs = 0;
  e.ns = ns;
  e.key_size = static_cast<uint8_t>(key.size());
  std::memcpy(e.key, key.data(), key.size());
  keys_.insert(index);
  page_entry_[page] = index;
  if (parent != kNone) AddChild(parent);
  LinkHot(index);
  Count(ns, &CacheCounters::cached, 1);
  Count(ns, &CacheCounters::evictable, 1);
  return index;
}

PublishResult PageCache::PublishOneLocked(uint16_t ns, const PublishItem& item,
                                          uint32_t* entry) {
  *entry = kNone;
  if (page_entry_[item.page] != kNone) {
    Count(ns, &CacheCounters::conflicts, 1);
    return {PublishOutcome::kConflict, item.page};
  }
  const uint32_t found = FindLocked(ns, item.key);
  if (found != kNone) {
    Count(ns, &CacheCounters::already_cached, 1);
    *entry = found;
    return {PublishOutcome::kAlreadyCached, At(found).page};
  }
  const uint32_t parent =
      item.parent_key.empty() ? kNone : FindLocked(ns, item.parent_key);
  *entry = InsertLocked(ns, item.key, parent, item.page);
  return {PublishOutcome::kCached, item.page};
}

absl::StatusOr<std::vector<PublishResult>> PageCache::Publish(
    absl::string_view name_space, absl::Span<const PublishItem> items,
    bool acquire, OwnerTag session) {
  RETURN_IF_ERROR(CheckPublish(name_space, items, acquire, session));
  absl::MutexLock lock(&mu_);
  if (acquire && total_refs_ + items.size() > kMaxReferences) {
    return absl::ResourceExhaustedError("too many references on the cache");
  }
  ASSIGN_OR_RETURN(const uint16_t ns, InternLocked(name_space));
  std::vector<PublishResult> results(items.size());
  std::vector<uint32_t> entries(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    results[i] = PublishOneLocked(ns, items[i], &entries[i]);
  }
  // Last item first, so that the first ends up hottest.
  SessionRefs* held = acquire ? &refs_[session] : nullptr;
  for (size_t i = items.size(); i-- > 0;) {
    if (entries[i] == kNone) continue;
    if (held != nullptr) {
      AddRef(entries[i]);
      ++held->by_entry[entries[i]];
      ++held->total;
    }
    Touch(entries[i]);
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

// ---- Lookup and references --------------------------------------------

absl::StatusOr<LookupResult> PageCache::Lookup(
    absl::string_view name_space, absl::Span<const absl::string_view> keys,
    bool acquire, OwnerTag session) {
  RETURN_IF_ERROR(CheckNamespace(name_space));
  if (acquire && session == kNoOwner) {
    return absl::InvalidArgumentError("a reference needs a session");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    RETURN_IF_ERROR(CheckKey(keys[i], i, false));
  }
  LookupResult result;
  absl::MutexLock lock(&mu_);
  auto ns_it = namespace_ids_.find(name_space);
  if (ns_it == namespace_ids_.end()) {
    total_.misses += keys.size();
    unknown_namespace_misses_ += keys.size();
    return result;
  }
  const uint16_t ns = ns_it->second;
  std::vector<uint32_t> entries;
  entries.reserve(keys.size());
  for (absl::string_view key : keys) {
    const uint32_t index = FindLocked(ns, key);
    if (index == kNone) break;
    entries.push_back(index);
  }
  const size_t hits = entries.size();
  if (acquire && total_refs_ + hits > kMaxReferences) {
    return absl::ResourceExhaustedError("too many references on the cache");
  }
  Count(ns, &CacheCounters::hits, static_cast<int64_t>(hits));
  Count(ns, &CacheCounters::misses, static_cast<int64_t>(keys.size() - hits));
  result.hits = hits;
  result.pages.resize(hits);
  SessionRefs* held = acquire && hits > 0 ? &refs_[session] : nullptr;
  // Last hit first, so that the first ends up hottest.
  for (size_t i = hits; i-- > 0;) {
    const uint32_t index = entries[i];
    result.pages[i] = At(index).page;
    if (held != nullptr) {
      AddRef(index);
      ++held->by_entry[index];
      ++held->total;
    }
    Touch(index);
  }
  return result;
}

uint64_t PageCache::PagesIn(const std::vector<PageRun>& runs) {
  uint64_t pages = 0;
  for (const PageRun& run : runs) pages += run.num_pages;
  return pages;
}

absl::Status PageCache::CheckRuns(const std::vector<PageRun>& runs) const {
  for (const PageRun& run : runs) {
    if (run.num_pages == 0 || run.first_page >= num_pages_ ||
        run.num_pages > num_pages_ - run.first_page) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page run [", run.first_page, ", +", run.num_pages,
          ") is empty or outside the pool of ", num_pages_, " pages"));
    }
  }
  return absl::OkStatus();
}

uint64_t PageCache::TakeHeldLocked(SessionRefs& held,
                                   const std::vector<PageRun>& runs,
                                   uint64_t* refused) {
  uint64_t taken = 0;
  for (const PageRun& run : runs) {
    for (uint64_t page = run.first_page; page < run.first_page + run.num_pages;
         ++page) {
      const uint32_t index = page_entry_[page];
      auto it =
          index == kNone ? held.by_entry.end() : held.by_entry.find(index);
      if (it == held.by_entry.end() || it->second == 0) {
        *refused = page;
        return taken;
      }
      --it->second;
      ++taken;
    }
  }
  return taken;
}

void PageCache::UndoTakeLocked(SessionRefs& held,
                               const std::vector<PageRun>& runs,
                               uint64_t taken) {
  for (const PageRun& run : runs) {
    for (uint64_t i = 0; i < run.num_pages; ++i) {
      if (taken-- == 0) return;
      ++held.by_entry[page_entry_[run.first_page + i]];
    }
  }
}

void PageCache::DropTakenLocked(SessionRefs& held,
                                const std::vector<PageRun>& runs) {
  // Last page first, so that the first ends up hottest.
  for (size_t r = runs.size(); r-- > 0;) {
    for (uint64_t i = runs[r].num_pages; i-- > 0;) {
      const uint32_t index = page_entry_[runs[r].first_page + i];
      DropRefs(index, 1);
      auto it = held.by_entry.find(index);
      if (it != held.by_entry.end() && it->second == 0) {
        held.by_entry.erase(it);
      }
    }
  }
}

absl::StatusOr<uint64_t> PageCache::Release(OwnerTag session,
                                            const std::vector<PageRun>& runs) {
  RETURN_IF_ERROR(CheckRuns(runs));
  if (runs.empty()) return 0;
  absl::MutexLock lock(&mu_);
  auto session_it = refs_.find(session);
  if (session_it == refs_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "page ", runs[0].first_page, " is not referenced by this session"));
  }
  SessionRefs& held = session_it->second;
  // Take the session's counts down first: all of them, or none.
  uint64_t refused = 0;
  const uint64_t taken = TakeHeldLocked(held, runs, &refused);
  if (taken != PagesIn(runs)) {
    UndoTakeLocked(held, runs, taken);
    return absl::FailedPreconditionError(
        absl::StrCat("page ", refused, " is not referenced by this session",
                     taken > 0 ? " (or not as many times as listed)" : ""));
  }
  DropTakenLocked(held, runs);
  held.total -= taken;
  if (held.total == 0) refs_.erase(session_it);
  return taken;
}

uint64_t PageCache::ReleaseAll(OwnerTag session) {
  absl::MutexLock lock(&mu_);
  auto it = refs_.find(session);
  if (it == refs_.end()) return 0;
  for (const auto& [index, count] : it->second.by_entry) {
    DropRefs(index, count);
  }
  const uint64_t dropped = it->second.total;
  refs_.erase(it);
  return dropped;
}

// ---- Eviction ---------------------------------------------------------

uint64_t PageCache::EvictColdestLocked() {
  const uint32_t index = coldest_;
  Entry& e = At(index);
  // The next coldest is wanted next; its entry is likely not in cache.
  if (e.hotter != kNone) __builtin_prefetch(&At(e.hotter));
  Unlink(index);
  keys_.erase(index);
  page_entry_[e.page] = kNone;
  Count(e.ns, &CacheCounters::cached, -1);
  Count(e.ns, &CacheCounters::evictable, -1);
  Count(e.ns, &CacheCounters::evictions, 1);
  if (e.parent != kNone) DropChild(e.parent);
  e.hotter = free_entry_;
  free_entry_ = index;
  return e.page;
}

std::vector<uint64_t> PageCache::Evict(uint64_t max_pages) {
  std::vector<uint64_t> pages;
  absl::MutexLock lock(&mu_);
  pages.reserve(std::min(max_pages, total_.evictable));
  while (pages.size() < max_pages && coldest_ != kNone) {
    pages.push_back(EvictColdestLocked());
  }
  return pages;
}

// ---- Queries ----------------------------------------------------------

uint64_t PageCache::cached_pages() const {
  absl::MutexLock lock(&mu_);
  return total_.cached;
}

uint64_t PageCache::referenced_pages() const {
  absl::MutexLock lock(&mu_);
  return total_.referenced;
}

uint64_t PageCache::evictable_pages() const {
  absl::MutexLock lock(&mu_);
  return total_.evictable;
}

bool PageCache::IsCached(uint64_t page) const {
  if (page >= num_pages_) return false;
  absl::MutexLock lock(&mu_);
  return page_entry_[page] != kNone;
}

uint32_t PageCache::References(uint64_t page) const {
  if (page >= num_pages_) return 0;
  absl::MutexLock lock(&mu_);
  const uint32_t index = page_entry_[page];
  return index == kNone ? 0 : At(index).refs;
}

uint64_t PageCache::ReferencesHeldBy(OwnerTag session) const {
  absl::MutexLock lock(&mu_);
  auto it = refs_.find(session);
  return it == refs_.end() ? 0 : it->second.total;
}

CacheStats PageCache::Stats() const {
  absl::MutexLock lock(&mu_);
  CacheStats stats;
  stats.total = total_;
  stats.namespaces.reserve(namespaces_.size());
  for (const Namespace& n : namespaces_) {
    stats.namespaces.push_back({n.name, n.counters});
  }
  return stats;
}

CacheCounters PageCache::CountersOf(absl::string_view name_space) const {
  absl::MutexLock lock(&mu_);
  auto it = namespace_ids_.find(name_space);
  return it == namespace_ids_.end() ? CacheCounters{}
                                    : namespaces_[it->second].counters;
}

}  // namespace hostkv
