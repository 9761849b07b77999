#include "server/operations/tier_report.h"

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
  prometheus::MetricFamily up = Family(
      "hostkv_tier_up",
      "1 while the storage tier answers and takes writes (health entry "
      "hostkv.tier)",
      MetricType::Gauge);
  AddValue(up, tier_->health().serving() ? 1 : 0);
  out.push_back(std::move(up));
  prometheus::MetricFamily writes =
      Family("hostkv_tier_writes_total",
             "Pages of the write-behind, by what became of them",
             MetricType::Counter);
  AddValue(writes, c.written, "written");
  AddValue(writes, c.write_failures, "failed");
  AddValue(writes, c.writes_dropped, "dropped");
  AddValue(writes, c.writes_skipped, "evicted");
  AddValue(writes, c.already_stored, "already_stored");
  out.push_back(std::move(writes));
  prometheus::MetricFamily reads = Family(
      "hostkv_tier_reads_total",
      "Keys lookups asked the tier for, by what became of them",
      MetricType::Counter);
  AddValue(reads, c.read_hits, "hit");
  AddValue(reads, c.read_misses, "miss");
  AddValue(reads, c.read_corrupt, "corrupt");
  AddValue(reads, c.read_failures, "failed");
  AddValue(reads, c.fetch_no_space, "no_space");
  out.push_back(std::move(reads));
  prometheus::MetricFamily written = Family(
      "hostkv_tier_written_bytes_total", "Bytes written to the tier",
      MetricType::Counter);
  AddValue(written, c.written_bytes);
  out.push_back(std::move(written));
  prometheus::MetricFamily read = Family(
      "hostkv_tier_read_bytes_total", "Bytes read from the tier",
      MetricType::Counter);
  AddValue(read, c.read_bytes);
  out.push_back(std::move(read));
  prometheus::MetricFamily queue_pages = Family(
      "hostkv_tier_write_queue_pages", "Pages waiting to be written",
      MetricType::Gauge);
  AddValue(queue_pages, c.write_queue_pages);
  out.push_back(std::move(queue_pages));
  prometheus::MetricFamily queue_bytes = Family(
      "hostkv_tier_write_queue_bytes", "Bytes of the pages waiting to be written",
      MetricType::Gauge);
  AddValue(queue_bytes, c.write_queue_bytes);
  out.push_back(std::move(queue_bytes));
  prometheus::MetricFamily late = Family(
      "hostkv_tier_fetches_late_total",
      "Lookups that stopped waiting for pages from the tier",
      MetricType::Counter);
  AddValue(late, c.fetches_late);
  out.push_back(std::move(late));
  out.push_back(Histogram("hostkv_tier_put_seconds",
                          "Store calls writing a batch of pages",
                          c.put_latency));
  out.push_back(Histogram("hostkv_tier_get_seconds",
                          "Store calls reading a batch of pages",
                          c.get_latency));
  return out;
}

}  // namespace hostkv
