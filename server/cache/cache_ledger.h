// A record of the page cache's keys kept outside the daemon's heap, so that
// a daemon started after this one can adopt them (server/state/pool_ledger.h,
// deploy/README.md "Restarts and upgrades").
#ifndef HOSTKV_SERVER_CACHE_CACHE_LEDGER_H_
#define HOSTKV_SERVER_CACHE_CACHE_LEDGER_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace hostkv {

// Written by PageCache with its lock held.
class CacheLedger {
 public:
  static constexpr uint64_t kNoParent = UINT64_MAX;
  virtual ~CacheLedger() = default;
  // `page` is now cached under (name_space, key), with `parent` (or
  // kNoParent); `use` orders pages by their last use (larger: later).
  virtual void RecordCached(uint64_t page, absl::string_view name_space,
                            absl::string_view key, uint64_t parent,
                            uint64_t use) = 0;
  // `page` is no longer cached.
  virtual void RecordEvicted(uint64_t page) = 0;
  // `page`, cached, has `digest` (server/cache/page_digest.h): a daemon
  // that adopts it checks its bytes against it first.
  virtual void RecordDigest(uint64_t page, uint32_t digest) = 0;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CACHE_CACHE_LEDGER_H_
