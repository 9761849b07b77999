// The entry and namespace records of PageCache, shared by its .cc files.
// Private to server/cache/.
#ifndef HOSTKV_SERVER_CACHE_PAGE_CACHE_ENTRY_H_
#define HOSTKV_SERVER_CACHE_PAGE_CACHE_ENTRY_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "server/cache/page_cache.h"

namespace hostkv {

// The cache's record of one page, at its page number; in use (the page is
// cached) when key_size > 0. 104 bytes; the key is stored here only.
struct PageCache::Entry {
  uint64_t last_use;  // clock_ at the last publish, lookup hit or release
  uint32_t parent;    // the parent's page, or kNone
  uint32_t children;  // cached entries whose parent this is
  uint32_t refs;      // references, all sessions
  // LRU neighbours (pages) while evictable, kNone at the ends.
  uint32_t colder;
  uint32_t hotter;
  // The page's digest (page_digest.h) once kDigestKnown is set: computed
  // after the publish that cached it, or carried by its tier value or
  // ledger record.
  uint32_t digest;
  uint16_t ns;
  uint8_t key_size;
  // kDigestKnown; kDetached: its key is out of the index (a digest
  // mismatch dropped it) while a reference or a cached child still holds
  // the page; it is no longer found, and evicted first once it may be.
  uint8_t flags;
  char key[kMaxCacheKeyBytes];

  static constexpr uint8_t kDigestKnown = 1;
  static constexpr uint8_t kDetached = 2;

  absl::string_view Key() const { return {key, key_size}; }
  bool detached() const { return (flags & kDetached) != 0; }
};

struct PageCache::Namespace {
  std::string name;
  CacheCounters counters;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CACHE_PAGE_CACHE_ENTRY_H_
