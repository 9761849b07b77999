// The ledger of one pool: what a daemon started after this one needs to
// adopt the pool's pages and cached keys (deploy/README.md "Restarts and upgrades").
// It lives in its own memfd, which the state keeper (state_keeper.h) holds
// beside the pool's segment while no daemon runs.
//
// Layout: a 4 KiB header (format, the pool's spec and owner, a checksum);
// one 8-byte owner word per page (the owner's tag and a check of the page
// number and tag, so a torn or flipped word is found); one 224-byte cache
// record per page (namespace, key, parent, last use, the page's digest once
// known, checksummed). Words are
// stored whole, records checksum last: a daemon killed at any instant
// leaves each page either proven (as it was before or after the change) or
// unproven, and an unproven page is zeroed and freed, never served.
#ifndef HOSTKV_SERVER_STATE_POOL_LEDGER_H_
#define HOSTKV_SERVER_STATE_POOL_LEDGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/contract/shm_segment.h"
#include "hostkv/v1/hostkv.pb.h"
#include "server/cache/cache_ledger.h"
#include "server/cache/page_cache.h"
#include "server/pool/page_ledger.h"

namespace hostkv {

// Thread-safe as its writers are: RecordOwner under the allocator's lock,
// RecordCached/RecordEvicted under the page cache's (different words).
class PoolLedger final : public PageLedger, public CacheLedger {
 public:
  // A ledger for a new pool (every page free): a sealed-size memfd.
  static absl::StatusOr<std::unique_ptr<PoolLedger>> Create(
      const v1::PoolSpec& spec, const v1::PoolOwner& owner, uint64_t num_pages);
  // Maps the ledger behind `fd` (from the state keeper), checking its
  // header: FailedPrecondition naming what is wrong (truncated, another
  // format, a bad checksum).
  static absl::StatusOr<std::unique_ptr<PoolLedger>> Open(ScopedFd fd,
                                                          const std::string& what);
  // Bytes of a ledger for num_pages pages (what the budget reserves).
  static uint64_t BytesFor(uint64_t num_pages);

  const v1::PoolSpec& spec() const { return spec_; }
  const v1::PoolOwner& owner() const { return owner_; }
  uint64_t num_pages() const { return num_pages_; }
  int fd() const { return segment_.fd(); }

  // What the ledger proves. Unproven owner words read as kUnscrubbedMark;
  // unproven (or empty) records are left out.
  struct Contents {
    std::vector<OwnerTag> owners;
    // Pages whose word is RecordPublishing's (owners[] has the publisher).
    std::vector<uint64_t> publishing;
    uint64_t unproven_pages = 0;
    std::vector<AdoptedEntry> entries;
    uint64_t unproven_entries = 0;
  };
  Contents Read() const;

  void RecordOwner(uint64_t first_page, uint64_t num_pages,
                   OwnerTag owner) override;
  void RecordPublishing(uint64_t page, OwnerTag publisher) override;
  void RecordCached(uint64_t page, absl::string_view name_space,
                    absl::string_view key, uint64_t parent,
                    uint64_t use) override;
  void RecordEvicted(uint64_t page) override;
  void RecordDigest(uint64_t page, uint32_t digest) override;

  // For tests (and the fuzzer): this build's layout word.
  static uint64_t Layout();

 private:
  struct Header;
  struct CacheRecord;
  PoolLedger(ShmSegment segment, v1::PoolSpec spec, v1::PoolOwner owner,
             uint64_t num_pages, uint64_t salt);
  uint64_t* Words() const;
  CacheRecord* Records() const;
  // The owner word of `page`; `publishing`: RecordPublishing's variant (its
  // check differs, so a daemon that knows no such word reads it unproven).
  uint64_t WordOf(uint64_t page, OwnerTag owner, bool publishing = false) const;

  ShmSegment segment_;
  const v1::PoolSpec spec_;
  const v1::PoolOwner owner_;
  const uint64_t num_pages_;
  const uint64_t salt_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_STATE_POOL_LEDGER_H_
