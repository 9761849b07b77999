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
  auto imports = Gauge("hostkv_pool_imports",
                       "Device-buffer registrations against the pool");
  for (const std::shared_ptr<HostPool>& pool : pools_->List()) {
    const PoolGeometry& g = pool->geometry();
    const SlotAllocator& alloc = pool->allocator();
    const uint64_t free_count = alloc.free_pages();
    const uint64_t used_count = alloc.num_pages() - free_count;
    Set(capacity, static_cast<double>(g.total_bytes()), pool->name());
    Set(used, static_cast<double>(used_count * g.page_bytes()), pool->name());
    Set(free, static_cast<double>(free_count * g.page_bytes()), pool->name());
    Set(capacity_pages, static_cast<double>(alloc.num_pages()), pool->name());
    Set(used_pages, static_cast<double>(used_count), pool->name());
    Set(free_pages, static_cast<double>(free_count), pool->name());
    Set(pinned, pool->pinned() ? 1 : 0, pool->name());
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
  return {capacity, used, free, capacity_pages, used_pages, free_pages, pinned,
          imports, sessions, attached, in_flight, reserved, budget};
}

}  // namespace hostkv
