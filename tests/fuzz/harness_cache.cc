// Harness: the page cache's requests (Publish, Lookup, Release, CopyPages).
//
// The model knows what each session owns and which cached pages it
// references (exactly: referenced pages are never evicted), not which keys
// are cached (allocations evict behind its back); the daemon's cache is
// asked for that, and checked for consistency after every step.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/page_format.h"
#include "server/operations/claim_sweeper.h"
#include "server/pool/pool_access.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"


namespace hostkv::fuzz {
namespace {

constexpr const char* kNamespaces[] = {"ns0", "ns1", "ns2"};

bool ValidNamespace(const std::string& ns) {
  return !ns.empty() && ns.size() <= kMaxCacheNamespaceBytes;
}

bool ValidKey(const std::string& key, bool may_be_empty) {
  return (may_be_empty || !key.empty()) && key.size() <= kMaxCacheKeyBytes;
}

}  // namespace

std::string Harness::PickNamespace() {
  if (OneIn(16)) return std::string(OneIn(2) ? 0 : kMaxCacheNamespaceBytes + 1, 'n');
  return kNamespaces[fdp_->ConsumeIntegralInRange<int>(0, 2)];
}

std::string Harness::PickCacheKey() {
  if (OneIn(24)) return std::string(OneIn(2) ? 0 : kMaxCacheKeyBytes + 1, 'k');
  // Few keys, so that publishes collide and lookups hit.
  return absl::StrCat("k", fdp_->ConsumeIntegralInRange<int>(0, 7));
}

bool Harness::MayUseNamespace(const HostPool& pool, const std::string& ns,
                              const SessionModel& m) const {
  const std::optional<NamespaceOwner> owner = pool.namespaces().OwnerOf(ns);
  if (!owner.has_value()) return true;
  if (m.attached && m.uid == 0) return true;
  if (owner->unverified) return !m.attached;
  return m.attached && m.uid == owner->uid;  // --cache_share=owner
}

namespace {

// A pool in which `m` holds references, or "" (then the caller picks).
std::string PoolWithReferences(const SessionModel* m) {
  if (m == nullptr) return "";
  for (const auto& [pool, held] : m->refs) {
    if (!held.empty()) return pool;
  }
  return "";
}

}  // namespace

void Harness::DoPublish() {
  v1::PublishRequest r;
  r.set_session_id(PickSessionId());
  r.set_pool(PickPoolName());
  r.set_namespace_(PickNamespace());
  r.set_acquire(OneIn(2));
  const auto pool = FindPool(r.pool());
  SessionModel* m = FindLive(r.session_id());
  const uint64_t num_pages = pool ? pool->allocator().num_pages() : 100;
  std::vector<uint64_t> pages;
  for (const PageRun& run : PickPageRuns(m, r.pool(), num_pages, 8)) {
    for (uint64_t i = 0; i < std::min<uint64_t>(run.num_pages, 8); ++i) {
      pages.push_back(run.first_page + i);
    }
  }
  bool keys_valid = !pages.empty();
  std::string previous;
  for (uint64_t page : pages) {
    v1::CacheItem* item = r.add_items();
    item->set_key(PickCacheKey());
    item->set_parent_key(OneIn(2) ? previous : (OneIn(8) ? PickCacheKey() : ""));
    item->set_page(page);
    keys_valid = keys_valid && ValidKey(item->key(), false) &&
                 ValidKey(item->parent_key(), true);
    previous = item->key();
  }
  const bool ns_allowed =
      pool != nullptr && m != nullptr && MayUseNamespace(*pool, r.namespace_(), *m);
  // Items cached already exactly as they say (the key on the item's page):
  // a Publish sent again after a restart; answered CACHED, owned or not.
  std::vector<uint64_t> to_own;
  for (int i = 0; i < r.items_size(); ++i) {
    const bool republished =
        pool != nullptr && keys_valid &&
        pool->cache().PageOf(r.namespace_(), r.items(i).key()) == r.items(i).page();
    if (!republished) to_own.push_back(r.items(i).page());
  }
  auto s = ViaRingOrDirect<v1::PublishResponse>(RingMethod::kPublish, r,
                                                [&] { return handler_.Publish(r); });
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "Publish")) return;
  if (pool == nullptr) {
    FUZZ_CHECK(IsUnknownPoolAnswer(r.pool(), s.status()), "Publish in unknown pool: ",
               s.status().ToString());
    return;
  }
  if (!MayUsePool(pool_owners_.at(r.pool()), *m)) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "Publish in a pool the "
               "session may not use: ", s.status().ToString());
    return;
  }
  const bool valid = keys_valid && ValidNamespace(r.namespace_());
  if (!valid) {
    FUZZ_CHECK(absl::IsInvalidArgument(s.status()), "Publish of bad input: ",
               s.status().ToString(), " ", r.ShortDebugString());
    return;
  }
  if (!ns_allowed) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()),
               "Publish in a namespace of another owner: ", s.status().ToString());
    return;
  }
  const bool owned = AllOwned(m, r.pool(), to_own);
  if (!s.ok()) {
    FUZZ_CHECK(!(owned && outstanding_ == 0) ||
                   absl::IsResourceExhausted(s.status()),
               "Publish of owned idle pages refused: ", s.status().ToString());
    return;
  }
  FUZZ_CHECK(owned, "Publish accepted pages the session does not own: ",
             r.ShortDebugString());
  FUZZ_CHECK(s->results_size() == r.items_size(), "Publish answered ",
             s->results_size(), " results for ", r.items_size(), " items");
  std::set<uint64_t> taken;
  for (int i = 0; i < s->results_size(); ++i) {
    const v1::PublishResult& result = s->results(i);
    const uint64_t page = r.items(i).page();
    FUZZ_CHECK(pool->cache().IsCached(result.page()) ||
                   result.outcome() == v1::PUBLISH_CONFLICT,
               "Publish result page ", result.page(), " is not cached");
    if (result.outcome() == v1::PUBLISH_CACHED) {
      FUZZ_CHECK(result.page() == page, "a cached item's page changed");
      taken.insert(page);
    } else {
      FUZZ_CHECK(result.outcome() == v1::PUBLISH_ALREADY_CACHED ||
                     result.outcome() == v1::PUBLISH_CONFLICT,
                 "Publish outcome ", result.outcome());
    }
    if (r.acquire() && result.outcome() != v1::PUBLISH_CONFLICT) {
      m->refs[r.pool()].insert(result.page());
    }
  }
  for (uint64_t page : taken) m->pages[r.pool()].erase(page);
}

void Harness::DoLookup() {
  v1::LookupRequest r;
  r.set_session_id(PickSessionId());
  r.set_pool(PickPoolName());
  r.set_namespace_(PickNamespace());
  r.set_acquire(OneIn(2));
  const int n = fdp_->ConsumeIntegralInRange<int>(OneIn(16) ? 0 : 1, 6);
  bool keys_valid = n > 0;
  for (int i = 0; i < n; ++i) {
    r.add_keys(PickCacheKey());
    keys_valid = keys_valid && ValidKey(r.keys(i), false);
  }
  const auto pool = FindPool(r.pool());
  SessionModel* m = FindLive(r.session_id());
  const bool ns_allowed =
      pool != nullptr && m != nullptr && MayUseNamespace(*pool, r.namespace_(), *m);
  auto s = ViaRingOrDirect<v1::LookupResponse>(RingMethod::kLookup, r,
                                               [&] { return handler_.Lookup(r); });
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "Lookup")) return;
  if (pool == nullptr) {
    FUZZ_CHECK(IsUnknownPoolAnswer(r.pool(), s.status()), "Lookup in unknown pool");
    return;
  }
  if (!MayUsePool(pool_owners_.at(r.pool()), *m)) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "Lookup in a pool the "
               "session may not use: ", s.status().ToString());
    return;
  }
  if (!keys_valid || !ValidNamespace(r.namespace_())) {
    FUZZ_CHECK(absl::IsInvalidArgument(s.status()), "Lookup of bad input: ",
               s.status().ToString());
    return;
  }
  if (!ns_allowed) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()),
               "Lookup in a namespace of another owner: ", s.status().ToString());
    return;
  }
  FUZZ_CHECK(s.ok(), "Lookup refused: ", s.status().ToString());
  const std::vector<PageRun> runs = ToRuns(s->pages());
  uint64_t pages = 0;
  for (const PageRun& run : runs) {
    pages += run.num_pages;
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      FUZZ_CHECK(pool->cache().IsCached(p), "Lookup returned page ", p,
                 ", which is not cached");
      if (r.acquire()) m->refs[r.pool()].insert(p);
    }
  }
  FUZZ_CHECK(pages == s->hits() && s->hits() <= static_cast<uint64_t>(n),
             "Lookup: ", s->hits(), " hits, ", pages, " pages, ", n, " keys");
}

void Harness::DoListEvictions() {
  v1::ListEvictionsRequest r;
  r.set_session_id(PickSessionId());
  r.set_pool(PickPoolName());
  r.set_namespace_(PickNamespace());
  r.set_after(OneIn(4) ? PickU64(kU64Max) : PickU64(64));
  r.set_max_keys(OneIn(8) ? static_cast<uint32_t>(PickU64(1u << 20))
                          : fdp_->ConsumeIntegralInRange<uint32_t>(0, 64));
  const auto pool = FindPool(r.pool());
  SessionModel* m = FindLive(r.session_id());
  auto s = ViaRingOrDirect<v1::ListEvictionsResponse>(
      RingMethod::kListEvictions, r, [&] { return handler_.ListEvictions(r); });
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "ListEvictions")) return;
  if (pool == nullptr) {
    FUZZ_CHECK(IsUnknownPoolAnswer(r.pool(), s.status()), "ListEvictions in unknown pool");
    return;
  }
  if (!MayUsePool(pool_owners_.at(r.pool()), *m)) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "ListEvictions in a pool the "
               "session may not use: ", s.status().ToString());
    return;
  }
  if (!ValidNamespace(r.namespace_()) || r.max_keys() > kMaxEvictionsListed) {
    FUZZ_CHECK(absl::IsInvalidArgument(s.status()), "ListEvictions of bad input: ",
               s.status().ToString());
    return;
  }
  if (!MayUseNamespace(*pool, r.namespace_(), *m)) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()),
               "ListEvictions in a namespace of another owner: ", s.status().ToString());
    return;
  }
  FUZZ_CHECK(s.ok(), "ListEvictions refused: ", s.status().ToString());
  FUZZ_CHECK(s->keys_size() <= static_cast<int>(r.max_keys()), "ListEvictions: ",
             s->keys_size(), " keys for max_keys ", r.max_keys());
  const uint64_t evictions = pool->cache().Stats().total.evictions;
  FUZZ_CHECK(s->next() <= evictions, "ListEvictions: next ", s->next(), " past the ",
             evictions, " evictions");
  for (const std::string& key : s->keys()) {
    FUZZ_CHECK(ValidKey(key, false), "ListEvictions returned a bad key");
  }
}

void Harness::DoExplainMisses() {
  v1::ExplainMissesRequest r;
  r.set_session_id(PickSessionId());
  r.set_pool(PickPoolName());
  r.set_namespace_(PickNamespace());
  const int n = OneIn(16) ? 1100 : fdp_->ConsumeIntegralInRange<int>(0, 6);
  for (int i = 0; i < n; ++i) r.add_keys(PickCacheKey());
  r.set_max_recent(OneIn(8) ? static_cast<uint32_t>(PickU64(1u << 20))
                            : fdp_->ConsumeIntegralInRange<uint32_t>(0, 16));
  const auto pool = FindPool(r.pool());
  SessionModel* m = FindLive(r.session_id());
  auto s = handler_.ExplainMisses(r);
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "ExplainMisses")) return;
  if (pool == nullptr) {
    FUZZ_CHECK(IsUnknownPoolAnswer(r.pool(), s.status()), "ExplainMisses in unknown pool");
    return;
  }
  if (!MayUsePool(pool_owners_.at(r.pool()), *m)) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "ExplainMisses in a pool the "
               "session may not use: ", s.status().ToString());
    return;
  }
  bool bad_key = false;
  for (const std::string& key : r.keys()) bad_key |= !ValidKey(key, false);
  if (!ValidNamespace(r.namespace_()) || r.keys_size() > 1024 || r.max_recent() > 1024 ||
      bad_key) {
    FUZZ_CHECK(absl::IsInvalidArgument(s.status()), "ExplainMisses of bad input: ",
               s.status().ToString());
    return;
  }
  if (!MayUseNamespace(*pool, r.namespace_(), *m)) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()),
               "ExplainMisses in a namespace of another owner: ", s.status().ToString());
    return;
  }
  FUZZ_CHECK(s.ok(), "ExplainMisses refused: ", s.status().ToString());
  FUZZ_CHECK(s->keys_size() == r.keys_size() &&
                 s->recent_size() <= static_cast<int>(r.max_recent()),
             "ExplainMisses: ", s->keys_size(), " keys, ", s->recent_size(), " recent");
  for (int i = 0; i < s->keys_size(); ++i) {
    const bool cached = pool->cache().PageOf(r.namespace_(), r.keys(i)) != PageCache::kNotCached;
    FUZZ_CHECK(s->keys(i).cached() == cached && s->keys(i).key() == r.keys(i),
               "ExplainMisses: key ", i, " cached ", s->keys(i).cached(), " vs ", cached);
  }
}

void Harness::DoRelease() {
  v1::ReleaseRequest r;
  r.set_session_id(PickSessionId());
  SessionModel* m = FindLive(r.session_id());
  const std::string held_in = PoolWithReferences(m);
  r.set_pool(!held_in.empty() && !OneIn(4) ? held_in : PickPoolName());
  const auto pool = FindPool(r.pool());
  std::vector<uint64_t> pages;
  if (m != nullptr && !m->refs[r.pool()].empty() && !OneIn(4)) {
    std::vector<uint64_t> held(m->refs[r.pool()].begin(), m->refs[r.pool()].end());
    const int n = fdp_->ConsumeIntegralInRange<int>(1, static_cast<int>(held.size()));
    for (int i = 0; i < n; ++i) {
      pages.push_back(held[fdp_->ConsumeIntegralInRange<size_t>(0, held.size() - 1)]);
    }
  } else {
    pages.push_back(PickU64(pool ? pool->allocator().num_pages() : 100));
  }
  for (uint64_t p : pages) {
    v1::PageRun* run = r.add_pages();
    run->set_first_page(p);
    run->set_num_pages(1);
  }
  auto s = ViaRingOrDirect<v1::ReleaseResponse>(RingMethod::kRelease, r,
                                                [&] { return handler_.Release(r); });
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "Release")) return;
  if (pool == nullptr) return;
  std::multiset<uint64_t> held = m->refs[r.pool()];
  bool all_held = true;
  for (uint64_t p : pages) {
    auto it = held.find(p);
    if (it == held.end()) {
      all_held = false;
      break;
    }
    held.erase(it);
  }
  FUZZ_CHECK(s.ok() == all_held, "Release of ", all_held ? "held" : "unheld",
             " pages answered ", s.status().ToString());
  if (!s.ok()) return;
  FUZZ_CHECK(s->released() == pages.size(), "Release released ", s->released());
  m->refs[r.pool()] = held;
}

void Harness::DoCopyPages() {
  v1::CopyPagesRequest r;
  r.set_session_id(PickSessionId());
  SessionModel* m = FindLive(r.session_id());
  const std::string held_in = PoolWithReferences(m);
  r.set_pool(!held_in.empty() && !OneIn(4) ? held_in : PickPoolName());
  const auto pool = FindPool(r.pool());
  const uint64_t num_pages = pool ? pool->allocator().num_pages() : 100;
  const std::vector<PageRun> to = PickPageRuns(m, r.pool(), num_pages, 4);
  std::vector<uint64_t> from;
  if (m != nullptr && !m->refs[r.pool()].empty() && !OneIn(4)) {
    std::vector<uint64_t> held(m->refs[r.pool()].begin(), m->refs[r.pool()].end());
    for (const PageRun& run : to) {
      for (uint64_t i = 0; i < std::min<uint64_t>(run.num_pages, 4); ++i) {
        from.push_back(held[fdp_->ConsumeIntegralInRange<size_t>(0, held.size() - 1)]);
      }
    }
  } else {
    from.push_back(PickU64(num_pages));
  }
  SetRuns(to, r.mutable_to_pages());
  for (uint64_t p : from) {
    v1::PageRun* run = r.add_from_pages();
    run->set_first_page(p);
    run->set_num_pages(1);
  }
  auto s = handler_.CopyPages(r);
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "CopyPages")) return;
  if (!s.ok()) return;
  FUZZ_CHECK(pool != nullptr && m != nullptr);
  std::vector<uint64_t> to_pages;
  FUZZ_CHECK(DistinctPages(to, num_pages, &to_pages) &&
                 AllOwned(m, r.pool(), to_pages),
             "CopyPages wrote pages the session does not own: ",
             r.ShortDebugString());
  FUZZ_CHECK(to_pages.size() == from.size(), "CopyPages of unequal totals");
  std::set<uint64_t> seen(to_pages.begin(), to_pages.end());
  for (uint64_t p : from) {
    FUZZ_CHECK(m->refs[r.pool()].count(p) || m->pages[r.pool()].count(p),
               "CopyPages read page ", p, ", neither referenced nor owned");
    FUZZ_CHECK(seen.insert(p).second, "CopyPages accepted overlapping pages");
  }
  // The bytes arrived (read back through the pool's own page format).
  const PoolGeometry& g = pool->geometry();
  std::vector<BufferPiece> a, b;
  for (size_t i = 0; i < from.size(); ++i) {
    a.clear();
    b.clear();
    AppendPageBufferPieces(g, from[i], &a);
    AppendPageBufferPieces(g, to_pages[i], &b);
    for (size_t k = 0; k < a.size(); ++k) {
      FUZZ_CHECK(std::equal(pool->base() + a[k].offset,
                            pool->base() + a[k].offset + a[k].size,
                            pool->base() + b[k].offset),
                 "CopyPages: page ", to_pages[i], " differs from page ", from[i]);
    }
  }
}

void Harness::CheckCacheInvariants(const HostPool& pool) {
  const absl::Status consistent = pool.cache().CheckConsistency();
  FUZZ_CHECK(consistent.ok(), "pool ", pool.name(), ": ", consistent.ToString());
  uint64_t referenced = 0;
  for (const SessionModel& s : live_) {
    auto it = s.refs.find(pool.name());
    const uint64_t want = it == s.refs.end() ? 0 : it->second.size();
    referenced += want;
    FUZZ_CHECK(pool.cache().ReferencesHeldBy(s.tag) == want, "pool ",
               pool.name(), ": session tag ", s.tag, " holds ",
               pool.cache().ReferencesHeldBy(s.tag), " references, model ", want);
    if (it == s.refs.end()) continue;
    for (uint64_t p : it->second) {
      FUZZ_CHECK(pool.cache().IsCached(p), "pool ", pool.name(), ": referenced page ",
                 p, " is no longer cached");
    }
  }
  if (outstanding_ == 0) {
    FUZZ_CHECK(pool.allocator().pages_freed_when_unpinned() == 0, "pool ",
               pool.name(), ": evicted pages still pinned with nothing in flight");
    FUZZ_CHECK(pool.allocator().cached_pages() == pool.cache().cached_pages(),
               "pool ", pool.name(), ": allocator holds ",
               pool.allocator().cached_pages(), " cached pages, the cache ",
               pool.cache().cached_pages());
  }
}

void Harness::DoSweepClaims() {
  // The claims of the namespaces published in, before the sweep.
  std::vector<std::pair<std::string, NamespaceOwner>> before;
  for (const auto& pool : pools_.List()) {
    for (const NamespaceCounters& ns : pool->cache().Stats().namespaces) {
      if (auto owner = pools_.namespaces().OwnerOf(ns.name)) {
        before.emplace_back(ns.name, *owner);
      }
    }
  }
  // Twice: a claim unused at two sweeps in a row is given back.
  SweepNamespaceClaims(pools_, sessions_);
  SweepNamespaceClaims(pools_, sessions_);
  Note(true);
  // Never the claim of a namespace a page is cached in (its next owner
  // would be served the pages), nor one of an owner with a live session.
  for (const auto& pool : pools_.List()) {
    for (const NamespaceCounters& ns : pool->cache().Stats().namespaces) {
      if (ns.counters.cached == 0) continue;
      FUZZ_CHECK(pools_.namespaces().OwnerOf(ns.name).has_value(),
                 "the claim of a namespace with cached pages was given back");
    }
  }
  for (const auto& [name, owner] : before) {
    bool live = false;
    for (const SessionModel& m : live_) {
      live |= owner.unverified ? !m.attached : (m.attached && m.uid == owner.uid);
    }
    if (live) {
      FUZZ_CHECK(pools_.namespaces().OwnerOf(name).has_value(),
                 "the claim of an owner with a live session was given back");
    }
  }
}

}  // namespace hostkv::fuzz
