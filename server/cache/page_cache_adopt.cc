// PageCache::Adopt: the cache a previous daemon left in its ledger.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "server/cache/page_cache.h"
#include "server/cache/page_cache_entry.h"

namespace hostkv {

absl::StatusOr<std::vector<uint64_t>> PageCache::Adopt(
    std::vector<AdoptedEntry> entries) {
  // Oldest first: each publish below links its page at the hot end.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const AdoptedEntry& a, const AdoptedEntry& b) {
                     return a.use < b.use;
                   });
  absl::MutexLock lock(&mu_);
  if (total_.cached != 0 || !refs_.empty()) {
    return absl::FailedPreconditionError(
        "adopting entries into a page cache that is in use");
  }
  std::vector<uint64_t> cached;
  // page -> the use its record gave, for the adopted pages.
  absl::flat_hash_map<uint64_t, uint64_t> use_of;
  std::vector<std::pair<uint32_t, uint64_t>> links;  // (child, parent)
  for (const AdoptedEntry& a : entries) {
    if (a.page >= num_pages_ || !CheckCacheNamespace(a.name_space).ok() ||
        a.key.empty() || a.key.size() > kMaxCacheKeyBytes ||
        CachedLocked(a.page)) {
      continue;
    }
    absl::StatusOr<uint16_t> ns = InternLocked(a.name_space);
    if (!ns.ok()) continue;
    const PublishItem item{a.key, absl::string_view(), a.page};
    uint32_t page = kNone;
    PublishOneLocked(*ns, item, HashOf(*ns, a.key), kNone, &page);
    if (page != a.page) continue;  // the key was adopted with another page
    cached.push_back(a.page);
    if (a.digest.has_value()) {  // checked against the bytes by the caller
      Entry& e = At(page);
      e.digest = *a.digest;
      e.flags |= Entry::kDigestKnown;
      ++digests_known_;
      if (ledger_ != nullptr) ledger_->RecordDigest(page, *a.digest);
    }
    use_of[a.page] = a.use;
    if (a.parent != UINT64_MAX) links.emplace_back(page, a.parent);
  }
  // A parent was published before its child (and stays cached while the
  // child is), so a link to a page adopted with a later use is not one the
  // daemon wrote: dropped, which also rules out cycles.
  for (const auto& [child, parent] : links) {
    auto it = use_of.find(parent);
    if (it == use_of.end() || parent == child || it->second >= use_of[child]) {
      continue;
    }
    At(child).parent = static_cast<uint32_t>(parent);
    AddChild(static_cast<uint32_t>(parent));
  }
  return cached;
}

}  // namespace hostkv
