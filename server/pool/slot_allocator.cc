#include "server/pool/slot_allocator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/pool/page_ledger.h"

namespace hostkv {

SlotAllocator::SlotAllocator(uint64_t num_pages, ScrubFn scrub, bool resident)
    : num_pages_(num_pages),
      scrub_(std::move(scrub)),
      owner_(num_pages, kNoOwner),
      in_flight_(num_pages, 0),
      free_when_unpinned_(num_pages, 0),
      free_(num_pages),
      writer_(num_pages, kNoOwner) {
  if (!resident) {
    unready_pages_ = num_pages;
    filling_ = num_pages > 0;
    return;
  }
  free_.Insert(0, num_pages);
  free_pages_ = num_pages;
}

absl::Status SlotAllocator::CheckSessionTag(OwnerTag owner) {
  if (owner != kCacheOwner) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "owner tag kCacheOwner is the page cache's, not a session's");
}

uint64_t SlotAllocator::PendingOf(OwnerTag owner) const {
  auto it = pending_.find(owner);
  return it == pending_.end() ? 0 : it->second.pages;
}

bool SlotAllocator::MakeRoomLocked(uint64_t num_pages, OwnerTag owner) {
  // Rechecked each time: others may take pages while mu_ is released. The
  // owner's own pending pages need no zeroing; the rest must be free.
  auto clean_needed = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return num_pages - std::min(num_pages, PendingOf(owner));
  };
  while (clean_needed() > free_pages_) {
    if (num_pages > free_pages_ + scrubbing_pages_) return false;
    if (pending_pages_ > PendingOf(owner)) {
      ScrubLocked(clean_needed() - free_pages_, /*spare=*/owner,
                  absl::InfiniteFuture());
      continue;
    }
    // The rest is being zeroed by another thread (one batch at most).
    // absl evaluates a condition with mu_ held, possibly on the thread that
    // releases it, so no AssertHeld() in here.
    auto progress = [this, num_pages, owner]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      const uint64_t own = std::min(num_pages, PendingOf(owner));
      return num_pages - own <= free_pages_ || pending_pages_ > PendingOf(owner) ||
             num_pages > free_pages_ + scrubbing_pages_;
    };
    mu_.Await(absl::Condition(&progress));
  }
  return true;
}

std::vector<PageRun> SlotAllocator::TakeLocked(uint64_t num_pages,
                                               OwnerTag owner) {
  std::vector<PageRun> runs;
  uint64_t left = num_pages;
  if (auto own = pending_.find(owner); own != pending_.end()) {
    // Pages holding only the owner's bytes come back to it unzeroed.
    Pending& mine = own->second;
    while (left > 0 && !mine.runs.empty()) {
      PendingRun& back = mine.runs.back();
      const uint64_t take = std::min(left, back.num_pages);
      const uint64_t first = back.first_page + back.num_pages - take;
      std::fill(owner_.begin() + first, owner_.begin() + first + take, owner);
      Record(first, take, owner);
      Extend(owner, first, first + take - 1);
      runs.push_back({first, take});
      left -= take;
      mine.pages -= take;
      pending_pages_ -= take;
      scrubbing_pages_ -= take;
      if ((back.num_pages -= take) == 0) mine.runs.pop_back();
    }
    if (mine.runs.empty()) pending_.erase(own);
  }
  usage_[owner] += num_pages - left;
  num_pages = left;
  while (left > 0) {
    uint64_t take = 0;
    const uint64_t first = free_.TakeLowest(left, &take);
    std::fill(owner_.begin() + first, owner_.begin() + first + take, owner);
    Record(first, take, owner);
    Extend(owner, first, first + take - 1);
    runs.push_back({first, take});
    left -= take;
  }
  free_pages_ -= num_pages;
  usage_[owner] += num_pages;
  return runs;
}

absl::StatusOr<std::vector<PageRun>> SlotAllocator::Allocate(
    uint64_t num_pages, OwnerTag owner, absl::Time fill_wait_until) {
  if (num_pages == 0) {
    return absl::InvalidArgumentError("cannot allocate 0 pages");
  }
  if (absl::Status s = CheckSessionTag(owner); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (!MakeRoomLocked(num_pages, owner)) {
    absl::Status s = WaitForFillLocked(num_pages, owner, fill_wait_until);
    if (absl::IsNotFound(s)) return Exhausted(num_pages);
    if (!s.ok()) return s;
  }
  return TakeLocked(num_pages, owner);
}

absl::Status SlotAllocator::Exhausted(uint64_t requested) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "pool full: asked for ", requested, " pages, ",
      free_pages_ + scrubbing_pages_ + unready_pages_, " of ", num_pages_,
      " are free",
      unready_pages_ == 0
          ? ""
          : absl::StrCat(" (", unready_pages_,
                         filling_ ? " of them not yet resident: the pool is "
                                    "still filling)"
                                  : " of them never made resident: the "
                                    "pool's fill failed)")));
}

void SlotAllocator::Record(uint64_t first, uint64_t count,
                           OwnerTag owner) const {
  if (ledger_ != nullptr && count > 0) ledger_->RecordOwner(first, count, owner);
}

absl::Status SlotAllocator::CheckRange(const PageRun& run) const {
  if (run.num_pages == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty page run at page ", run.first_page));
  }
  if (run.first_page >= num_pages_ ||
      run.num_pages > num_pages_ - run.first_page) {
    return absl::InvalidArgumentError(
        absl::StrCat("pages [", run.first_page, ", +", run.num_pages,
                     ") out of range: the pool has ", num_pages_, " pages"));
  }
  return absl::OkStatus();
}

absl::Status SlotAllocator::CheckOwnedLocked(const std::vector<PageRun>& runs,
                                             OwnerTag owner, bool idle) const {
  for (const PageRun& run : runs) {
    if (absl::Status s = CheckRange(run); !s.ok()) return s;
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      if (owner_[p] != owner) {
        return absl::FailedPreconditionError(absl::StrCat(
            "page ", p,
            owner_[p] == kNoOwner ? " is not allocated"
            : owner_[p] == kCacheOwner
                ? " is cached: it belongs to the page cache, not to a session"
                : " belongs to another session"));
      }
      if (idle && in_flight_[p] != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "page ", p, " has a copy in flight; wait for its operation first"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SlotAllocator::CheckOwned(const std::vector<PageRun>& runs,
                                       OwnerTag owner) const {
  if (absl::Status s = CheckSessionTag(owner); !s.ok()) return s;
  absl::ReaderMutexLock lock(&mu_);
  return CheckOwnedLocked(runs, owner, /*idle=*/false);
}

absl::Status SlotAllocator::CheckOwnedIdle(const std::vector<PageRun>& runs,
                                           OwnerTag owner) const {
  if (absl::Status s = CheckSessionTag(owner); !s.ok()) return s;
  absl::ReaderMutexLock lock(&mu_);
  return CheckOwnedLocked(runs, owner, /*idle=*/true);
}

void SlotAllocator::PinLocked(const std::vector<PageRun>& runs) {
  for (const PageRun& run : runs) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      ++in_flight_[p];
    }
  }
}

absl::Status SlotAllocator::Pin(const std::vector<PageRun>& runs,
                                OwnerTag owner) {
  if (absl::Status s = CheckSessionTag(owner); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOwnedLocked(runs, owner, false); !s.ok()) return s;
  PinLocked(runs);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SlotAllocator::HandOver(
    const std::vector<PageRun>& runs, OwnerTag from, OwnerTag to) {
  if (absl::Status s = CheckSessionTag(from); !s.ok()) return s;
  if (absl::Status s = CheckSessionTag(to); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOwnedLocked(runs, from, true); !s.ok()) return s;
  if (from == to) return uint64_t{0};  // nothing moves
  return MoveOwnerLocked(runs, from, to);
}

uint64_t SlotAllocator::MoveOwnerLocked(const std::vector<PageRun>& runs,
                                        OwnerTag from, OwnerTag to) {
  uint64_t pages = 0;  // a page listed twice is moved (and counted) once
  for (const PageRun& run : runs) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      if (owner_[p] != from) continue;
      owner_[p] = to;
      if (to == kCacheOwner) writer_[p] = from;
      if (to == kCacheOwner && from != kTierOwner && ledger_ != nullptr) {
        ledger_->RecordPublishing(p, from);
      } else {
        Record(p, 1, to);
      }
      ++pages;
    }
    if (to != kCacheOwner) {
      Extend(to, run.first_page, run.first_page + run.num_pages - 1);
    }
  }
  if (from == kCacheOwner) {
    cached_pages_ -= pages;
  } else if ((usage_[from] -= pages) == 0) {
    usage_.erase(from);
    span_.erase(from);
  }
  if (to == kCacheOwner) {
    cached_pages_ += pages;
  } else {
    usage_[to] += pages;
  }
  return pages;
}

absl::StatusOr<uint64_t> SlotAllocator::Free(const std::vector<PageRun>& runs,
                                             OwnerTag owner) {
  if (absl::Status s = CheckSessionTag(owner); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOwnedLocked(runs, owner, /*idle=*/true); !s.ok()) {
    return s;
  }
  // Mark pages free run by run; a page listed twice is found free the second
  // time, and everything marked so far is given back to the owner.
  uint64_t freed = 0;
  size_t r = 0;
  for (; r < runs.size(); ++r) {
    const PageRun& run = runs[r];
    bool duplicate = false;
    uint64_t p = run.first_page;
    for (; p < run.first_page + run.num_pages; ++p) {
      if (owner_[p] != owner) {
        duplicate = true;
        break;
      }
      owner_[p] = kNoOwner;
    }
    if (duplicate) {
      std::fill(owner_.begin() + run.first_page, owner_.begin() + p, owner);
      for (size_t u = 0; u < r; ++u) {
        std::fill(owner_.begin() + runs[u].first_page,
                  owner_.begin() + runs[u].first_page + runs[u].num_pages,
                  owner);
      }
      return absl::FailedPreconditionError(
          absl::StrCat("page ", p, " is listed twice in the request"));
    }
    freed += run.num_pages;
  }
  for (const PageRun& run : runs) Release(run.first_page, run.num_pages, owner);
  if ((usage_[owner] -= freed) == 0) {
    usage_.erase(owner);
    span_.erase(owner);
  }
  return freed;
}

absl::Status SlotAllocator::Restore(absl::Span<const OwnerTag> owners) {
  if (owners.size() != num_pages_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "restoring ", owners.size(), " page owners into a pool of ",
        num_pages_, " pages"));
  }
  absl::MutexLock lock(&mu_);
  if (free_pages_ + scrubbing_pages_ != num_pages_ || scrubbing_pages_ != 0 ||
      cached_pages_ != 0 || unready_pages_ != 0) {
    return absl::FailedPreconditionError("restoring a pool already in use");
  }
  for (uint64_t p = 0; p < num_pages_; ++p) {
    if (owners[p] == kTierOwner) {
      return absl::InvalidArgumentError(
          absl::StrCat("page ", p, " is restored to the storage tier's work"));
    }
  }
  free_.Clear();
  free_pages_ = 0;
  usage_.clear();
  span_.clear();
  for (uint64_t p = 0; p < num_pages_;) {
    const OwnerTag owner = owners[p];
    const uint64_t first = p;
    while (p < num_pages_ && owners[p] == owner) ++p;
    const uint64_t count = p - first;
    if (owner == kNoOwner) {
      free_.Insert(first, count);
      free_pages_ += count;
    } else if (owner == kUnscrubbedMark) {
      std::fill(owner_.begin() + first, owner_.begin() + p, kNoOwner);
      if (scrub_ == nullptr) {
        free_.Insert(first, count);
        free_pages_ += count;
      } else {
        Release(first, count, kNoOwner);  // whose bytes: unknown
      }
    } else {
      std::fill(owner_.begin() + first, owner_.begin() + p, owner);
      if (owner == kCacheOwner) {
        cached_pages_ += count;
      } else {
        usage_[owner] += count;
        Extend(owner, first, p - 1);
      }
    }
  }
  return absl::OkStatus();
}

uint64_t SlotAllocator::FreeAllOwnedBy(OwnerTag owner) {
  absl::MutexLock lock(&mu_);
  auto it = usage_.find(owner);
  if (it == usage_.end()) return 0;
  const uint64_t pages = it->second;
  usage_.erase(it);
  auto span_it = span_.find(owner);
  const Span span =
      span_it == span_.end() ? Span{0, num_pages_ - 1} : span_it->second;
  if (span_it != span_.end()) span_.erase(span_it);
  for (uint64_t p = span.first; p <= span.last;) {
    if (owner_[p] != owner) {
      ++p;
      continue;
    }
    const uint64_t first = p;
    while (p <= span.last && owner_[p] == owner) owner_[p++] = kNoOwner;
    // The session is ending: nobody will take these back.
    Release(first, p - first, kNoOwner);
  }
  return pages;
}

void SlotAllocator::Extend(OwnerTag owner, uint64_t first, uint64_t last) {
  auto [it, inserted] = span_.try_emplace(owner, Span{first, last});
  if (!inserted) {
    it->second.first = std::min(it->second.first, first);
    it->second.last = std::max(it->second.last, last);
  }
}

uint64_t SlotAllocator::free_pages() const {
  absl::MutexLock lock(&mu_);
  return free_pages_ + scrubbing_pages_ + unready_pages_;
}

uint64_t SlotAllocator::pages_owned_by(OwnerTag owner) const {
  absl::MutexLock lock(&mu_);
  auto it = usage_.find(owner);
  return it == usage_.end() ? 0 : it->second;
}

absl::flat_hash_map<OwnerTag, uint64_t> SlotAllocator::UsageByOwner() const {
  absl::MutexLock lock(&mu_);
  return usage_;
}

SlotAllocator::Occupancy SlotAllocator::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return Occupancy{free_pages_ + scrubbing_pages_ + unready_pages_, usage_,
                   cached_pages_};
}

size_t SlotAllocator::free_extents() const {
  absl::MutexLock lock(&mu_);
  return free_.extents();
}

}  // namespace hostkv
