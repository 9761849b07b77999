// PageCache: the digests of cached pages (server/cache/page_digest.h) and
// what becomes of a page that no longer matches its digest. The cache only
// keeps the numbers; the daemon computes and checks them outside its lock.
#include "server/cache/page_cache.h"
#include "server/cache/page_cache_entry.h"

namespace hostkv {

bool PageCache::SetDigest(uint64_t page, absl::string_view key, uint32_t digest) {
  absl::MutexLock lock(&mu_);
  if (!CachedLocked(page)) return false;
  Entry& e = At(static_cast<uint32_t>(page));
  if (e.detached() || (e.flags & Entry::kDigestKnown) != 0 || e.Key() != key) {
    return false;
  }
  e.digest = digest;
  e.flags |= Entry::kDigestKnown;
  ++digests_known_;
  ++digests_.computed;
  if (ledger_ != nullptr) ledger_->RecordDigest(page, digest);
  return true;
}

std::vector<PageCache::Undigested> PageCache::ListUndigested() const {
  absl::MutexLock lock(&mu_);
  std::vector<Undigested> out(namespaces_.size());
  for (uint32_t page : keys_) {
    const Entry& e = At(page);
    if ((e.flags & Entry::kDigestKnown) != 0) continue;
    out[e.ns].pages.push_back(page);
    out[e.ns].keys.emplace_back(e.Key());
  }
  for (size_t ns = 0; ns < out.size(); ++ns) out[ns].name_space = namespaces_[ns].name;
  return out;
}

std::vector<std::optional<uint32_t>> PageCache::DigestsOf(
    absl::Span<const uint64_t> pages) const {
  std::vector<std::optional<uint32_t>> out(pages.size());
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < pages.size(); ++i) {
    if (!CachedLocked(pages[i])) continue;
    const Entry& e = At(static_cast<uint32_t>(pages[i]));
    if ((e.flags & Entry::kDigestKnown) != 0 && !e.detached()) out[i] = e.digest;
  }
  return out;
}

void PageCache::DetachLocked(uint32_t page, MissReason why, absl::Time now) {
  Entry& e = At(page);
  if (e.detached()) return;
  const size_t hash = HashOf(e.ns, e.Key());
  keys_.erase(keys_.find(KeyRef{e.ns, e.Key(), hash}));
  // Readers of the eviction log (engines' indexes of what is cached) drop
  // the key as they drop an evicted one.
  evictions_.Record(e.ns, e.Key());
  history_.Dropped(e.ns, hash, why, now);
  if (ledger_ != nullptr) ledger_->RecordEvicted(page);
  if ((e.flags & Entry::kDigestKnown) != 0) --digests_known_;
  e.flags = Entry::kDetached;
  ++detached_;
  Count(e.ns, &CacheCounters::evictions, 1);
  if (Evictable(e) && page != coldest_) {  // the next to go
    Unlink(page);
    LinkCold(page);
  }
}

void PageCache::RejectHits(absl::string_view name_space, LookupResult& found, size_t at,
                           bool acquire, OwnerTag session) {
  absl::MutexLock lock(&mu_);
  const auto ns_it = namespace_ids_.find(name_space);
  if (ns_it == namespace_ids_.end() || at >= found.hits) return;
  const size_t dropped = found.hits - at;
  if (acquire) {
    auto held = refs_.find(session);
    for (size_t i = at; i < found.hits && held != refs_.end(); ++i) {
      const auto page = static_cast<uint32_t>(found.pages[i]);
      auto count = held->second.by_page.find(page);
      if (count == held->second.by_page.end()) continue;  // released meanwhile
      if (--count->second == 0) held->second.by_page.erase(count);
      --held->second.total;
      DropRefs(page, 1);
    }
    if (held != refs_.end() && held->second.total == 0) refs_.erase(held);
    UnchargeReferences();
  }
  Count(ns_it->second, &CacheCounters::hits, -static_cast<int64_t>(dropped));
  ++digests_.mismatched;
  const auto page = static_cast<uint32_t>(found.pages[at]);
  // Still the page found (the lookup's reference, or none without acquire:
  // it may have been evicted and reused meanwhile, then it is not dropped).
  if (CachedLocked(page) && At(page).ns == ns_it->second) {
    DetachLocked(page, MissReason::kDigestMismatch, absl::Now());
  }
  found.hits = at;
  found.pages.resize(at);
}

void PageCache::DropMismatched(absl::string_view name_space, absl::string_view key,
                               uint64_t page) {
  absl::MutexLock lock(&mu_);
  const auto ns = namespace_ids_.find(name_space);
  if (ns == namespace_ids_.end()) return;
  const uint32_t found = FindLocked(KeyRef{ns->second, key, HashOf(ns->second, key)});
  if (found != page) return;
  ++digests_.mismatched;
  DetachLocked(found, MissReason::kDigestMismatch, absl::Now());
}

void PageCache::NoteDropped(absl::string_view name_space, absl::string_view key,
                            MissReason why) {
  if (!CheckCacheNamespace(name_space).ok() || key.empty() || key.size() > kMaxCacheKeyBytes) {
    return;
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<uint16_t> ns = InternLocked(name_space);
  if (!ns.ok()) return;
  history_.Dropped(*ns, HashOf(*ns, key), why, absl::Now());
}

void PageCache::CountVerified(uint64_t matched, uint64_t unknown) {
  absl::MutexLock lock(&mu_);
  digests_.verified += matched;
  digests_.unverified += unknown;
}

void PageCache::CountAdoptionDropped(uint64_t pages) {
  absl::MutexLock lock(&mu_);
  digests_.adoption_dropped += pages;
}

void PageCache::CountTierRefused(uint64_t values) {
  absl::MutexLock lock(&mu_);
  digests_.tier_refused += values;
}

DigestCounters PageCache::digest_counters() const {
  absl::MutexLock lock(&mu_);
  DigestCounters c = digests_;
  c.pending = total_.cached - detached_ - digests_known_;
  return c;
}

}  // namespace hostkv
