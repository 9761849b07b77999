#include "server/operations/stats_report.h"

#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "server/state/pool_ledger.h"

namespace hostkv {

namespace {

void FillCounters(const CacheCounters& c, v1::CacheCounters* out) {
  out->set_cached_pages(c.cached);
  out->set_referenced_pages(c.referenced);
  out->set_evictable_pages(c.evictable);
  out->set_hits(c.hits);
  out->set_misses(c.misses);
  out->set_evictions(c.evictions);
  out->set_already_cached(c.already_cached);
  out->set_conflicts(c.conflicts);
}

}  // namespace

void FillMissCounters(const MissCounters& c, v1::MissCounters* out) {
  out->set_lookups(c.lookups);
  out->set_reusable_lookups(c.reusable_lookups);
  out->set_missed_lookups(c.missed());
  const auto& r = c.missed_by_reason;
  out->set_never_published(r[static_cast<int>(MissReason::kNeverPublished)]);
  out->set_evicted(r[static_cast<int>(MissReason::kEvicted)]);
  out->set_other_namespace(r[static_cast<int>(MissReason::kOtherNamespace)]);
  out->set_refused(r[static_cast<int>(MissReason::kRefused)]);
  out->set_digest_mismatch(r[static_cast<int>(MissReason::kDigestMismatch)]);
  out->set_tier_failed(r[static_cast<int>(MissReason::kTierFailed)]);
}

void FillCacheStats(const HostPool& pool, uint64_t cached_pages,
                    v1::PoolStats* stats) {
  const CacheStats cache = pool.cache().Stats();
  stats->set_cached_pages(cached_pages);
  FillCounters(cache.total, stats->mutable_cache());
  for (const NamespaceCounters& ns : cache.namespaces) {
    v1::CacheNamespaceStats* out = stats->add_cache_namespaces();
    out->set_name(ns.name);
    FillCounters(ns.counters, out->mutable_counters());
    FillMissCounters(ns.misses, out->mutable_lookups());
    if (const std::optional<NamespaceOwner> owner =
            pool.namespaces().OwnerOf(ns.name);
        owner.has_value()) {
      out->set_owner_uid(owner->uid);
      out->set_owner_unverified(owner->unverified);
    }
  }
  FillMissCounters(cache.unknown_namespace, stats->mutable_unknown_namespace_lookups());
  const DigestCounters digests = pool.cache().digest_counters();
  stats->set_digests_computed(digests.computed);
  stats->set_digests_pending(digests.pending);
  stats->set_hits_verified(digests.verified);
  stats->set_hits_unverified(digests.unverified);
  stats->set_digest_mismatches(digests.mismatched);
  stats->set_adoption_digest_drops(digests.adoption_dropped);
  stats->set_tier_values_refused(digests.tier_refused);
  stats->set_cache_reserved_bytes(pool.cache().MaxMemoryBytes());
  if (pool.ledger() != nullptr) {
    stats->set_ledger_reserved_bytes(PoolLedger::BytesFor(pool.geometry().num_pages()));
  }
}

void FillPoolStats(const HostPool& pool,
                   const std::vector<std::shared_ptr<Session>>& sessions,
                   v1::PoolStats* stats) {
  const PoolGeometry& g = pool.geometry();
  const SlotAllocator& alloc = pool.allocator();
  // One snapshot, so that the sessions' pages add up to the used pages.
  const SlotAllocator::Occupancy occupancy = alloc.Snapshot();
  const uint64_t free_pages = occupancy.free_pages;
  const uint64_t used_pages = alloc.num_pages() - free_pages;
  stats->set_name(pool.name());
  stats->set_layout(pool.info().spec().layout());
  const PoolPinning::Progress pin = pool.pin_progress();
  stats->set_backend(pool.backend());
  stats->set_pinned(pin.state == v1::PIN_PINNED);
  stats->set_pin_state(pin.state);
  stats->set_pinned_bytes(pin.pinned_bytes);
  stats->set_pin_seconds(absl::ToDoubleSeconds(pin.elapsed));
  stats->set_pin_error(pin.error);
  const PoolFill::Progress fill = pool.fill_progress();
  stats->set_fill_state(fill.state);
  stats->set_ready_pages(fill.ready_pages);
  stats->set_ready_bytes(fill.ready_pages * g.page_bytes());
  stats->set_fill_seconds(absl::ToDoubleSeconds(fill.elapsed));
  stats->set_fill_error(fill.error);
  stats->set_fill_threads(fill.threads);
  stats->set_hugepages(pool.info().hugepages());
  stats->set_numa_node(pool.info().numa_node());
  stats->set_fill_method(fill.threads == 0 ? "adopted"
                         : fill.method == ResidentMethod::kTouch ? "touch"
                                                                 : "populate");
  stats->set_page_size(g.page_size);
  stats->set_capacity_pages(alloc.num_pages());
  stats->set_used_pages(used_pages);
  stats->set_free_pages(free_pages);
  stats->set_capacity_tokens(alloc.num_pages() * g.page_size);
  stats->set_used_tokens(used_pages * g.page_size);
  stats->set_free_tokens(free_pages * g.page_size);
  stats->set_capacity_bytes(g.total_bytes());
  stats->set_used_bytes(used_pages * g.page_bytes());
  stats->set_free_bytes(free_pages * g.page_bytes());
  stats->set_loads(pool.completed_loads());
  stats->set_backups(pool.completed_backups());
  FillCacheStats(pool, occupancy.cached_pages, stats);
  absl::flat_hash_map<OwnerTag, const Session*> by_tag;
  for (const std::shared_ptr<Session>& session : sessions) {
    by_tag[session->tag()] = session.get();
  }
  auto add = [&](OwnerTag tag, const std::string& name, uint64_t pages,
                 uint32_t imports) {
    v1::SessionUsage* su = stats->add_sessions();
    su->set_session_number(tag);
    su->set_client_name(name);
    su->set_pages(pages);
    su->set_bytes(pages * g.page_bytes());
    su->set_imports(imports);
  };
  for (const std::shared_ptr<Session>& session : sessions) {
    auto it = occupancy.usage.find(session->tag());
    const uint64_t pages = it == occupancy.usage.end() ? 0 : it->second;
    const auto imports = session->ImportsByPool();
    auto imp = imports.find(pool.name());
    const uint32_t import_count = imp == imports.end() ? 0 : imp->second;
    if (pages != 0 || import_count != 0) {
      add(session->tag(), session->client_name(), pages, import_count);
    }
  }
  // Pages of sessions that are ending right now (out of the registry, their
  // pages not yet freed).
  for (const auto& [tag, pages] : occupancy.usage) {
    if (tag == kTierOwner) {
      add(tag, "(storage tier: pages being brought in)", pages, 0);
    } else if (!by_tag.contains(tag)) {
      add(tag, "(ending)", pages, 0);
    }
  }
}

void FillSessionInfo(const Session& session,
                     const std::vector<std::shared_ptr<HostPool>>& pools,
                     absl::Time now, v1::SessionInfo* info) {
  info->set_session_number(session.tag());
  info->set_client_name(session.client_name());
  const std::optional<PeerCredentials> peer = session.peer();
  info->set_pid(peer.has_value() ? peer->pid : session.pid());
  info->set_uid(peer.has_value() ? peer->uid : 0);
  info->set_attached(peer.has_value());
  info->set_age_seconds(absl::ToDoubleSeconds(now - session.opened()));
  info->set_idle_seconds(absl::ToDoubleSeconds(now - session.last_active()));
  uint64_t pages = 0;
  for (const auto& pool : pools) {
    pages += pool->allocator().pages_owned_by(session.tag());
  }
  info->set_pages(pages);
  uint32_t imports = 0;
  for (const auto& [name, count] : session.ImportsByPool()) imports += count;
  info->set_imports(imports);
  info->set_operations_in_flight(session.signals()->in_flight());
}

}  // namespace hostkv
