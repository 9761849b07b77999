// Page-granular allocation of a host pool's token slots, with an owner per
// page so that one session cannot free or touch another's pages.
#ifndef HOSTKV_SERVER_POOL_SLOT_ALLOCATOR_H_
#define HOSTKV_SERVER_POOL_SLOT_ALLOCATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace hostkv {

// Pages [first_page, first_page + num_pages).
struct PageRun {
  uint64_t first_page;
  uint64_t num_pages;
  bool operator==(const PageRun& o) const {
    return first_page == o.first_page && num_pages == o.num_pages;
  }
};

// Identifies a session inside the allocator; 0 means "free".
using OwnerTag = uint32_t;
inline constexpr OwnerTag kNoOwner = 0;

// Zeroes every byte of the pages of `run` (called without the allocator's
// lock held; never for a page that is allocated).
using ScrubFn = std::function<void(const PageRun& run)>;

// Free pages are kept as coalesced extents, so allocations come back as few
// runs, lowest pages first. Cost: O(pages + runs * log extents) per call.
//
// With a ScrubFn, a freed page is not handed out again before it is zeroed:
// Free and FreeAllOwnedBy put it in a "scrubbing" state (neither free nor
// owned), a background thread (PageScrubber, through ScrubPending) zeroes
// it and makes it free, and Allocate takes only zeroed pages, zeroing inline
// what it still needs when the background thread is behind. The counts
// (free_pages, Snapshot) count scrubbing pages as free. Without a ScrubFn
// (pages that hold no data, e.g. tests of the bookkeeping) a freed page is
// free at once.
// Thread-safe.
class SlotAllocator {
 public:
  explicit SlotAllocator(uint64_t num_pages, ScrubFn scrub = nullptr);

  // Allocates num_pages zeroed pages for `owner`. All or nothing:
  // ResourceExhausted (saying how many are free, scrubbing ones included) if
  // fewer are free; InvalidArgument if num_pages is 0. When free pages are
  // short but scrubbing ones make up the difference, zeroes them inline (or
  // waits for the background thread zeroing them: one batch at most).
  absl::StatusOr<std::vector<PageRun>> Allocate(uint64_t num_pages,
                                                OwnerTag owner)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Frees pages owned by `owner`; returns how many. All or nothing:
  // InvalidArgument for a run out of range or empty; FailedPrecondition for
  // a page that is free, owned by someone else, listed twice, or touched by
  // a copy in flight.
  absl::StatusOr<uint64_t> Free(const std::vector<PageRun>& runs,
                                OwnerTag owner) ABSL_LOCKS_EXCLUDED(mu_);

  // OK if every page of `runs` is in range and owned by `owner`; otherwise
  // the error Free would give.
  absl::Status CheckOwned(const std::vector<PageRun>& runs,
                          OwnerTag owner) const ABSL_LOCKS_EXCLUDED(mu_);

  // CheckOwned, and FailedPrecondition if a copy in flight touches a page.
  absl::Status CheckOwnedIdle(const std::vector<PageRun>& runs,
                              OwnerTag owner) const ABSL_LOCKS_EXCLUDED(mu_);

  // Marks the pages as touched by one more copy in flight (they cannot be
  // freed, read or written until Unpin). Errors of CheckOwned.
  // REQUIRES: no page is listed twice (callers refuse overlapping runs), so
  // the per-page count stays below the number of operations in flight.
  absl::Status Pin(const std::vector<PageRun>& runs, OwnerTag owner)
      ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: a successful Pin of the same runs.
  void Unpin(const std::vector<PageRun>& runs) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees every page `owner` holds; returns how many.
  // REQUIRES: no copy in flight touches the owner's pages.
  uint64_t FreeAllOwnedBy(OwnerTag owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Gives `from`'s pages in `runs` to `to`; returns how many moved. All or
  // nothing; errors of CheckOwnedIdle.
  absl::StatusOr<uint64_t> HandOver(const std::vector<PageRun>& runs, OwnerTag from,
                        OwnerTag to) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t num_pages() const { return num_pages_; }
  uint64_t free_pages() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t pages_owned_by(OwnerTag owner) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::flat_hash_map<OwnerTag, uint64_t> UsageByOwner() const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Scrubbing pages (counted in free_pages()): freed, not yet zeroed.
  uint64_t scrubbing_pages() const ABSL_LOCKS_EXCLUDED(mu_);

  // For the background scrubber: waits until freed pages wait to be zeroed
  // or StopScrubbing() was called; then zeroes up to max_pages of them
  // (outside the lock) and makes them free. Returns false once stopped.
  bool ScrubPending(uint64_t max_pages) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes ScrubPending return false (now and from then on).
  void StopScrubbing() ABSL_LOCKS_EXCLUDED(mu_);

  // Free pages (scrubbing ones included) and pages per owner, read
  // together: free + the sum of the usage is num_pages().
  struct Occupancy {
    uint64_t free_pages = 0;
    absl::flat_hash_map<OwnerTag, uint64_t> usage;
  };
  Occupancy Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

  // Number of free extents of zeroed pages (a fragmentation measure).
  size_t free_extents() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status CheckRange(const PageRun& run) const;
  absl::Status CheckOwnedLocked(const std::vector<PageRun>& runs,
                                OwnerTag owner, bool idle) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void InsertFreeExtent(uint64_t first, uint64_t count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pages [first, first + count) just left their owner: free, or scrubbing.
  void Release(uint64_t first, uint64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Zeroes up to max_pages pending pages with mu_ released meanwhile, then
  // makes them free; returns how many.
  uint64_t ScrubLocked(uint64_t max_pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exhausted(uint64_t requested) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const uint64_t num_pages_;
  const ScrubFn scrub_;

  mutable absl::Mutex mu_;
  std::vector<OwnerTag> owner_ ABSL_GUARDED_BY(mu_);        // per page
  std::vector<uint32_t> in_flight_ ABSL_GUARDED_BY(mu_);    // per page
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // first -> count
  uint64_t free_pages_ ABSL_GUARDED_BY(mu_) = 0;  // zeroed, in free_
  std::deque<PageRun> pending_ ABSL_GUARDED_BY(mu_);  // freed, to be zeroed
  // pending_ plus the pages being zeroed now.
  uint64_t scrubbing_pages_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<OwnerTag, uint64_t> usage_ ABSL_GUARDED_BY(mu_);
  // Per owner, pages [first, last] bound everything it ever held since it
  // last held nothing: FreeAllOwnedBy scans only that span.
  struct Span {
    uint64_t first;
    uint64_t last;
  };
  absl::flat_hash_map<OwnerTag, Span> span_ ABSL_GUARDED_BY(mu_);
  void Extend(OwnerTag owner, uint64_t first, uint64_t last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_SLOT_ALLOCATOR_H_
