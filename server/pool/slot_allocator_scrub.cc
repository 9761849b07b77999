// SlotAllocator's freed pages on their way to reuse: Release files them
// under the session whose bytes they hold, ScrubLocked zeroes them (inline
// for an Allocate, or for the background scrubber through ScrubPending,
// which leaves a live session's pages to it for kReuseWindow).
#include <algorithm>
#include <iterator>
#include <vector>

#include "server/operations/crash_point.h"
#include "server/pool/slot_allocator.h"

namespace hostkv {

void SlotAllocator::Release(uint64_t first, uint64_t count, OwnerTag bytes_of) {
  if (scrub_ == nullptr) {
    Record(first, count, kNoOwner);
    free_.Insert(first, count);
    free_pages_ += count;
    return;
  }
  Record(first, count, kUnscrubbedMark);
  Pending& pending = pending_[bytes_of];
  if (!pending.runs.empty() &&
      pending.runs.back().first_page + pending.runs.back().num_pages == first) {
    pending.runs.back().num_pages += count;
  } else {
    pending.runs.push_back({first, count, absl::Now()});
  }
  pending.pages += count;
  pending_pages_ += count;
  scrubbing_pages_ += count;
}

uint64_t SlotAllocator::ScrubbableLocked(absl::Time released_before,
                                         absl::Time* next) const {
  uint64_t pages = 0;
  *next = absl::InfiniteFuture();
  for (const auto& [bytes_of, pending] : pending_) {
    if (bytes_of == kNoOwner) {
      pages += pending.pages;
      continue;
    }
    for (const PendingRun& run : pending.runs) {
      if (run.released > released_before) {
        *next = std::min(*next, run.released + kReuseWindow);
        break;
      }
      pages += run.num_pages;
    }
  }
  return pages;
}

uint64_t SlotAllocator::ScrubLocked(uint64_t max_pages, OwnerTag spare,
                                    absl::Time released_before) {
  std::vector<PageRun> runs;
  uint64_t pages = 0;
  for (auto it = pending_.begin(); it != pending_.end() && pages < max_pages;) {
    if (it->first == spare) {
      ++it;
      continue;
    }
    Pending& pending = it->second;
    while (pages < max_pages && !pending.runs.empty() &&
           (it->first == kNoOwner ||
            pending.runs.front().released <= released_before)) {
      PendingRun& front = pending.runs.front();
      const uint64_t take = std::min(front.num_pages, max_pages - pages);
      runs.push_back({front.first_page, take});
      pages += take;
      pending.pages -= take;
      if (take == front.num_pages) {
        pending.runs.pop_front();
      } else {
        front.first_page += take;
        front.num_pages -= take;
      }
    }
    it = pending.runs.empty() ? pending_.erase(it) : std::next(it);
  }
  pending_pages_ -= pages;
  const bool recorded = ledger_ != nullptr;  // read under the lock
  // The pages are neither free nor owned: nobody else touches them while
  // they are zeroed without the lock.
  mu_.Unlock();
  for (const PageRun& run : runs) scrub_(run);
  if (recorded) CrashPoint("scrub");
  mu_.Lock();
  for (const PageRun& run : runs) {
    Record(run.first_page, run.num_pages, kNoOwner);
    free_.Insert(run.first_page, run.num_pages);
  }
  free_pages_ += pages;
  scrubbing_pages_ -= pages;
  return pages;
}

bool SlotAllocator::ScrubPending(uint64_t max_pages) {
  absl::MutexLock lock(&mu_);
  while (!stopped_) {
    const absl::Time before = absl::Now() - kReuseWindow;
    absl::Time next;
    if (ScrubbableLocked(before, &next) > 0) {
      ScrubLocked(std::max<uint64_t>(max_pages, 1), /*spare=*/kCacheOwner, before);
      return true;
    }
    // Until pages are released (or taken back), stopped, or pages a
    // session left come out of its reuse window.
    const uint64_t seen = pending_pages_;
    auto work = [this, seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // as in Allocate
      return stopped_ || pending_pages_ != seen;
    };
    mu_.AwaitWithDeadline(absl::Condition(&work), next);
  }
  return false;
}

void SlotAllocator::StopScrubbing() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

uint64_t SlotAllocator::scrubbing_pages() const {
  absl::MutexLock lock(&mu_);
  return scrubbing_pages_;
}

}  // namespace hostkv
