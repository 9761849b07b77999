// PageCache::CheckConsistency: every structure recomputed from the entries
// and compared with what the cache keeps incrementally.
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

absl::Status PageCache::CheckConsistency() const {
  absl::MutexLock lock(&mu_);
  return CheckConsistencyLocked();
}

absl::Status PageCache::CheckConsistencyLocked() const {
  // Entries in use are exactly the key index's.
  std::vector<CacheCounters> per_ns(namespaces_.size());
  absl::flat_hash_map<uint32_t, uint32_t> children;
  uint64_t refs = 0;
  auto in_use = [&](uint32_t index) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return index < next_fresh_entry_ && At(index).page < num_pages_ &&
           page_entry_[At(index).page] == index;
  };
  for (uint32_t index : keys_) {
    if (!in_use(index)) return Broken("entry ", index, " not indexed by page");
    const Entry& e = At(index);
    if (e.ns >= namespaces_.size()) return Broken("entry ", index, " ns");
    if (FindLocked(e.ns, e.Key()) != index) {
      return Broken("entry ", index, " not found by its key");
    }
    if (e.parent != kNone) {
      if (!in_use(e.parent) || At(e.parent).ns != e.ns) {
        return Broken("entry ", index, " has a stale parent ", e.parent);
      }
      ++children[e.parent];
    }
    CacheCounters& c = per_ns[e.ns];
    ++c.cached;
    if (e.refs > 0) ++c.referenced;
    if (Evictable(e)) ++c.evictable;
    refs += e.refs;
  }
  uint64_t indexed_pages = 0;
  for (uint32_t index : page_entry_) indexed_pages += index != kNone;
  if (indexed_pages != keys_.size()) {
    return Broken(indexed_pages, " pages indexed, ", keys_.size(), " keys");
  }
  for (uint32_t index : keys_) {
    auto it = children.find(index);
    const uint32_t want = it == children.end() ? 0 : it->second;
    if (At(index).children != want) {
      return Broken("entry ", index, " counts ", At(index).children,
                    " children, has ", want);
    }
  }

  // The LRU list: exactly the evictable entries, links both ways.
  uint64_t listed = 0;
  uint32_t prev = kNone;
  for (uint32_t index = coldest_; index != kNone; index = At(index).hotter) {
    if (++listed > keys_.size() || !in_use(index)) {
      return Broken("LRU list runs through a free entry or loops");
    }
    const Entry& e = At(index);
    if (e.colder != prev) return Broken("LRU entry ", index, " colder link");
    if (!Evictable(e)) return Broken("LRU entry ", index, " not evictable");
    prev = index;
  }
  if (prev != hottest_) return Broken("LRU hot end");
  if (listed != total_.evictable) {
    return Broken(listed, " entries listed, ", total_.evictable, " evictable");
  }

  // References: per session, and their sums per entry.
  absl::flat_hash_map<uint32_t, uint64_t> held_refs;
  for (const auto& [session, held] : refs_) {
    uint64_t sum = 0;
    for (const auto& [index, count] : held.by_entry) {
      if (count == 0 || !in_use(index)) {
        return Broken("session ", session, " holds a bad reference");
      }
      sum += count;
      held_refs[index] += count;
    }
    if (sum != held.total || sum == 0) {
      return Broken("session ", session, " total ", held.total, " vs ", sum);
    }
  }
  for (uint32_t index : keys_) {
    auto it = held_refs.find(index);
    if ((it == held_refs.end() ? 0 : it->second) != At(index).refs) {
      return Broken("entry ", index, " refs differ from the sessions'");
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
  RETURN_IF_ERROR(CompareCounters("total", sum, total_));

  // Free entries: the rest of those ever made.
  uint64_t free_entries = 0;
  for (uint32_t index = free_entry_; index != kNone; index = At(index).hotter) {
    if (++free_entries > next_fresh_entry_) return Broken("free list loops");
  }
  if (free_entries + keys_.size() != next_fresh_entry_) {
    return Broken(free_entries, " free + ", keys_.size(), " used entries of ",
                  next_fresh_entry_);
  }
  return absl::OkStatus();
}

}  // namespace hostkv
