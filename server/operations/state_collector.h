// Occupancy gauges, read from the daemon's state when Prometheus scrapes:
// per pool capacity/used/free (pages and bytes), pinning, imports; sessions;
// the memory budget.
#ifndef HOSTKV_SERVER_OPERATIONS_STATE_COLLECTOR_H_
#define HOSTKV_SERVER_OPERATIONS_STATE_COLLECTOR_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/pool/memory_budget.h"
#include "server/pool/pool_registry.h"
#include "server/sessions/session_registry.h"

namespace hostkv {

// Thread-safe; borrows the registries, which must outlive it (unregister it
// from the exposer first).
class StateCollector : public prometheus::Collectable {
 public:
  StateCollector(const PoolRegistry* pools, const SessionRegistry* sessions,
                 const MemoryBudget* budget)
      : pools_(pools), sessions_(sessions), budget_(budget) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const PoolRegistry* const pools_;
  const SessionRegistry* const sessions_;
  const MemoryBudget* const budget_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_STATE_COLLECTOR_H_
