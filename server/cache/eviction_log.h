// The latest evictions of one page cache, in order: what ListEvictions
// tells a client that keeps its own picture of what is cached (vLLM's
// OffloadingManager reports removed blocks as events).
#ifndef HOSTKV_SERVER_CACHE_EVICTION_LOG_H_
#define HOSTKV_SERVER_CACHE_EVICTION_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace hostkv {

// Evictions kept per pool: 80 bytes each, 1.25 MiB in all, allocated at the
// first eviction.
inline constexpr uint32_t kEvictionLogEntries = 16384;
// Most keys one ListEvictions returns.
inline constexpr uint32_t kMaxEvictionsListed = 65536;

struct EvictionList {
  std::vector<std::string> keys;  // the namespace's, in eviction order
  uint64_t next = 0;              // the reader's `after` for its next call
  // Evictions (of any namespace) after `after` that left the log unread.
  uint64_t missed = 0;
};

// A ring of the last `capacity` evictions, numbered 1, 2, ... Not
// thread-safe: the page cache calls it under its lock.
class EvictionLog {
 public:
  explicit EvictionLog(uint32_t capacity = kEvictionLogEntries)
      : capacity_(capacity) {}

  // Records eviction number last() + 1 of `key` (1..64 bytes) in namespace
  // `ns` (the cache's id), dropping the oldest when full.
  void Record(uint16_t ns, absl::string_view key);

  // The keys of namespace `ns` evicted after number `after`, up to
  // max_keys (the rest follow from `next`). max_keys 0: none, and `next`
  // is last(), "from now on". An `after` past last() (a reader from before
  // a daemon restart) reads from the start.
  EvictionList Read(uint16_t ns, uint64_t after, uint32_t max_keys) const;

  // The number of the latest eviction (0: none yet).
  uint64_t last() const { return last_; }

 private:
  struct Entry {
    uint16_t ns = 0;
    uint8_t key_size = 0;
    char key[64];
  };
  // Entry of eviction number n (kept while n > last_ - capacity_).
  const Entry& At(uint64_t n) const { return entries_[(n - 1) % capacity_]; }

  const uint32_t capacity_;
  std::unique_ptr<Entry[]> entries_;
  uint64_t last_ = 0;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CACHE_EVICTION_LOG_H_
