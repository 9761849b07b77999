#include "server/operations/tier_report.h"

#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

namespace hostkv {
namespace {

double Mean(const LatencySnapshot& latency) {
  return latency.count == 0 ? 0.0 : latency.sum_seconds / latency.count;
}

prometheus::MetricFamily Family(const char* name, const char* help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

void AddValue(prometheus::MetricFamily& family, double value,
              const char* result = nullptr) {
  prometheus::ClientMetric metric;
  if (result != nullptr) metric.label.push_back({"result", result});
  if (family.type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

prometheus::MetricFamily Histogram(const char* name, const char* help,
                                   const LatencySnapshot& latency) {
  prometheus::MetricFamily family =
      Family(name, help, prometheus::MetricType::Histogram);
  prometheus::ClientMetric metric;
  metric.histogram.sample_count = latency.count;
  metric.histogram.sample_sum = latency.sum_seconds;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kTierLatencyBounds.size(); ++i) {
    cumulative += latency.counts[i];
    prometheus::ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound = kTierLatencyBounds[i];
    metric.histogram.bucket.push_back(bucket);
  }
  prometheus::ClientMetric::Bucket inf;
  inf.cumulative_count = latency.count;
  inf.upper_bound = std::numeric_limits<double>::infinity();
  metric.histogram.bucket.push_back(inf);
  family.metric.push_back(std::move(metric));
  return family;
}

}  // namespace

void FillTierStats(CacheTier& tier, v1::TierStats* stats) {
  const TierCountersSnapshot c = tier.Counters();
  stats->set_url(tier.Describe());
  stats->set_serving(tier.health().serving());
  stats->set_last_error(tier.health().last_error());
  stats->set_written(c.written);
  stats->set_write_failures(c.write_failures);
  stats->set_writes_dropped(c.writes_dropped);
  stats->set_writes_skipped(c.writes_skipped);
  stats->set_already_stored(c.already_stored);
  stats->set_written_bytes(c.written_bytes);
  stats->set_write_queue_pages(c.write_queue_pages);
  stats->set_write_queue_bytes(c.write_queue_bytes);
  stats->set_read_hits(c.read_hits);
  stats->set_read_misses(c.read_misses);
  stats->set_read_corrupt(c.read_corrupt);
  stats->set_read_failures(c.read_failures);
  stats->set_read_bytes(c.read_bytes);
  stats->set_fetches_late(c.fetches_late);
  stats->set_fetch_no_space(c.fetch_no_space);
  stats->set_put_calls(c.put_latency.count);
  stats->set_put_mean_seconds(Mean(c.put_latency));
  stats->set_get_calls(c.get_latency.count);
  stats->set_get_mean_seconds(Mean(c.get_latency));
}

std::vector<prometheus::MetricFamily> TierCollector::Collect() const {
  const TierCountersSnapshot c = tier_->Counters();
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  // One family: one value, or one per result label.
  const auto add = [&out](const char* name, const char* help, MetricType type,
                          std::initializer_list<std::pair<const char*, double>>
                              values) {
    prometheus::MetricFamily family = Family(name, help, type);
    for (const auto& [result, value] : values) AddValue(family, value, result);
    out.push_back(std::move(family));
  };
  add("hostkv_tier_up",
      "1 while the storage tier answers and takes writes (health entry "
      "hostkv.tier)",
      MetricType::Gauge, {{nullptr, tier_->health().serving() ? 1 : 0}});
  add("hostkv_tier_writes_total",
      "Pages of the write-behind, by what became of them", MetricType::Counter,
      {{"written", c.written},
       {"failed", c.write_failures},
       {"dropped", c.writes_dropped},
       {"evicted", c.writes_skipped},
       {"already_stored", c.already_stored}});
  add("hostkv_tier_reads_total",
      "Keys lookups asked the tier for, by what became of them",
      MetricType::Counter,
      {{"hit", c.read_hits},
       {"miss", c.read_misses},
       {"corrupt", c.read_corrupt},
       {"failed", c.read_failures},
       {"no_space", c.fetch_no_space}});
  add("hostkv_tier_written_bytes_total", "Bytes written to the tier",
      MetricType::Counter, {{nullptr, c.written_bytes}});
  add("hostkv_tier_read_bytes_total", "Bytes read from the tier",
      MetricType::Counter, {{nullptr, c.read_bytes}});
  add("hostkv_tier_write_queue_pages", "Pages waiting to be written",
      MetricType::Gauge, {{nullptr, c.write_queue_pages}});
  add("hostkv_tier_write_queue_bytes",
      "Bytes of the pages waiting to be written", MetricType::Gauge,
      {{nullptr, c.write_queue_bytes}});
  add("hostkv_tier_fetches_late_total",
      "Lookups that stopped waiting for pages from the tier",
      MetricType::Counter, {{nullptr, c.fetches_late}});
  out.push_back(Histogram("hostkv_tier_put_seconds",
                          "Store calls writing a batch of pages",
                          c.put_latency));
  out.push_back(Histogram("hostkv_tier_get_seconds",
                          "Store calls reading a batch of pages",
                          c.get_latency));
  return out;
}

}  // namespace hostkv
