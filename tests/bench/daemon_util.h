// Helpers for the benchmarks that go through the real daemon: pool specs,
// shared-memory "device" buffers, the bare gRPC baseline (the standard
// health check), and interleaved latency measurement.
#ifndef HOSTKV_TESTS_BENCH_DAEMON_UTIL_H_
#define HOSTKV_TESTS_BENCH_DAEMON_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "hostkv/client.h"
#include "hostkv/shm_device_buffer.h"
#include "hostkv/v1/hostkv.pb.h"
#include "tests/bench/bench_util.h"

namespace hostkv::bench {

v1::PoolSpec MhaSpec(const std::string& name, uint32_t layers, uint32_t heads,
                     uint32_t head_dim, v1::Dtype dtype, uint32_t page_size,
                     v1::Layout layout, uint64_t capacity_tokens);
v1::PoolSpec MlaSpec(const std::string& name, uint32_t layers,
                     uint32_t kv_lora_rank, uint32_t rope_dim, v1::Dtype dtype,
                     uint32_t page_size, v1::Layout layout,
                     uint64_t capacity_tokens);

// Shared-memory names to unlink should the benchmark die (live = true), or
// no longer (false).
void TrackSegment(const std::string& name, bool live);

// One shared-memory segment holding every layer's K and V (or latent)
// buffer of `token_slots` rows, laid out [layer][plane].
struct DeviceBuffers {
  DeviceBuffers() = default;
  DeviceBuffers(DeviceBuffers&&) = default;
  ~DeviceBuffers() {
    if (shm != nullptr) TrackSegment(shm->name(), false);
  }
  std::unique_ptr<ShmDeviceBuffer> shm;
  std::vector<v1::DeviceBuffer> k, v;
  uint64_t token_slots = 0;
  uint64_t buffer_bytes = 0;  // one layer, one plane
  uint32_t planes = 0;
};
DeviceBuffers MakeDeviceBuffers(const v1::Pool& pool, uint64_t token_slots);

// The channel arguments the client library uses: a channel made with them
// to the same target shares the client's connection (gRPC's global
// subchannel pool), so the baseline runs over the same transport.
grpc::ChannelArguments ClientChannelArgs();

// The bare unary gRPC call: grpc.health.v1.Health/Check through a generated
// stub, a plain ClientContext, no deadline, no metadata.
class HealthCaller {
 public:
  explicit HealthCaller(const std::string& target);
  void Check();
  // The same call with what hostkv::Client adds per call: a 60 s deadline.
  void CheckWithDeadline();

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
  grpc::health::v1::HealthCheckRequest request_;
};

// A timed operation: does its own untimed setup/cleanup and returns the
// nanoseconds of the part that counts.
using TimedOp = std::function<double()>;

// Wraps `f` so that all of it is timed.
TimedOp Timed(std::function<void()> f);

// Runs `warmup` calls of each, then `rounds` rounds of `per_round` calls of
// `op` followed by `per_round` calls of `base`, so both see the same noise.
void Interleave(int warmup, int rounds, int per_round, const TimedOp& op,
                const TimedOp& base, Samples* op_ns, Samples* base_ns);

// Adds p50 and p99 rows (microseconds) of `op` against `base`.
void AddLatencyRows(Report& report, const std::string& section,
                    const std::string& name, const std::string& config,
                    const Samples& op_ns, const Samples& base_ns,
                    const std::string& baseline, const Target& p50_target,
                    const Target& p99_target, const std::string& note = "");

// Page runs of `pages` as the client library takes them.
std::vector<PageRange> Pages(uint64_t first, uint64_t count);

}  // namespace hostkv::bench

#endif  // HOSTKV_TESTS_BENCH_DAEMON_UTIL_H_
