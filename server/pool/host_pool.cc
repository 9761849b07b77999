#include "server/pool/host_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

#include "proto/contract/status_macros.h"
#include "server/pool/pool_spec.h"
#include "server/state/pool_ledger.h"
#include "server/tier/tier_value.h"

namespace hostkv {
namespace {

// Zeroed per background batch: large enough that a big free is a few
// memsets, small enough that an Allocate waiting for the batch in progress
// waits ~1 ms.
constexpr uint64_t kScrubBatchBytes = 8 << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<HostPool>> HostPool::Create(
    const v1::PoolSpec& spec, const PoolGeometry& geometry,
    const std::string& segment_label, const PoolFillOptions& fill,
    BudgetReservation reservation, const CacheOptions& cache_options,
    const HugePagePlan& huge) {
  ASSIGN_OR_RETURN(std::unique_ptr<PageCache> cache,
                   PageCache::Create(geometry.num_pages()));
  const uint64_t unit = std::max<uint64_t>(huge.page_bytes, 1);
  const uint64_t segment_bytes = (geometry.total_bytes() + unit - 1) / unit * unit;
  ASSIGN_OR_RETURN(ShmSegment segment,
                   ShmSegment::CreateSealed(segment_label, segment_bytes,
                                            /*reserve=*/false, huge.memfd_flags));
  if (huge.madvise_thp &&
      madvise(segment.data(), segment.size(), MADV_HUGEPAGE) != 0) {
    return absl::InternalError(absl::StrCat("MADV_HUGEPAGE on ", segment.name(),
                                            ": ", std::strerror(errno)));
  }
  if (fill.numa_node != kNoNode) {
    RETURN_IF_ERROR(BindRangeToNode(segment.data(), segment.size(), fill.numa_node));
  }
  v1::Pool info = InfoOf(spec, geometry, segment);
  info.set_hugepages(huge.used.empty() ? "4K" : huge.used);
  info.set_numa_node(fill.numa_node);
  std::unique_ptr<HostPool> pool(new HostPool(
      std::move(info), geometry, std::move(segment), std::move(reservation),
      std::move(cache), cache_options, /*resident=*/false));
  pool->StartFill(fill);
  return pool;
}

void HostPool::StartFill(const PoolFillOptions& options) {
  fill_ = std::make_unique<PoolFill>(
      name(), geometry_, segment_.data(), segment_.fd(), options,
      [this](const PageRun& chunk) { allocator_.AddResident(chunk); },
      [this](const absl::Status&) { allocator_.EndFill(); });
}

PoolFill::Progress HostPool::fill_progress() const {
  return fill_ != nullptr ? fill_->progress()
                          : AdoptedFillProgress(geometry_.num_pages());
}

absl::Status HostPool::WaitFilled() const {
  return fill_ != nullptr ? fill_->Wait() : absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostPool>> HostPool::Adopt(
    const v1::PoolSpec& spec, const PoolGeometry& geometry, ScopedFd segment_fd,
    const std::string& segment_label, BudgetReservation reservation,
    const CacheOptions& cache_options) {
  ASSIGN_OR_RETURN(std::unique_ptr<PageCache> cache,
                   PageCache::Create(geometry.num_pages()));
  ASSIGN_OR_RETURN(ShmSegment segment,
                   ShmSegment::AdoptSealed(std::move(segment_fd), segment_label,
                                           geometry.total_bytes()));
  // A hugetlb segment is rounded up to whole pages (1 GiB at most).
  if (segment.size() < geometry.total_bytes() ||
      segment.size() - geometry.total_bytes() >= (1ull << 30)) {
    return absl::FailedPreconditionError(absl::StrCat(
        segment.name(), " is ", segment.size(), " bytes; pool '", spec.name(),
        "' has ", geometry.total_bytes()));
  }
  v1::Pool info = InfoOf(spec, geometry, segment);
  info.set_hugepages(HugePagesOf(segment));
  info.set_numa_node(kNoNode);  // as the previous daemon left it
  return std::unique_ptr<HostPool>(
      new HostPool(std::move(info), geometry, std::move(segment),
                   std::move(reservation), std::move(cache), cache_options,
                   /*resident=*/true));
}

v1::Pool HostPool::InfoOf(const v1::PoolSpec& spec, const PoolGeometry& geometry,
                          const ShmSegment& segment) {
  v1::Pool info;
  *info.mutable_spec() = NormalizePoolSpec(spec);
  info.set_backend(v1::BACKEND_CPU);
  info.set_pinned(false);
  info.set_token_slots(geometry.token_slots);
  info.set_num_pages(geometry.num_pages());
  info.set_bytes_per_token(geometry.bytes_per_token());
  info.set_page_bytes(geometry.page_bytes());
  info.set_total_bytes(geometry.total_bytes());
  info.set_token_stride(geometry.token_stride());
  info.set_v_offset(geometry.kv_planes() == 2 ? geometry.plane_bytes() : 0);
  info.set_segment_name(segment.name());
  const v1::Geometry& g = info.spec().geometry();
  info.set_layout_fingerprint(GeometryFingerprint(
      geometry, static_cast<uint32_t>(g.dtype()), g.has_mla() ? g.mla().qk_rope_head_dim() : 0));
  return info;
}

std::string HostPool::HugePagesOf(const ShmSegment& segment) {
  struct statfs fs;
  if (fstatfs(segment.fd(), &fs) == 0 && static_cast<uint64_t>(fs.f_type) == 0x958458f6) {
    return fs.f_bsize >= (1 << 30) ? "1G" : "2M";  // hugetlbfs
  }
  return "4K";  // THP cannot be told from here: reported as 4K
}

HostPool::~HostPool() {
  // The fill's threads stop first (they hand pages to the allocator, and a
  // pinning thread may wait for them), then pinning, then the rest.
  if (fill_ != nullptr) fill_->Stop();
  pinning_.reset();
}

void HostPool::set_ledger(std::unique_ptr<PoolLedger> ledger) {
  ledger_ = std::move(ledger);
  allocator_.set_ledger(ledger_.get());
  cache_->set_ledger(ledger_.get());
}

absl::StatusOr<ScopedFd> HostPool::OpenSegment(bool writable) const {
  return segment_.ReopenFd(writable ? ShmSegment::Access::kReadWrite
                                    : ShmSegment::Access::kReadOnly);
}

HostPool::HostPool(v1::Pool info, const PoolGeometry& geometry,
                   ShmSegment segment, BudgetReservation reservation,
                   std::unique_ptr<PageCache> cache,
                   const CacheOptions& cache_options, bool resident)
    : info_(std::move(info)),
      geometry_(geometry),
      segment_(std::move(segment)),
      reservation_(std::move(reservation)),
      allocator_(
          geometry.num_pages(),
          [this](const PageRun& run) {
            ZeroPages(geometry_, segment_.data(), run);
          },
          resident),
      cache_(std::move(cache)),
      namespaces_(cache_options.namespaces != nullptr
                      ? cache_options.namespaces
                      : std::make_shared<NamespaceOwners>(
                            cache_options.sharing,
                            cache_options.max_namespaces_per_uid)) {
  scrubber_ = std::make_unique<PageScrubber>(
      &allocator_, PageScrubber::BatchPages(geometry_, kScrubBatchBytes));
}

v1::Pool HostPool::Describe() const {
  v1::Pool pool = info_;
  pool.set_backend(backend());
  pool.set_pinned(pinned());
  *pool.mutable_owner() = owner_;
  return pool;
}

absl::StatusOr<PinnedPages> PinnedPages::Pin(std::shared_ptr<HostPool> pool,
                                             std::vector<PageRun> runs,
                                             OwnerTag owner) {
  RETURN_IF_ERROR(pool->allocator().Pin(runs, owner));
  PinnedPages pinned;
  pinned.pool_ = std::move(pool);
  pinned.runs_ = std::move(runs);
  return pinned;
}

absl::StatusOr<PinnedPages> PinnedPages::PinForRead(
    std::shared_ptr<HostPool> pool, std::vector<PageRun> runs, OwnerTag owner,
    bool owned_pages_idle) {
  const PageCache& cache = pool->cache();
  RETURN_IF_ERROR(pool->allocator().PinForRead(
      runs, owner, [&cache, owner](const std::vector<PageRun>& cached) {
        return cache.CheckHeld(owner, cached);
      }, owned_pages_idle));
  PinnedPages pinned;
  pinned.pool_ = std::move(pool);
  pinned.runs_ = std::move(runs);
  return pinned;
}

PinnedPages& PinnedPages::operator=(PinnedPages&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::move(other.pool_);
    runs_ = std::move(other.runs_);
  }
  return *this;
}

void PinnedPages::Release() {
  if (pool_ != nullptr) pool_->allocator().Unpin(runs_);
  pool_.reset();
  runs_.clear();
}

}  // namespace hostkv
