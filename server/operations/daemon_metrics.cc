#include "server/operations/daemon_metrics.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hostkv {
namespace {

// 10 us .. ~10 s, x4 per bucket.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = [] {
    auto* b = new prometheus::Histogram::BucketBoundaries;
    for (double s = 1e-5; s < 20; s *= 4) b->push_back(s);
    return b;
  }();
  return *buckets;
}

// 10 MB/s .. ~100 GB/s, x2 per bucket.
const prometheus::Histogram::BucketBoundaries& ThroughputBuckets() {
  static const auto* buckets = [] {
    auto* b = new prometheus::Histogram::BucketBoundaries;
    for (double v = 1e7; v < 2e11; v *= 2) b->push_back(v);
    return b;
  }();
  return *buckets;
}

}  // namespace

const char* DirectionName(CopyDirection direction) {
  return direction == CopyDirection::kHostToDevice ? "load" : "backup";
}

const char* MechanismName(CopyMechanism mechanism) {
  return mechanism == CopyMechanism::kKernel ? "kernel" : "direct";
}

DaemonMetrics::DaemonMetrics(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)),
      rpcs_(prometheus::BuildCounter()
                .Name("hostkv_rpcs_total")
                .Help("hostkv.v1 calls by method and status code")
                .Register(*registry_)),
      operations_(prometheus::BuildCounter()
                      .Name("hostkv_transfer_operations_total")
                      .Help("Finished loads and backups by mechanism")
                      .Register(*registry_)),
      bytes_(prometheus::BuildCounter()
                 .Name("hostkv_transfer_bytes_total")
                 .Help("Bytes copied by loads and backups")
                 .Register(*registry_)),
      copy_seconds_(prometheus::BuildHistogram()
                        .Name("hostkv_transfer_seconds")
                        .Help("Time to copy one operation, all its layers")
                        .Register(*registry_)),
      throughput_(prometheus::BuildHistogram()
                      .Name("hostkv_transfer_throughput_bytes_per_second")
                      .Help("Copy throughput of each operation")
                      .Register(*registry_)),
      layer_ready_(prometheus::BuildHistogram()
                       .Name("hostkv_layer_ready_seconds")
                       .Help("From a transfer's submission to each of its "
                             "layers being signalled")
                       .Register(*registry_)),
      alloc_failures_(prometheus::BuildCounter()
                          .Name("hostkv_alloc_failures_total")
                          .Help("Refused allocations by reason")
                          .Register(*registry_)),
      session_ends_(prometheus::BuildCounter()
                        .Name("hostkv_sessions_ended_total")
                        .Help("Sessions ended, by reason")
                        .Register(*registry_)),
      restarts_(prometheus::BuildCounter()
                    .Name("hostkv_restart_adopted_total")
                    .Help("What this daemon adopted from the hostkvd that ran "
                          "before it (what: restarts, sessions, "
                          "sessions_resumed, pages_owned, pages_cached, "
                          "pages_dropped, keys_dropped)")
                    .Register(*registry_)) {}

void DaemonMetrics::RecordRpc(const char* method, absl::StatusCode code) {
  rpcs_.Add({{"method", method}, {"code", absl::StatusCodeToString(code)}})
      .Increment();
}

prometheus::Counter& DaemonMetrics::TransferCounter(
    prometheus::Family<prometheus::Counter>& family, CopyDirection d,
    CopyMechanism m) {
  return family.Add(
      {{"direction", DirectionName(d)}, {"mechanism", MechanismName(m)}});
}

void DaemonMetrics::RecordTransfer(CopyDirection direction,
                                   CopyMechanism mechanism, uint64_t bytes,
                                   absl::Duration copy_time) {
  TransferCounter(operations_, direction, mechanism).Increment();
  TransferCounter(bytes_, direction, mechanism).Increment(static_cast<double>(bytes));
  const double seconds = absl::ToDoubleSeconds(copy_time);
  copy_seconds_.Add({{"direction", DirectionName(direction)}}, LatencyBuckets())
      .Observe(seconds);
  if (seconds > 0) {
    throughput_.Add({{"direction", DirectionName(direction)}}, ThroughputBuckets())
        .Observe(static_cast<double>(bytes) / seconds);
  }
}

void DaemonMetrics::RecordLayerReady(CopyDirection direction,
                                     absl::Duration since_submit) {
  layer_ready_.Add({{"direction", DirectionName(direction)}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(since_submit));
}

void DaemonMetrics::RecordAllocFailure(const char* reason) {
  alloc_failures_.Add({{"reason", reason}}).Increment();
}

void DaemonMetrics::RecordSessionEnd(const char* reason) {
  session_ends_.Add({{"reason", reason}}).Increment();
}

void DaemonMetrics::RecordSessionResumed() {
  restarts_.Add({{"what", "sessions_resumed"}}).Increment();
}

void DaemonMetrics::RecordAdoption(const Adoption& a) {
  restarts_.Add({{"what", "restarts"}}).Increment();
  restarts_.Add({{"what", "sessions"}}).Increment(static_cast<double>(a.sessions));
  restarts_.Add({{"what", "sessions_resumed"}});
  restarts_.Add({{"what", "pages_owned"}}).Increment(static_cast<double>(a.pages_owned));
  restarts_.Add({{"what", "pages_cached"}}).Increment(static_cast<double>(a.pages_cached));
  restarts_.Add({{"what", "pages_dropped"}}).Increment(static_cast<double>(a.pages_dropped));
  restarts_.Add({{"what", "keys_dropped"}}).Increment(static_cast<double>(a.keys_dropped));
}

}  // namespace hostkv
