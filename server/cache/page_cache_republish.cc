// PageCache::Republished: the items of a Publish that an earlier try of the
// same call cached already (its answer lost to a daemon restart).
#include "proto/contract/status_macros.h"
#include "server/cache/page_cache.h"

namespace hostkv {

uint64_t PageCache::PageOf(absl::string_view name_space,
                           absl::string_view key) const {
  absl::MutexLock lock(&mu_);
  auto ns_it = namespace_ids_.find(name_space);
  if (ns_it == namespace_ids_.end()) return kNotCached;
  const uint16_t ns = ns_it->second;
  const uint32_t page = FindLocked(KeyRef{ns, key, HashOf(ns, key)});
  return page == kNone ? kNotCached : page;
}

absl::StatusOr<std::vector<bool>> PageCache::Republished(
    absl::string_view name_space, absl::Span<const PublishItem> items,
    bool acquire, OwnerTag session) {
  std::vector<bool> done(items.size(), false);
  absl::MutexLock lock(&mu_);
  auto ns_it = namespace_ids_.find(name_space);
  if (ns_it == namespace_ids_.end()) return done;
  const uint16_t ns = ns_it->second;
  uint64_t found = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const uint32_t page =
        FindLocked(KeyRef{ns, items[i].key, HashOf(ns, items[i].key)});
    if (page != kNone && page == items[i].page) {
      done[i] = true;
      ++found;
    }
  }
  if (!acquire || found == 0) return done;
  RETURN_IF_ERROR(ChargeReferences(found));
  SessionRefs& held = refs_[session];
  for (size_t i = 0; i < items.size(); ++i) {
    if (done[i]) AddRef(static_cast<uint32_t>(items[i].page), held);
  }
  return done;
}

}  // namespace hostkv
