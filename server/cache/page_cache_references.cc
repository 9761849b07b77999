// PageCache: Release, ReleaseAll and the reference queries.
#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"
#include "server/cache/page_cache.h"
#include "server/cache/page_cache_entry.h"

namespace hostkv {

uint64_t PageCache::PagesIn(const std::vector<PageRun>& runs) {
  uint64_t pages = 0;
  for (const PageRun& run : runs) pages += run.num_pages;
  return pages;
}

absl::Status PageCache::CheckRuns(const std::vector<PageRun>& runs) const {
  for (const PageRun& run : runs) {
    if (run.num_pages == 0 || run.first_page >= num_pages_ ||
        run.num_pages > num_pages_ - run.first_page) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page run [", run.first_page, ", +", run.num_pages,
          ") is empty or outside the pool of ", num_pages_, " pages"));
    }
  }
  return absl::OkStatus();
}

uint64_t PageCache::TakeHeldLocked(SessionRefs& held,
                                   const std::vector<PageRun>& runs,
                                   uint64_t* refused) {
  uint64_t taken = 0;
  for (const PageRun& run : runs) {
    for (uint64_t page = run.first_page; page < run.first_page + run.num_pages;
         ++page) {
      auto it = held.by_page.find(static_cast<uint32_t>(page));
      if (it == held.by_page.end() || it->second == 0) {
        *refused = page;
        return taken;
      }
      --it->second;
      ++taken;
    }
  }
  return taken;
}

void PageCache::UndoTakeLocked(SessionRefs& held,
                               const std::vector<PageRun>& runs,
                               uint64_t taken) {
  for (const PageRun& run : runs) {
    for (uint64_t i = 0; i < run.num_pages; ++i) {
      if (taken-- == 0) return;
      ++held.by_page[static_cast<uint32_t>(run.first_page + i)];
    }
  }
}

void PageCache::DropTakenLocked(SessionRefs& held,
                                const std::vector<PageRun>& runs) {
  // Last page first, so that the first ends up hottest.
  for (size_t r = runs.size(); r-- > 0;) {
    for (uint64_t i = runs[r].num_pages; i-- > 0;) {
      const auto page = static_cast<uint32_t>(runs[r].first_page + i);
      DropRefs(page, 1);
      auto it = held.by_page.find(page);
      if (it != held.by_page.end() && it->second == 0) held.by_page.erase(it);
    }
  }
}

absl::StatusOr<uint64_t> PageCache::Release(OwnerTag session,
                                            const std::vector<PageRun>& runs) {
  RETURN_IF_ERROR(CheckRuns(runs));
  if (runs.empty()) return 0;
  absl::MutexLock lock(&mu_);
  auto session_it = refs_.find(session);
  if (session_it == refs_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "page ", runs[0].first_page, " is not referenced by this session"));
  }
  SessionRefs& held = session_it->second;
  // Take the session's counts down first: all of them, or none.
  uint64_t refused = 0;
  const uint64_t taken = TakeHeldLocked(held, runs, &refused);
  if (taken != PagesIn(runs)) {
    UndoTakeLocked(held, runs, taken);
    return absl::FailedPreconditionError(
        absl::StrCat("page ", refused, " is not referenced by this session",
                     taken > 0 ? " (or not as many times as listed)" : ""));
  }
  DropTakenLocked(held, runs);
  held.total -= taken;
  if (held.total == 0) refs_.erase(session_it);
  UnchargeReferences();
  return taken;
}

uint64_t PageCache::ReleaseAll(OwnerTag session) {
  absl::MutexLock lock(&mu_);
  auto it = refs_.find(session);
  if (it == refs_.end()) return 0;
  for (const auto& [page, count] : it->second.by_page) DropRefs(page, count);
  const uint64_t dropped = it->second.total;
  refs_.erase(it);
  UnchargeReferences();
  return dropped;
}

absl::Status PageCache::CheckHeld(OwnerTag session,
                                  const std::vector<PageRun>& runs) const {
  RETURN_IF_ERROR(CheckRuns(runs));
  absl::MutexLock lock(&mu_);
  auto session_it = refs_.find(session);
  for (const PageRun& run : runs) {
    for (uint64_t page = run.first_page; page < run.first_page + run.num_pages;
         ++page) {
      const bool held =
          session_it != refs_.end() &&
          session_it->second.by_page.contains(static_cast<uint32_t>(page));
      if (!held) {
        return absl::FailedPreconditionError(absl::StrCat(
            "page ", page, " is cached and this session holds no reference "
            "on it (Lookup or Publish with acquire first)"));
      }
    }
  }
  return absl::OkStatus();
}

bool PageCache::IsCached(uint64_t page) const {
  absl::MutexLock lock(&mu_);
  return CachedLocked(page);
}

uint32_t PageCache::References(uint64_t page) const {
  absl::MutexLock lock(&mu_);
  return CachedLocked(page) ? At(static_cast<uint32_t>(page)).refs : 0;
}

uint64_t PageCache::ReferencesHeldBy(
    absl::Span<const OwnerTag> sessions) const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (OwnerTag session : sessions) {
    auto it = refs_.find(session);
    if (it != refs_.end()) total += it->second.total;
  }
  return total;
}

uint64_t PageCache::ReferencesHeldBy(OwnerTag session) const {
  absl::MutexLock lock(&mu_);
  auto it = refs_.find(session);
  return it == refs_.end() ? 0 : it->second.total;
}

uint64_t PageCache::PagesReferencedBeyond(OwnerTag holder) const {
  absl::MutexLock lock(&mu_);
  uint64_t pages = total_.referenced;
  auto it = refs_.find(holder);
  if (it == refs_.end()) return pages;
  for (const auto& [page, count] : it->second.by_page) {
    if (CachedLocked(page) && At(page).refs == count) --pages;
  }
  return pages;
}

}  // namespace hostkv
