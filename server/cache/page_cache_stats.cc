// PageCache: counters, and CheckConsistency (every structure recomputed
// from the entries and compared with what the cache keeps incrementally).
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"
#include "server/cache/page_cache.h"
#include "server/cache/page_cache_entry.h"

namespace hostkv {
namespace {

template <typename... Parts>
absl::Status Broken(const Parts&... parts) {
  return absl::InternalError(absl::StrCat("page cache: ", parts...));
}

absl::Status CompareCounters(const std::string& what, const CacheCounters& want,
                             const CacheCounters& have) {
  if (want == have) return absl::OkStatus();
  return Broken(what, " counters: cached ", have.cached, " vs ", want.cached,
                ", referenced ", have.referenced, " vs ", want.referenced,
                ", evictable ", have.evictable, " vs ", want.evictable,
                ", hits ", have.hits, " vs ", want.hits, ", misses ",
                have.misses, " vs ", want.misses, ", evictions ",
                have.evictions, " vs ", want.evictions, ", already_cached ",
                have.already_cached, " vs ", want.already_cached,
                ", conflicts ", have.conflicts, " vs ", want.conflicts);
}

}  // namespace

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

uint64_t PageCache::MemoryBytes() const {
  absl::MutexLock lock(&mu_);
  // A SwissTable slot plus its control byte, and a group of cloned bytes.
  const uint64_t index =
      AllocatedSize(keys_.capacity() * (sizeof(uint32_t) + 1) + 16);
  uint64_t refs = 0;
  for (const auto& [session, held] : refs_) {
    refs += held.by_page.capacity() * (2 * sizeof(uint32_t) + 1) + 16;
  }
  return chunk_bytes_ + index + refs + chunks_.capacity() * sizeof(Chunk) +
         history_.MemoryBytes();
}

uint64_t PageCache::MaxMemoryBytes() const {
  absl::MutexLock lock(&mu_);
  const uint64_t index =
      AllocatedSize(keys_.capacity() * (sizeof(uint32_t) + 1) + 16);
  uint64_t chunks = 0;
  for (uint64_t first = 0; first < num_pages_; first += kChunkMask + 1) {
    const uint64_t entries = std::min<uint64_t>(kChunkMask + 1, num_pages_ - first);
    chunks += AllocatedSize(entries * sizeof(Entry));
  }
  return chunks + index + chunks_.capacity() * sizeof(Chunk) + history_.MaxMemoryBytes();
}

CacheStats PageCache::Stats() const {
  absl::MutexLock lock(&mu_);
  CacheStats stats;
  stats.total = total_;
  stats.namespaces.reserve(namespaces_.size());
  for (size_t i = 0; i < namespaces_.size(); ++i) {
    stats.namespaces.push_back({namespaces_[i].name, namespaces_[i].counters,
                                history_.CountersOf(static_cast<uint16_t>(i))});
  }
  stats.unknown_namespace = history_.CountersOf(MissHistory::kUnknownNamespace);
  return stats;
}

CacheCounters PageCache::CountersOf(absl::string_view name_space) const {
  absl::MutexLock lock(&mu_);
  auto it = namespace_ids_.find(name_space);
  return it == namespace_ids_.end() ? CacheCounters{}
                                    : namespaces_[it->second].counters;
}

absl::Status PageCache::CheckConsistency() const {
  absl::MutexLock lock(&mu_);
  return CheckConsistencyLocked();
}

absl::Status PageCache::CheckConsistencyLocked() const {
  // Entries in use (key_size > 0) are exactly the key index's.
  std::vector<CacheCounters> per_ns(namespaces_.size());
  absl::flat_hash_map<uint32_t, uint32_t> children;
  uint64_t in_use = 0, refs = 0, detached = 0, known = 0;
  for (uint64_t p = 0; p < num_pages_; ++p) {
    if (!CachedLocked(p)) continue;
    const auto page = static_cast<uint32_t>(p);
    const Entry& e = At(page);
    ++in_use;
    if (e.ns >= namespaces_.size()) return Broken("page ", page, " ns");
    const uint32_t found = FindLocked(KeyRef{e.ns, e.Key(), HashOf(e.ns, e.Key())});
    if (e.detached()) {
      ++detached;
      if (found == page) return Broken("detached page ", page, " found by its key");
    } else if (found != page) {
      return Broken("page ", page, " not found by its key");
    }
    if ((e.flags & Entry::kDigestKnown) != 0) ++known;
    if (e.parent != kNone) {
      if (!CachedLocked(e.parent) || At(e.parent).ns != e.ns) {
        return Broken("page ", page, " has a stale parent ", e.parent);
      }
      ++children[e.parent];
    }
    CacheCounters& c = per_ns[e.ns];
    ++c.cached;
    if (e.refs > 0) ++c.referenced;
    if (Evictable(e)) ++c.evictable;
    refs += e.refs;
  }
  if (in_use != keys_.size() + detached) {
    return Broken(in_use, " entries in use, ", keys_.size(), " keys, ", detached,
                  " detached");
  }
  if (detached != detached_ || known != digests_known_) {
    return Broken(detached, " detached, ", known, " digests; counted ", detached_, ", ",
                  digests_known_);
  }
  for (uint32_t page : keys_) {
    if (!CachedLocked(page)) return Broken("key of free page ", page);
  }
  for (uint64_t p = 0; p < num_pages_; ++p) {
    if (!CachedLocked(p)) continue;
    const auto page = static_cast<uint32_t>(p);
    auto it = children.find(page);
    const uint32_t want = it == children.end() ? 0 : it->second;
    if (At(page).children != want) {
      return Broken("page ", page, " counts ", At(page).children,
                    " children, has ", want);
    }
  }

  // The LRU list: exactly the evictable entries, links both ways.
  uint64_t listed = 0;
  uint32_t prev = kNone;
  for (uint32_t page = coldest_; page != kNone; page = At(page).hotter) {
    if (++listed > in_use || !CachedLocked(page)) {
      return Broken("LRU list runs through a free page or loops");
    }
    const Entry& e = At(page);
    if (e.colder != prev) return Broken("LRU page ", page, " colder link");
    if (!Evictable(e)) return Broken("LRU page ", page, " not evictable");
    prev = page;
  }
  if (prev != hottest_) return Broken("LRU hot end");
  if (listed != total_.evictable) {
    return Broken(listed, " pages listed, ", total_.evictable, " evictable");
  }

  // References: per session, and their sums per page.
  absl::flat_hash_map<uint32_t, uint64_t> held_refs;
  for (const auto& [session, held] : refs_) {
    uint64_t sum = 0;
    for (const auto& [page, count] : held.by_page) {
      if (count == 0 || !CachedLocked(page)) {
        return Broken("session ", session, " holds a bad reference");
      }
      sum += count;
      held_refs[page] += count;
    }
    if (sum != held.total || sum == 0) {
      return Broken("session ", session, " total ", held.total, " vs ", sum);
    }
  }
  for (uint64_t p = 0; p < num_pages_; ++p) {
    if (!CachedLocked(p)) continue;
    const auto page = static_cast<uint32_t>(p);
    auto it = held_refs.find(page);
    if ((it == held_refs.end() ? 0 : it->second) != At(page).refs) {
      return Broken("page ", page, " refs differ from the sessions'");
    }
  }
  if (refs != total_refs_) return Broken("total references");

  // Counters: per namespace, and their sum.
  CacheCounters sum;
  for (size_t i = 0; i < namespaces_.size(); ++i) {
    const CacheCounters& have = namespaces_[i].counters;
    CacheCounters want = have;
    want.cached = per_ns[i].cached;
    want.referenced = per_ns[i].referenced;
    want.evictable = per_ns[i].evictable;
    RETURN_IF_ERROR(CompareCounters(namespaces_[i].name, want, have));
    sum.cached += have.cached;
    sum.referenced += have.referenced;
    sum.evictable += have.evictable;
    sum.hits += have.hits;
    sum.misses += have.misses;
    sum.evictions += have.evictions;
    sum.already_cached += have.already_cached;
    sum.conflicts += have.conflicts;
  }
  sum.misses += unknown_namespace_misses_;
  return CompareCounters("total", sum, total_);
}

}  // namespace hostkv
