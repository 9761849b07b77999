#include "server/operations/state_collector.h"

#include <memory>
#include <string>

namespace hostkv {
namespace {

prometheus::MetricFamily Gauge(const char* name, const char* help) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  return family;
}

void Set(prometheus::MetricFamily& family, double value,
         const std::string& pool = "") {
  prometheus::ClientMetric metric;
  if (!pool.empty()) metric.label.push_back({"pool", pool});
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

prometheus::MetricFamily Counter(const char* name, const char* help) {
  prometheus::MetricFamily family = Gauge(name, help);
  family.type = prometheus::MetricType::Counter;
  return family;
}

void Add(prometheus::MetricFamily& counter, uint64_t value, const std::string& pool,
         const char* found = nullptr) {
  prometheus::ClientMetric metric;
  metric.label.push_back({"pool", pool});
  if (found != nullptr) metric.label.push_back({"found", found});
  metric.counter.value = static_cast<double>(value);
  counter.metric.push_back(std::move(metric));
}

// The page cache's series: per pool and namespace (the pool's totals are
// their sums, except misses in namespaces nothing was published in).
struct CacheFamilies {
  prometheus::MetricFamily cached = Gauge(
      "hostkv_cache_cached_pages", "Pages cached in the namespace");
  prometheus::MetricFamily referenced = Gauge(
      "hostkv_cache_referenced_pages",
      "Cached pages at least one session references (never evicted)");
  prometheus::MetricFamily evictable = Gauge(
      "hostkv_cache_evictable_pages",
      "Cached pages an allocation may evict now");
  prometheus::MetricFamily hits =
      Counter("hostkv_cache_hits_total", "Keys Lookup found");
  prometheus::MetricFamily misses =
      Counter("hostkv_cache_misses_total", "Keys Lookup did not find");
  prometheus::MetricFamily evictions =
      Counter("hostkv_cache_evictions_total", "Cached pages evicted");
  prometheus::MetricFamily already_cached = Counter(
      "hostkv_cache_already_cached_total",
      "Publishes of a key already cached (the first page kept)");
  prometheus::MetricFamily conflicts = Counter(
      "hostkv_cache_conflicts_total",
      "Publishes of a page already cached under another key");
  prometheus::MetricFamily lookups = Counter(
      "hostkv_cache_lookups_total", "Lookups in the namespace");
  prometheus::MetricFamily reusable = Counter(
      "hostkv_cache_reusable_lookups_total",
      "Lookups whose first key had been published in the namespace before "
      "(over hostkv_cache_lookups_total: the hit rate without evictions)");
  prometheus::MetricFamily missed = Counter(
      "hostkv_cache_missed_lookups_total",
      "Lookups that missed, by the reason of their first missing key");

  void Add(const std::string& pool, const NamespaceCounters& ns) {
    auto put = [&](prometheus::MetricFamily& family, uint64_t value) {
      prometheus::ClientMetric metric;
      metric.label.push_back({"namespace", ns.name});
      metric.label.push_back({"pool", pool});
      if (family.type == prometheus::MetricType::Counter) {
        metric.counter.value = static_cast<double>(value);
      } else {
        metric.gauge.value = static_cast<double>(value);
      }
      family.metric.push_back(std::move(metric));
    };
    const CacheCounters& c = ns.counters;
    put(cached, c.cached);
    put(referenced, c.referenced);
    put(evictable, c.evictable);
    put(hits, c.hits);
    put(misses, c.misses);
    put(evictions, c.evictions);
    put(already_cached, c.already_cached);
    put(conflicts, c.conflicts);
    put(lookups, ns.misses.lookups);
    put(reusable, ns.misses.reusable_lookups);
    for (int r = 0; r < kMissReasons; ++r) {
      put(missed, ns.misses.missed_by_reason[r]);
      missed.metric.back().label.push_back(
          {"reason", MissReasonName(static_cast<MissReason>(r))});
    }
  }
  void AppendTo(std::vector<prometheus::MetricFamily>& out) {
    for (prometheus::MetricFamily* f : {&cached, &referenced, &evictable, &hits,
                                        &misses, &evictions, &already_cached,
                                        &conflicts, &lookups, &reusable, &missed}) {
      out.push_back(std::move(*f));
    }
  }
};

}  // namespace

std::vector<prometheus::MetricFamily> StateCollector::Collect() const {
  auto capacity = Gauge("hostkv_pool_capacity_bytes", "Bytes of the pool");
  auto used = Gauge("hostkv_pool_used_bytes", "Bytes of allocated pages");
  auto free = Gauge("hostkv_pool_free_bytes", "Bytes of free pages");
  auto capacity_pages = Gauge("hostkv_pool_capacity_pages", "Pages of the pool");
  auto used_pages = Gauge("hostkv_pool_used_pages", "Allocated pages");
  auto free_pages = Gauge("hostkv_pool_free_pages", "Free pages");
  auto pinned = Gauge("hostkv_pool_pinned",
                      "1 if the pool is registered with CUDA (pinned)");
  auto ready = Gauge("hostkv_pool_ready_bytes",
                     "Bytes of the pool resident (its pages are handed out "
                     "as they turn so); capacity once filled");
  auto filling = Gauge("hostkv_pool_filling",
                       "1 while the pool's memory is still being made resident");
  auto imports = Gauge("hostkv_pool_imports",
                       "Device-buffer registrations against the pool");
  auto cached_pages = Gauge("hostkv_pool_cached_pages",
                            "Pages of the pool owned by its page cache "
                            "(counted in hostkv_pool_used_pages)");
  CacheFamilies cache;
  auto digests = Counter("hostkv_page_digests_total",
                         "Digests of cached pages taken after their publish or carried in "
                         "by tier values");
  auto digests_pending = Gauge("hostkv_page_digests_pending",
                               "Cached pages whose digest is still being taken");
  auto verified = Counter("hostkv_cache_hits_verified_total",
                          "Hits checked against their page's digest before a load, and "
                          "matching (--verify_hits)");
  auto mismatches = Counter("hostkv_page_digest_mismatches_total",
                            "Cached pages dropped because their bytes no longer matched "
                            "their digest, by where it was found (hit, adoption)");
  for (const std::shared_ptr<HostPool>& pool : pools_->List()) {
    const DigestCounters d = pool->cache().digest_counters();
    Add(digests, d.computed, pool->name());
    Set(digests_pending, static_cast<double>(d.pending), pool->name());
    Add(verified, d.verified, pool->name());
    Add(mismatches, d.mismatched, pool->name(), "hit");
    Add(mismatches, d.adoption_dropped, pool->name(), "adoption");
    const PoolGeometry& g = pool->geometry();
    const SlotAllocator& alloc = pool->allocator();
    Set(cached_pages, static_cast<double>(alloc.cached_pages()), pool->name());
    for (const NamespaceCounters& ns : pool->cache().Stats().namespaces) {
      cache.Add(pool->name(), ns);
    }
    const uint64_t free_count = alloc.free_pages();
    const uint64_t used_count = alloc.num_pages() - free_count;
    Set(capacity, static_cast<double>(g.total_bytes()), pool->name());
    Set(used, static_cast<double>(used_count * g.page_bytes()), pool->name());
    Set(free, static_cast<double>(free_count * g.page_bytes()), pool->name());
    Set(capacity_pages, static_cast<double>(alloc.num_pages()), pool->name());
    Set(used_pages, static_cast<double>(used_count), pool->name());
    Set(free_pages, static_cast<double>(free_count), pool->name());
    Set(pinned, pool->pinned() ? 1 : 0, pool->name());
    const PoolFill::Progress fill = pool->fill_progress();
    Set(ready, static_cast<double>(fill.ready_pages * g.page_bytes()), pool->name());
    Set(filling, fill.state == v1::FILL_FILLING ? 1 : 0, pool->name());
    Set(imports, pool->import_count(), pool->name());
  }
  auto sessions = Gauge("hostkv_sessions", "Open sessions");
  auto attached = Gauge("hostkv_sessions_attached",
                        "Open sessions with an attached session socket");
  auto in_flight = Gauge("hostkv_operations_in_flight",
                         "Loads and backups submitted and not finished");
  double open = 0, attached_count = 0, ops = 0;
  for (const std::shared_ptr<Session>& session : sessions_->List()) {
    ++open;
    attached_count += session->attached() ? 1 : 0;
    ops += session->signals()->in_flight();
  }
  Set(sessions, open);
  Set(attached, attached_count);
  Set(in_flight, ops);
  auto reserved = Gauge("hostkv_memory_reserved_bytes",
                        "Host memory reserved by all pools");
  auto budget = Gauge("hostkv_memory_budget_bytes",
                      "The daemon's memory budget (0: none beyond availability)");
  Set(reserved, static_cast<double>(budget_->reserved_bytes()));
  Set(budget, static_cast<double>(budget_->budget_bytes()));
  std::vector<prometheus::MetricFamily> families = {
      capacity, used,      free,     capacity_pages, used_pages,
      free_pages, cached_pages, pinned, ready, filling, imports, sessions,
      attached, in_flight, reserved, budget, digests, digests_pending, verified, mismatches};
  cache.AppendTo(families);
  return families;
}

}  // namespace hostkv
