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
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/pool/free_page_set.h"

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
// The owner of cached pages (DESIGN.md, "The page cache"): no session ever
// gets this tag (SessionRegistry skips it as it skips kNoOwner), so nothing
// a session does with its own tag (CheckOwned*, Pin, Free, HandOver,
// FreeAllOwnedBy) touches a cached page. Methods taking a session's tag
// refuse this one with InvalidArgument.
inline constexpr OwnerTag kCacheOwner = UINT32_MAX;
// The storage tier's own work (server/tier/tier_reader.h, tier_writer.h):
// it owns the pages it fills from a tier until they are published, and
// holds references on the cached pages it writes to a tier. No session gets
// this tag either (SessionRegistry skips it).
inline constexpr OwnerTag kTierOwner = UINT32_MAX - 1;
// Never an owner: what a PageLedger records for a page freed and not yet
// zeroed (a daemon adopting the pool zeroes it before handing it out). No
// session gets this tag either.
inline constexpr OwnerTag kUnscrubbedMark = UINT32_MAX - 2;

class PageLedger;  // server/pool/page_ledger.h

// Asked by Allocate for up to `needed` pages when free ones are short: takes
// them from the page cache (PageCache::Evict) and returns their numbers;
// Allocate frees them (as Uncache does). Called without the allocator's lock.
using Evictor = absl::FunctionRef<std::vector<uint64_t>(uint64_t needed)>;
// Asked by PinForRead, with the allocator's lock held, whether the caller
// may read the cached pages `cached` (those of its request that are cached):
// OK, or the error PinForRead returns. It may take the page cache's lock
// (see the lock order below) and must not call the allocator.
using CachedReadCheck =
    absl::FunctionRef<absl::Status(const std::vector<PageRun>& cached)>;

// Zeroes every byte of the pages of `run` (called without the allocator's
// lock held; never for a page that is allocated).
using ScrubFn = std::function<void(const PageRun& run)>;

// Free pages are kept in a bitmap with summary levels (FreePageSet), so
// allocations come back as few runs, lowest pages first. Cost: O(pages +
// runs) per call, whatever the pool's size (beyond the cache misses of the
// per-page arrays it touches).
//
// With a ScrubFn, a freed page is not handed out to another session before
// it is zeroed: Free and FreeAllOwnedBy put it in a "scrubbing" state
// (neither free nor owned), remembering whose bytes it holds; a background
// thread (PageScrubber, through ScrubPending) zeroes it and makes it free,
// oldest sessions' pages first. Allocate for a session first takes back,
// unzeroed, pages that hold only that session's own bytes (it freed them,
// or published them and the cache evicted them: nothing another session
// wrote), then zeroed pages, zeroing inline what it still needs when the
// background thread is behind. Session tags are never reused within a
// daemon's life, so "its own bytes" cannot mean a predecessor's. The counts
// (free_pages, Snapshot) count scrubbing pages as free. Without a ScrubFn
// (pages that hold no data, e.g. tests of the bookkeeping) a freed page is
// free at once.
//
// Cached pages (owner kCacheOwner) are neither free nor a session's: Cache
// moves a session's idle pages to the cache, Reclaim gives cached idle
// pages back to a session (a publish that did not take them), Uncache frees
// pages the page cache no longer holds (Evict returned them) through the
// scrub path above. A cached page still read by copies in flight is not
// freed by Uncache but marked "free when unpinned": the last Unpin frees
// it. Loads pin cached pages with PinForRead; writes use Pin, which never
// pins a cached page.
//
// Lock order: SlotAllocator's mutex, then PageCache's. The allocator calls
// an Evictor without its mutex (the cache's is taken alone) and a
// CachedReadCheck with it (the cache's nested inside); the page cache never
// calls the allocator. Callers must not call the allocator while holding the
// cache's mutex (PageCache's methods do not let them).
// Thread-safe.
class SlotAllocator {
 public:
  // With `resident` false (a pool whose memory is still being filled), no
  // page is handed out until AddResident made it so (see "Filling" below).
  explicit SlotAllocator(uint64_t num_pages, ScrubFn scrub = nullptr,
                         bool resident = true);

  // Allocates num_pages pages for `owner`: zeroed, or holding only bytes
  // `owner` itself left there (class comment). All or nothing:
  // ResourceExhausted (saying how many are free, scrubbing ones included) if
  // fewer are free; InvalidArgument if num_pages is 0. When free pages are
  // short but scrubbing ones make up the difference, zeroes them inline (or
  // waits for the background thread zeroing them: one batch at most).
  // InvalidArgument for owner kCacheOwner.
  //
  // While the pool fills, pages not yet resident count as free, but only
  // resident ones are handed out: short of those, Allocate waits for the
  // fill until `fill_wait_until` (by default until the fill ends) and then
  // fails with DeadlineExceeded, or, with a time already past, fails at
  // once with FailedPrecondition (both saying how many pages are ready;
  // not Unavailable, which clients take for a daemon gone).
  // ResourceExhausted as above when the pool could not hold the request
  // even once filled.
  absl::StatusOr<std::vector<PageRun>> Allocate(
      uint64_t num_pages, OwnerTag owner,
      absl::Time fill_wait_until = absl::InfiniteFuture())
      ABSL_LOCKS_EXCLUDED(mu_);
  // Allocate, and when free pages (scrubbing ones included) are short,
  // calls `evict` (without the lock) for the missing count, frees what it
  // returns (those with copies in flight when unpinned, so they do not
  // count now) and tries once more. ResourceExhausted, saying how many are
  // free, how many were evicted and how many of those are still read, when
  // still short (evicted pages stay freed); Internal if `evict` returned a
  // page that is not cached here (nothing of its list is freed).
  // While the pool fills, waits for (or fails on) pages not yet resident
  // as above before it evicts anything.
  absl::StatusOr<std::vector<PageRun>> Allocate(
      uint64_t num_pages, OwnerTag owner, Evictor evict,
      absl::Time fill_wait_until = absl::InfiniteFuture())
      ABSL_LOCKS_EXCLUDED(mu_);

  // Filling (a SlotAllocator made with resident = false): pages `run`
  // became resident and are free from now on (waiting Allocates wake).
  // REQUIRES: each page made resident once, none before.
  void AddResident(const PageRun& run) ABSL_LOCKS_EXCLUDED(mu_);
  // The fill is over (all resident, or it failed: the pages left are never
  // handed out); waiting Allocates give up.
  void EndFill() ABSL_LOCKS_EXCLUDED(mu_);
  // Pages resident (num_pages() once filled).
  uint64_t ready_pages() const ABSL_LOCKS_EXCLUDED(mu_);

  // Gives `from`'s idle pages in `runs` to the page cache; returns how many
  // moved (a page listed twice, once). All or nothing; errors of
  // CheckOwnedIdle, InvalidArgument for from == kCacheOwner.
  absl::StatusOr<uint64_t> Cache(const std::vector<PageRun>& runs,
                                 OwnerTag from) ABSL_LOCKS_EXCLUDED(mu_);
  // Cache, after waiting until no copy in flight touches the pages (a
  // backup filling them), at most until `wait_until`: DeadlineExceeded,
  // moving nothing, if copies are still in flight then. The pages must be
  // `from`'s before and after the wait.
  // A session's pages are recorded as being published by it
  // (PageLedger::RecordPublishing) until ConfirmCached: a crash before the
  // page cache recorded their keys gives them back to it.
  absl::StatusOr<uint64_t> Cache(const std::vector<PageRun>& runs,
                                 OwnerTag from, absl::Time wait_until)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records as the cache's the pages of `pages` the cache still holds (the
  // page cache has recorded their keys). Pages evicted meanwhile are left
  // as their eviction recorded them.
  void ConfirmCached(const std::vector<uint64_t>& pages) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives cached idle pages back to session `to` (pages the page cache did
  // not take: a publish that found the key cached). All or nothing:
  // InvalidArgument for a bad run or to == kCacheOwner; FailedPrecondition
  // for a page that is not cached, freed when unpinned, or pinned.
  absl::StatusOr<uint64_t> Reclaim(const std::vector<PageRun>& runs,
                                   OwnerTag to) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees cached pages that the page cache gave up (Evict returned them):
  // idle ones now (scrubbed before reuse), the others when their last pin
  // drops. Returns how many were freed now. All or nothing: InvalidArgument
  // for a bad run; FailedPrecondition for a page that is not cached, already
  // freed when unpinned, or listed twice.
  absl::StatusOr<uint64_t> Uncache(const std::vector<PageRun>& runs)
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
  // freed, read or written until Unpin). Errors of CheckOwned (a cached
  // page is never pinned here: for writes).
  // REQUIRES: no page is listed twice (callers refuse overlapping runs), so
  // the per-page count stays below the number of operations in flight.
  absl::Status Pin(const std::vector<PageRun>& runs, OwnerTag owner)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Pin for a copy that only reads (a load): pages owned by `owner`, and
  // cached pages if `may_read_cached` (called once, with the cached pages of
  // the request, when there are any) says OK. All or nothing: errors of
  // CheckOwned for other pages, FailedPrecondition for a cached page freed
  // when unpinned (evicted), the error of may_read_cached; InvalidArgument
  // for owner kCacheOwner.
  // With owned_pages_idle, `owner`'s own pages must also have no copy in
  // flight (FailedPrecondition): a read of bytes a backup may be writing.
  // REQUIRES: as Pin.
  absl::Status PinForRead(const std::vector<PageRun>& runs, OwnerTag owner,
                          CachedReadCheck may_read_cached,
                          bool owned_pages_idle = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Frees the pages that were to be freed when unpinned and are no longer
  // pinned.
  // REQUIRES: a successful Pin or PinForRead of the same runs.
  void Unpin(const std::vector<PageRun>& runs) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees every page `owner` holds; returns how many (0 for kCacheOwner:
  // cached pages are freed by Uncache only).
  // REQUIRES: no copy in flight touches the owner's pages.
  uint64_t FreeAllOwnedBy(OwnerTag owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Gives `from`'s pages in `runs` to `to`; returns how many moved. All or
  // nothing; errors of CheckOwnedIdle; InvalidArgument if from or to is
  // kCacheOwner (Cache and Reclaim move pages to and from the cache).
  absl::StatusOr<uint64_t> HandOver(const std::vector<PageRun>& runs,
                                    OwnerTag from, OwnerTag to)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every change of a page's owner from now on is also written to `ledger`
  // (may be null). The allocator's own scrubber may already run (an adopted
  // pool): taken under the lock.
  void set_ledger(PageLedger* ledger) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ledger_ = ledger;
  }

  // How long the background scrubber leaves a session's freed pages to it.
  static constexpr absl::Duration kReuseWindow = absl::Milliseconds(250);

  // Replaces the allocator's state by `owners` (one per page: a session's
  // tag, kCacheOwner, kNoOwner for a free zeroed page, kUnscrubbedMark for
  // one to zero before reuse), as adopted from a previous daemon's ledger.
  // InvalidArgument if the size differs or a page is kTierOwner. Nothing may
  // be allocated, pinned or pending; call before the allocator is shared.
  absl::Status Restore(absl::Span<const OwnerTag> owners)
      ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t num_pages() const { return num_pages_; }
  uint64_t free_pages() const ABSL_LOCKS_EXCLUDED(mu_);
  // Pages per session (cached pages are no session's: see cached_pages).
  uint64_t pages_owned_by(OwnerTag owner) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::flat_hash_map<OwnerTag, uint64_t> UsageByOwner() const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Pages owned by the cache, those to be freed when unpinned included.
  uint64_t cached_pages() const ABSL_LOCKS_EXCLUDED(mu_);
  // Of those, the ones Uncache left to be freed when unpinned.
  uint64_t pages_freed_when_unpinned() const ABSL_LOCKS_EXCLUDED(mu_);

  // Scrubbing pages (counted in free_pages()): freed, not yet zeroed.
  uint64_t scrubbing_pages() const ABSL_LOCKS_EXCLUDED(mu_);

  // For the background scrubber: waits until freed pages wait to be zeroed
  // or StopScrubbing() was called; then zeroes up to max_pages of them
  // (outside the lock) and makes them free. Returns false once stopped.
  // A live session's pages wait kReuseWindow first: under churn it takes
  // them back itself, unzeroed; pages of nobody's are zeroed at once.
  bool ScrubPending(uint64_t max_pages) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes ScrubPending return false (now and from then on).
  void StopScrubbing() ABSL_LOCKS_EXCLUDED(mu_);

  // Free pages (scrubbing ones included), pages per session and cached
  // pages, read together: free + the sum of the usage + cached is
  // num_pages().
  struct Occupancy {
    uint64_t free_pages = 0;
    absl::flat_hash_map<OwnerTag, uint64_t> usage;
    uint64_t cached_pages = 0;
  };
  Occupancy Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

  // Number of free extents of zeroed pages (a fragmentation measure).
  size_t free_extents() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status CheckRange(const PageRun& run) const;
  // InvalidArgument for a session tag that is the cache's.
  static absl::Status CheckSessionTag(OwnerTag owner);
  // While mu_ is released meanwhile (scrubbing), waits until num_pages are
  // free and zeroed or `owner`'s own scrubbing pages; false when free and
  // scrubbing pages are too few.
  bool MakeRoomLocked(uint64_t num_pages, OwnerTag owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pending pages holding `owner`'s bytes (0 without any).
  uint64_t PendingOf(OwnerTag owner) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes num_pages for owner: its own pending pages first, unzeroed, then
  // free zeroed ones. REQUIRES: MakeRoomLocked(num_pages, owner).
  std::vector<PageRun> TakeLocked(uint64_t num_pages, OwnerTag owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Uncache; *pinned counts the pages left to be freed when unpinned.
  absl::StatusOr<uint64_t> UncacheLocked(const std::vector<PageRun>& runs,
                                         uint64_t* pinned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pages as runs of consecutive numbers, ascending (a page listed twice
  // stays twice).
  static std::vector<PageRun> RunsOf(std::vector<uint64_t> pages);
  // Adds the pins of runs (all checked).
  void PinLocked(const std::vector<PageRun>& runs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckOwnedLocked(const std::vector<PageRun>& runs,
                                OwnerTag owner, bool idle) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Pages [first, first + count) just left their owner: free, or scrubbing
  // as holding the bytes of session `bytes_of` (kNoOwner: of nobody who can
  // take them back, zeroed before anyone gets them).
  void Release(uint64_t first, uint64_t count, OwnerTag bytes_of)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Zeroes up to max_pages pending pages, with mu_ released meanwhile, then
  // makes them free; returns how many. Spares the pages holding `spare`'s
  // bytes (kCacheOwner: none spared) and those a session released after
  // `released_before` (it may still take them back).
  uint64_t ScrubLocked(uint64_t max_pages, OwnerTag spare,
                       absl::Time released_before)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pending pages ScrubLocked(_, kCacheOwner, released_before) would zero;
  // *next: when more become so (InfiniteFuture if none).
  uint64_t ScrubbableLocked(absl::Time released_before, absl::Time* next) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status Exhausted(uint64_t requested) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // After MakeRoomLocked failed: while the pool fills and could hold
  // num_pages once filled, waits (mu_ released) until MakeRoomLocked
  // succeeds, the fill ends or `until`; OK when room was made, else the
  // error Allocate returns (FailedPrecondition, DeadlineExceeded,
  // ResourceExhausted). NotFound when the fill has no part in it (not
  // filling, or the request is larger than the pool could ever hold).
  absl::Status WaitForFillLocked(uint64_t num_pages, OwnerTag owner,
                                 absl::Time until)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t num_pages_;
  const ScrubFn scrub_;
  PageLedger* ledger_ = nullptr;
  // Writes [first, first + count) -> owner to ledger_, if any.
  void Record(uint64_t first, uint64_t count, OwnerTag owner) const;

  mutable absl::Mutex mu_;
  std::vector<OwnerTag> owner_ ABSL_GUARDED_BY(mu_);      // per page
  std::vector<uint32_t> in_flight_ ABSL_GUARDED_BY(mu_);  // per page
  // Per page: cached, and to be freed by its last Unpin.
  std::vector<uint8_t> free_when_unpinned_ ABSL_GUARDED_BY(mu_);
  uint64_t cached_pages_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t freed_when_unpinned_pages_ ABSL_GUARDED_BY(mu_) = 0;
  FreePageSet free_ ABSL_GUARDED_BY(mu_);         // zeroed free pages
  uint64_t free_pages_ ABSL_GUARDED_BY(mu_) = 0;  // free_.free_pages()
  // Not yet resident (not in free_; counted as free outside), and whether
  // the fill that makes them so still runs.
  uint64_t unready_pages_ ABSL_GUARDED_BY(mu_) = 0;
  bool filling_ ABSL_GUARDED_BY(mu_) = false;
  // Freed, to be zeroed, by the session whose bytes they hold (kNoOwner
  // first: nobody's who could take them back). pending_pages_ counts them.
  struct PendingRun {
    uint64_t first_page;
    uint64_t num_pages;
    absl::Time released;
  };
  struct Pending {
    std::deque<PendingRun> runs;  // oldest first
    uint64_t pages = 0;
  };
  std::map<OwnerTag, Pending> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_pages_ ABSL_GUARDED_BY(mu_) = 0;
  // pending_pages_ plus the pages being zeroed now.
  uint64_t scrubbing_pages_ ABSL_GUARDED_BY(mu_) = 0;
  // Per page, while cached: the session that published it (kNoOwner when
  // unknown, e.g. adopted), whose bytes it holds once evicted.
  std::vector<OwnerTag> writer_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<OwnerTag, uint64_t> usage_ ABSL_GUARDED_BY(mu_);
  // Per owner, pages [first, last] bound everything it ever held since it
  // last held nothing: FreeAllOwnedBy scans only that span.
  struct Span {
    uint64_t first;
    uint64_t last;
  };
  absl::flat_hash_map<OwnerTag, Span> span_ ABSL_GUARDED_BY(mu_);
  // Gives the pages of `runs` that `from` holds to `to` (either may be
  // kCacheOwner, whose count is cached_pages_); returns how many moved, a
  // page listed twice once. REQUIRES: the caller checked the pages.
  uint64_t MoveOwnerLocked(const std::vector<PageRun>& runs, OwnerTag from,
                           OwnerTag to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Extend(OwnerTag owner, uint64_t first, uint64_t last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_SLOT_ALLOCATOR_H_
