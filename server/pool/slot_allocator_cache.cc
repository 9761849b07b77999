// SlotAllocator's cached pages (owner kCacheOwner): Cache, Reclaim, Uncache,
// PinForRead and Unpin (which frees evicted pages at their last pin), and
// Allocate with an Evictor.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/pool/slot_allocator.h"

namespace hostkv {

std::vector<PageRun> SlotAllocator::RunsOf(std::vector<uint64_t> pages) {
  // An eviction returns a chain's pages leaf first, i.e. often descending:
  // sorted, they free as a few runs rather than one page at a time.
  std::sort(pages.begin(), pages.end());
  std::vector<PageRun> runs;
  for (uint64_t p : pages) {
    if (!runs.empty() && runs.back().first_page + runs.back().num_pages == p) {
      ++runs.back().num_pages;
    } else {
      runs.push_back({p, 1});
    }
  }
  return runs;
}

absl::StatusOr<std::vector<PageRun>> SlotAllocator::Allocate(
    uint64_t num_pages, OwnerTag owner, Evictor evict,
    absl::Time fill_wait_until) {
  if (num_pages == 0) {
    return absl::InvalidArgumentError("cannot allocate 0 pages");
  }
  if (absl::Status s = CheckSessionTag(owner); !s.ok()) return s;
  uint64_t missing = 0;
  {
    absl::MutexLock lock(&mu_);
    if (MakeRoomLocked(num_pages, owner)) return TakeLocked(num_pages, owner);
    // A filling pool's pages come before anything cached.
    absl::Status s = WaitForFillLocked(num_pages, owner, fill_wait_until);
    if (s.ok()) return TakeLocked(num_pages, owner);
    if (!absl::IsNotFound(s)) return s;
    missing = num_pages - (free_pages_ + scrubbing_pages_);
  }
  // Without mu_: the evictor takes the page cache's mutex, which ranks
  // below ours (class comment).
  const std::vector<uint64_t> evicted = evict(missing);
  absl::MutexLock lock(&mu_);
  uint64_t pinned = 0;
  if (!evicted.empty()) {
    absl::StatusOr<uint64_t> freed = UncacheLocked(RunsOf(evicted), &pinned);
    if (!freed.ok()) {
      return absl::InternalError(absl::StrCat(
          "the page cache evicted a page the allocator does not hold as "
          "cached: ",
          freed.status().message()));
    }
  }
  if (MakeRoomLocked(num_pages, owner)) return TakeLocked(num_pages, owner);
  return absl::ResourceExhaustedError(absl::StrCat(
      Exhausted(num_pages).message(), "; of the ", missing,
      " missing the page cache could evict ", evicted.size(), " (", pinned,
      " of them still read by copies in flight); ", cached_pages_,
      " pages stay cached"));
}

absl::Status SlotAllocator::PinForRead(const std::vector<PageRun>& runs,
                                       OwnerTag owner,
                                       CachedReadCheck may_read_cached,
                                       bool owned_pages_idle) {
  if (absl::Status s = CheckSessionTag(owner); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  std::vector<PageRun> cached;
  for (const PageRun& run : runs) {
    if (absl::Status s = CheckRange(run); !s.ok()) return s;
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      if (owner_[p] != kCacheOwner) {
        if (owner_[p] == owner) {
          if (owned_pages_idle && in_flight_[p] != 0) {
            return absl::FailedPreconditionError(absl::StrCat(
                "page ", p, " has a copy in flight; wait for its operation first"));
          }
          continue;
        }
        return CheckOwnedLocked({{p, 1}}, owner, /*idle=*/false);
      }
      if (free_when_unpinned_[p]) {
        return absl::FailedPreconditionError(
            absl::StrCat("page ", p, " was evicted from the page cache"));
      }
      if (!cached.empty() &&
          cached.back().first_page + cached.back().num_pages == p) {
        ++cached.back().num_pages;
      } else {
        cached.push_back({p, 1});
      }
    }
  }
  if (!cached.empty()) {
    if (absl::Status s = may_read_cached(cached); !s.ok()) return s;
  }
  PinLocked(runs);
  return absl::OkStatus();
}

void SlotAllocator::Unpin(const std::vector<PageRun>& runs) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> done;  // evicted pages no copy reads any more
  for (const PageRun& run : runs) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      if (--in_flight_[p] == 0 && free_when_unpinned_[p]) done.push_back(p);
    }
  }
  const uint64_t released = done.size();
  for (const PageRun& run : RunsOf(std::move(done))) {
    const uint64_t end = run.first_page + run.num_pages;
    for (uint64_t p = run.first_page; p < end;) {
      const uint64_t first = p;
      while (p < end && writer_[p] == writer_[first]) {
        free_when_unpinned_[p] = 0;
        owner_[p++] = kNoOwner;
      }
      Release(first, p - first, writer_[first]);
    }
  }
  cached_pages_ -= released;
  freed_when_unpinned_pages_ -= released;
}

absl::StatusOr<uint64_t> SlotAllocator::Cache(const std::vector<PageRun>& runs,
                                              OwnerTag from) {
  if (absl::Status s = CheckSessionTag(from); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOwnedLocked(runs, from, true); !s.ok()) return s;
  return MoveOwnerLocked(runs, from, kCacheOwner);
}

namespace {

// For Mutex::AwaitWithDeadline: no page of the runs has a copy in flight.
struct IdleWait {
  const std::vector<PageRun>* runs;
  const std::vector<uint32_t>* in_flight;
};

bool AllIdle(IdleWait* wait) {
  for (const PageRun& run : *wait->runs) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      if ((*wait->in_flight)[p] != 0) return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<uint64_t> SlotAllocator::Cache(const std::vector<PageRun>& runs,
                                              OwnerTag from,
                                              absl::Time wait_until) {
  if (absl::Status s = CheckSessionTag(from); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOwnedLocked(runs, from, false); !s.ok()) return s;
  IdleWait wait{&runs, &in_flight_};
  if (!mu_.AwaitWithDeadline(absl::Condition(&AllIdle, &wait), wait_until)) {
    return absl::DeadlineExceededError(
        "pages to publish still had copies in flight when the wait ended; "
        "nothing was published");
  }
  // Checked again: the lock was released while waiting.
  if (absl::Status s = CheckOwnedLocked(runs, from, true); !s.ok()) return s;
  return MoveOwnerLocked(runs, from, kCacheOwner);
}

void SlotAllocator::ConfirmCached(const std::vector<uint64_t>& pages) {
  absl::MutexLock lock(&mu_);
  if (ledger_ == nullptr) return;
  for (uint64_t p : pages) {
    if (p < owner_.size() && owner_[p] == kCacheOwner && !free_when_unpinned_[p]) {
      Record(p, 1, kCacheOwner);
    }
  }
}

absl::StatusOr<uint64_t> SlotAllocator::Reclaim(
    const std::vector<PageRun>& runs, OwnerTag to) {
  if (absl::Status s = CheckSessionTag(to); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  for (const PageRun& run : runs) {
    if (absl::Status s = CheckRange(run); !s.ok()) return s;
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      if (owner_[p] != kCacheOwner || free_when_unpinned_[p]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "page ", p,
            owner_[p] != kCacheOwner ? " is not cached"
                                     : " was evicted from the page cache"));
      }
      if (in_flight_[p] != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "page ", p, " has a copy in flight; wait for its operation first"));
      }
    }
  }
  return MoveOwnerLocked(runs, kCacheOwner, to);
}

absl::StatusOr<uint64_t> SlotAllocator::Uncache(
    const std::vector<PageRun>& runs) {
  absl::MutexLock lock(&mu_);
  uint64_t pinned = 0;
  return UncacheLocked(runs, &pinned);
}

absl::StatusOr<uint64_t> SlotAllocator::UncacheLocked(
    const std::vector<PageRun>& runs, uint64_t* pinned) {
  std::vector<PageRun> sorted = runs;
  std::sort(sorted.begin(), sorted.end(),
            [](const PageRun& a, const PageRun& b) {
              return a.first_page < b.first_page;
            });
  for (size_t r = 0; r < sorted.size(); ++r) {
    const PageRun& run = sorted[r];
    if (absl::Status s = CheckRange(run); !s.ok()) return s;
    if (r > 0 &&
        sorted[r - 1].first_page + sorted[r - 1].num_pages > run.first_page) {
      return absl::FailedPreconditionError(absl::StrCat(
          "page ", run.first_page, " is listed twice in the request"));
    }
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      if (owner_[p] != kCacheOwner || free_when_unpinned_[p]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "page ", p,
            owner_[p] != kCacheOwner ? " is not cached"
                                     : " is already uncached (still read)"));
      }
    }
  }
  uint64_t freed = 0;
  *pinned = 0;
  for (const PageRun& run : sorted) {
    const uint64_t end = run.first_page + run.num_pages;
    for (uint64_t p = run.first_page; p < end;) {
      if (in_flight_[p] != 0) {
        free_when_unpinned_[p] = 1;
        ++*pinned;
        ++p;
        continue;
      }
      const uint64_t first = p;
      while (p < end && in_flight_[p] == 0 && writer_[p] == writer_[first]) {
        owner_[p++] = kNoOwner;
      }
      Release(first, p - first, writer_[first]);  // the publisher's bytes
      freed += p - first;
    }
  }
  cached_pages_ -= freed;
  freed_when_unpinned_pages_ += *pinned;
  return freed;
}
uint64_t SlotAllocator::cached_pages() const {
  absl::MutexLock lock(&mu_);
  return cached_pages_;
}

uint64_t SlotAllocator::pages_freed_when_unpinned() const {
  absl::MutexLock lock(&mu_);
  return freed_when_unpinned_pages_;
}

}  // namespace hostkv
