// A record of who owns each page of a pool, kept outside the daemon's heap
// so that a daemon started after this one can adopt the pool
// (server/state/pool_ledger.h, deploy/README.md "Restarts and upgrades").
#ifndef HOSTKV_SERVER_POOL_PAGE_LEDGER_H_
#define HOSTKV_SERVER_POOL_PAGE_LEDGER_H_

#include <cstdint>

#include "server/pool/slot_allocator.h"

namespace hostkv {

// Written by the allocator, with its lock held, whenever a page changes
// hands: `owner` is a session's tag, kCacheOwner, kTierOwner, kNoOwner (free
// and zeroed) or kUnscrubbedMark (freed, not yet zeroed).
class PageLedger {
 public:
  virtual ~PageLedger() = default;
  virtual void RecordOwner(uint64_t first_page, uint64_t num_pages,
                           OwnerTag owner) = 0;
  // `page` is being published by session `publisher`: a daemon that adopts
  // the ledger gives it to the cache if a cache record proves its key, else
  // back to the publisher (a crash in the middle of a Publish loses no page).
  virtual void RecordPublishing(uint64_t page, OwnerTag publisher) = 0;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_PAGE_LEDGER_H_
