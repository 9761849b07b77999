// The storage tier's counters where operators look: GetPoolStats' TierStats
// (grpcurl, `hostkv stats`) and the hostkv_tier_* series of /metrics.
#ifndef HOSTKV_SERVER_OPERATIONS_TIER_REPORT_H_
#define HOSTKV_SERVER_OPERATIONS_TIER_REPORT_H_

#include <vector>

#include "hostkv/v1/hostkv.pb.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/tier/cache_tier.h"

namespace hostkv {

void FillTierStats(CacheTier& tier, v1::TierStats* stats);

// hostkv_tier_up, hostkv_tier_writes_total{result}, hostkv_tier_reads_total
// {result}, hostkv_tier_{written,read}_bytes_total, hostkv_tier_write_queue_
// {pages,bytes}, hostkv_tier_fetches_late_total, hostkv_tier_{put,get}_
// seconds (histograms, per store call).
class TierCollector : public prometheus::Collectable {
 public:
  explicit TierCollector(CacheTier* tier) : tier_(tier) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  CacheTier* const tier_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_OPERATIONS_TIER_REPORT_H_
