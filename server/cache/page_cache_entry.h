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
// cached) when key_size > 0. 96 bytes; the key is stored here only.
struct PageCache::Entry {
  uint64_t last_use;  // clock_ at the last publish, lookup hit or release
  uint32_t parent;    // the parent's page, or kNone
  uint32_t children;  // cached entries whose parent this is
  uint32_t refs;      // references, all sessions
  // LRU neighbours (pages) while evictable, kNone at the ends.
  uint32_t colder;
  uint32_t hotter;
  uint16_t ns;
  uint8_t key_size;
  char key[kMaxCacheKeyBytes];

  absl::string_view Key() const { return {key, key_size}; }
};

struct PageCache::Namespace {
  std::string name;
  CacheCounters counters;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CACHE_PAGE_CACHE_ENTRY_H_
