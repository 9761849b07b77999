// One host KV pool: its shared-memory segment, its geometry and its slot
// allocator. Pools belong to the daemon and outlive every engine session.
#ifndef HOSTKV_SERVER_POOL_HOST_POOL_H_
#define HOSTKV_SERVER_POOL_HOST_POOL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hostkv/v1/hostkv.pb.h"
#include "kernels/pool_geometry.h"
#include "server/transfer/gpu_backend.h"
#include "server/pool/memory_budget.h"
#include "proto/contract/shm_segment.h"
#include "server/pool/huge_pages.h"
#include "server/pool/page_scrubber.h"
#include "server/pool/pool_fill.h"
#include "server/pool/slot_allocator.h"
#include "server/cache/namespace_owners.h"
#include "server/cache/page_cache.h"

namespace hostkv {

class PoolLedger;  // server/state/pool_ledger.h

// The page cache's settings, the same for every pool (daemon flags).
struct CacheOptions {
  CacheSharing sharing;
  uint32_t max_namespaces_per_uid = 256;
  // The daemon's namespace owners, shared by every pool (PoolRegistry sets
  // it); a pool made without one (unit tests) gets its own.
  std::shared_ptr<NamespaceOwners> namespaces;
};

// Thread-safe: the geometry and segment are fixed after creation; the
// allocator and counters synchronize themselves. The page bytes are written
// by copies, ordered by the slot ownership rules of the callers, and zeroed
// by the pool's PageScrubber between a Free and the next Allocate. A new
// pool's segment is zero (a fresh shm object).
class HostPool {
 public:
  // Creates the pool described by `spec` in a new sealed memfd labelled
  // `segment_label` (ShmSegment::CreateSealed) and returns at once: the
  // segment's memory is reserved and made resident in the background
  // (PoolFill, with `fill`), and its pages are handed out as that happens
  // (SlotAllocator::AddResident). Memory must already be budgeted
  // (`reservation`). Returns the segment's error on failure, having created
  // nothing; a failed fill shows in fill_progress(). `huge` says what pages
  // back it (the segment is rounded up to whole ones).
  static absl::StatusOr<std::unique_ptr<HostPool>> Create(
      const v1::PoolSpec& spec, const PoolGeometry& geometry,
      const std::string& segment_label, const PoolFillOptions& fill,
      BudgetReservation reservation, const CacheOptions& cache_options = {},
      const HugePagePlan& huge = {});

  // The pool a previous daemon made with this spec, from its segment's
  // memfd (kept by the state keeper): the same bytes, already resident
  // (nothing to fill: fill_progress() is FILL_READY). Its pages are all
  // free until the caller restores the allocator (SlotAllocator::Restore)
  // and the page cache (PageCache::Adopt). FailedPrecondition if the memfd
  // is not a sealed segment of the geometry's size.
  static absl::StatusOr<std::unique_ptr<HostPool>> Adopt(
      const v1::PoolSpec& spec, const PoolGeometry& geometry,
      ScopedFd segment_fd, const std::string& segment_label,
      BudgetReservation reservation, const CacheOptions& cache_options = {});

  ~HostPool();

  const std::string& name() const { return info_.spec().name(); }
  const PoolGeometry& geometry() const { return geometry_; }
  // The pool as the API describes it.
  const v1::Pool& info() const { return info_; }
  uint8_t* base() const { return segment_.data(); }
  // A new descriptor of the pool's segment, read-write or read-only, for an
  // engine to map (kFetchPoolSegment). The segment is a sealed memfd: no
  // descriptor can shrink or grow it under the daemon's mapping.
  absl::StatusOr<ScopedFd> OpenSegment(bool writable) const;
  SlotAllocator& allocator() { return allocator_; }
  const SlotAllocator& allocator() const { return allocator_; }
  // The pool's page cache (which pages are published under which key) and
  // who owns the namespaces (the daemon's, shared by all its pools). Both
  // thread-safe.
  PageCache& cache() const { return *cache_; }
  NamespaceOwners& namespaces() const { return *namespaces_; }
  // The budget held for the page cache's metadata, set once before the
  // pool is shared (PoolRegistry::Create).
  void set_cache_reservation(BudgetReservation reservation) {
    cache_reservation_ = std::move(reservation);
  }

  // The pool's ledger (server/state/pool_ledger.h): from now on every page
  // owner and cached key is also written there. Set once, before the pool
  // is shared; null without one.
  void set_ledger(std::unique_ptr<PoolLedger> ledger);
  PoolLedger* ledger() const { return ledger_.get(); }
  void set_ledger_reservation(BudgetReservation reservation) {
    ledger_reservation_ = std::move(reservation);
  }
  // The segment's memfd (the daemon's own descriptor: for the state keeper).
  int segment_fd() const { return segment_.fd(); }

  // Device-buffer registrations that refer to this pool.
  std::atomic<uint32_t>& imports() { return imports_; }
  std::atomic<uint64_t>& completed_loads() { return loads_; }
  std::atomic<uint64_t>& completed_backups() { return backups_; }
  uint64_t completed_loads() const { return loads_.load(); }
  uint32_t import_count() const { return imports_.load(); }
  uint64_t completed_backups() const { return backups_.load(); }

  // The pool's registration with CUDA; null on the CPU backend. Set once,
  // before the pool is shared (PoolRegistry::Create).
  const PoolPinning* pinning() const { return pinning_.get(); }
  void set_pinning(std::unique_ptr<PoolPinning> pinning) {
    pinning_ = std::move(pinning);
  }
  // How far the segment is resident (AdoptedFillProgress for an adopted
  // pool).
  PoolFill::Progress fill_progress() const;
  // Waits until the fill ended (at once for an adopted pool): OK once every
  // page is resident, else the fill's error (Cancelled when the pool goes
  // first).
  absl::Status WaitFilled() const;

  // Pinning progress (PIN_NOT_NEEDED without CUDA).
  PoolPinning::Progress pin_progress() const {
    return pinning_ != nullptr ? pinning_->progress() : PoolPinning::Progress{};
  }
  // BACKEND_CUDA when the pool is registered (or being registered) with
  // CUDA, else BACKEND_CPU; pinned once that registration is done.
  v1::Backend backend() const {
    return pinning_ != nullptr ? v1::BACKEND_CUDA : v1::BACKEND_CPU;
  }
  bool pinned() const { return pinning_ != nullptr && pinning_->pinned(); }
  // The pool as the API describes it now (backend, pinned, owner).
  v1::Pool Describe() const;

  // Who owns the pool and who may use it (server/pool_access.h). Set once,
  // before the pool is shared (PoolRegistry::Create).
  const v1::PoolOwner& owner() const { return owner_; }
  void set_owner(v1::PoolOwner owner) { owner_ = std::move(owner); }

 private:
  // "2M" / "1G" for a hugetlbfs segment, else "4K" (an adopted pool).
  static std::string HugePagesOf(const ShmSegment& segment);
  // The API's description of a pool of `spec` in `segment`.
  static v1::Pool InfoOf(const v1::PoolSpec& spec, const PoolGeometry& geometry,
                         const ShmSegment& segment);
  HostPool(v1::Pool info, const PoolGeometry& geometry, ShmSegment segment,
           BudgetReservation reservation, std::unique_ptr<PageCache> cache,
           const CacheOptions& cache_options, bool resident);
  // Starts filling the segment (Create).
  void StartFill(const PoolFillOptions& options);

  const v1::Pool info_;
  const PoolGeometry geometry_;
  ShmSegment segment_;
  BudgetReservation reservation_;
  SlotAllocator allocator_;
  const std::unique_ptr<PageCache> cache_;
  const std::shared_ptr<NamespaceOwners> namespaces_;
  BudgetReservation cache_reservation_;
  // Written by the allocator and the cache; goes after the scrubber stops.
  std::unique_ptr<PoolLedger> ledger_;
  BudgetReservation ledger_reservation_;
  std::atomic<uint32_t> imports_{0};
  std::atomic<uint64_t> loads_{0};
  std::atomic<uint64_t> backups_{0};
  v1::PoolOwner owner_;
  // Unregistered before the segment is unmapped.
  std::unique_ptr<PoolPinning> pinning_;
  // Null for an adopted pool. Stopped first of all (~HostPool): its threads
  // hand pages to the allocator, and pinning waits for it.
  std::unique_ptr<PoolFill> fill_;
  // Declared last: its thread stops (and stops writing to the segment)
  // before anything else of the pool goes.
  std::unique_ptr<PageScrubber> scrubber_;
};

// Pages of a pool pinned for a copy in flight (SlotAllocator::Pin): they
// cannot be freed, read or written until this is released or dies. Keeps the
// pool alive. Move-only.
class PinnedPages {
 public:
  // Pins `runs` for `owner`; errors of SlotAllocator::Pin.
  static absl::StatusOr<PinnedPages> Pin(std::shared_ptr<HostPool> pool,
                                         std::vector<PageRun> runs,
                                         OwnerTag owner);
  // Pins for a copy that only reads: `owner`'s pages, and cached pages it
  // holds references on (PageCache::CheckHeld). Errors of
  // SlotAllocator::PinForRead (owned_pages_idle: as there).
  static absl::StatusOr<PinnedPages> PinForRead(std::shared_ptr<HostPool> pool,
                                                std::vector<PageRun> runs,
                                                OwnerTag owner,
                                                bool owned_pages_idle = false);
  PinnedPages() = default;
  PinnedPages(PinnedPages&& other) noexcept = default;
  PinnedPages& operator=(PinnedPages&& other) noexcept;
  ~PinnedPages() { Release(); }

  void Release();

 private:
  std::shared_ptr<HostPool> pool_;
  std::vector<PageRun> runs_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_HOST_POOL_H_
