// SlotAllocator while its pool fills: pages become free as they turn
// resident (AddResident), and Allocate waits for them or says why not.
#include "absl/strings/str_cat.h"
#include "server/pool/slot_allocator.h"

namespace hostkv {

void SlotAllocator::AddResident(const PageRun& run) {
  if (run.num_pages == 0) return;
  absl::MutexLock lock(&mu_);
  free_.Insert(run.first_page, run.num_pages);
  free_pages_ += run.num_pages;
  unready_pages_ -= run.num_pages;
  if (unready_pages_ == 0) filling_ = false;
}

void SlotAllocator::EndFill() {
  absl::MutexLock lock(&mu_);
  filling_ = false;
}

uint64_t SlotAllocator::ready_pages() const {
  absl::MutexLock lock(&mu_);
  return num_pages_ - unready_pages_;
}

absl::Status SlotAllocator::WaitForFillLocked(uint64_t num_pages,
                                              OwnerTag owner,
                                              absl::Time until) {
  auto not_for_fill = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !filling_ ||
           num_pages > free_pages_ + scrubbing_pages_ + unready_pages_;
  };
  if (not_for_fill()) return absl::NotFoundError("not filling");
  auto ready_text = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return absl::StrCat(num_pages_ - unready_pages_, " of its ", num_pages_,
                        " pages are resident, ", free_pages_ + scrubbing_pages_,
                        " of those free; asked for ", num_pages);
  };
  if (absl::Now() >= until) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the pool is still filling: ", ready_text(),
        "; retry, or ask with fill_wait_ms to wait for the pages"));
  }
  for (;;) {
    // absl evaluates the condition with mu_ held (possibly on the thread
    // releasing it).
    auto progress = [this, num_pages]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return !filling_ || num_pages <= free_pages_ + scrubbing_pages_;
    };
    const bool woke = mu_.AwaitWithDeadline(absl::Condition(&progress), until);
    if (MakeRoomLocked(num_pages, owner)) return absl::OkStatus();
    if (not_for_fill()) return absl::NotFoundError("not filling");
    if (!woke || absl::Now() >= until) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the pool is still filling: ", ready_text(),
          " (waited for fill_wait_ms)"));
    }
  }
}

}  // namespace hostkv
