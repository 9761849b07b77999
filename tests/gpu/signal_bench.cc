// Latency of the two ways one stream can signal another without a host
// round trip, the choice behind the GPU backend's per-layer completion:
//   mem_ops: cuStreamWriteValue64 on one stream, cuStreamWaitValue64(>=) on
//            the other (what hostkvd uses: GpuSignals);
//   events:  cudaEventRecord of an interprocess event on one stream,
//            cudaStreamWaitEvent on the other.
// Two streams ping-pong N times; each round trip is two signal hops. The
// time per hop is measured on the GPU (timing events around the whole
// chain), beside a chain with no cross-stream signal (one stream, the same
// number of tiny writes) as the baseline.
//
//   hostkv_signal_bench [--out DIR] [--rounds N]
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cuda/driver_api.h"

namespace hostkv {
namespace {

#define CHECK_CUDA(expr)                                              \
  do {                                                                \
    const cudaError_t e = (expr);                                     \
    if (e != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e)); \
      std::exit(1);                                                   \
    }                                                                 \
  } while (0)
#define CHECK_CU(expr)                                                       \
  do {                                                                       \
    const CUresult r = (expr);                                               \
    if (r != CUDA_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s: CUresult %d\n", #expr, static_cast<int>(r)); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

struct Streams {
  cudaStream_t a, b;
  cudaEvent_t start, stop;
};

// Runs `enqueue` once to warm up, then `reps` times timed; returns the
// median microseconds per hop.
template <typename Fn>
double MedianHopMicros(const Streams& s, int hops, int reps, Fn enqueue) {
  std::vector<double> per_hop;
  for (int rep = -1; rep < reps; ++rep) {
    CHECK_CUDA(cudaEventRecord(s.start, s.a));
    enqueue(rep + 1);
    CHECK_CUDA(cudaEventRecord(s.stop, s.a));
    CHECK_CUDA(cudaEventSynchronize(s.stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, s.start, s.stop));
    if (rep >= 0) per_hop.push_back(1000.0 * ms / hops);
  }
  std::sort(per_hop.begin(), per_hop.end());
  return per_hop[per_hop.size() / 2];
}

int Main(int argc, char** argv) {
  std::string out_dir = ".";
  int rounds = 1000;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help") {
      std::printf("usage: hostkv_signal_bench [--out DIR] [--rounds N]\n");
      return 0;
    }
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--out") out_dir = argv[i + 1];
    if (flag == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "hostkv_signal_bench: no CUDA device\n");
    return 2;
  }
  absl::StatusOr<const DriverApi*> loaded = GetDriverApi();
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(loaded.status().message()).c_str());
    return 2;
  }
  const DriverApi* api = *loaded;
  Streams s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s.a, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s.b, cudaStreamNonBlocking));
  CHECK_CUDA(cudaEventCreate(&s.start));
  CHECK_CUDA(cudaEventCreate(&s.stop));
  uint64_t* words = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&words), 4 * sizeof(uint64_t)));
  CHECK_CUDA(cudaMemset(words, 0, 4 * sizeof(uint64_t)));
  CHECK_CUDA(cudaDeviceSynchronize());
  auto word = [&](int i) { return reinterpret_cast<CUdeviceptr>(words + i); };
  auto cu = [](cudaStream_t st) { return reinterpret_cast<CUstream>(st); };
  const int reps = 7;
  const int hops = 2 * rounds;

  // Baseline: the same writes on one stream, no cross-stream wait.
  const double baseline = MedianHopMicros(s, hops, reps, [&](int) {
    for (int i = 0; i < hops; ++i) {
      CHECK_CU(api->stream_write_value64(cu(s.a), word(3), i,
                                         CU_STREAM_WRITE_VALUE_DEFAULT));
    }
  });

  // Stream memory operations: values grow across repetitions, so every
  // wait is for a value not yet written when it is enqueued.
  uint64_t value = 0;
  const double mem_ops = MedianHopMicros(s, hops, reps, [&](int) {
    for (int i = 0; i < rounds; ++i) {
      ++value;
      CHECK_CU(api->stream_write_value64(cu(s.a), word(0), value,
                                         CU_STREAM_WRITE_VALUE_DEFAULT));
      CHECK_CU(api->stream_wait_value64(cu(s.b), word(0), value,
                                        CU_STREAM_WAIT_VALUE_GEQ));
      CHECK_CU(api->stream_write_value64(cu(s.b), word(1), value,
                                         CU_STREAM_WRITE_VALUE_DEFAULT));
      CHECK_CU(api->stream_wait_value64(cu(s.a), word(1), value,
                                        CU_STREAM_WAIT_VALUE_GEQ));
    }
  });

  // Interprocess events (re-recorded each round, as one event per layer
  // would be by consecutive operations).
  cudaEvent_t ping, pong;
  const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
  CHECK_CUDA(cudaEventCreateWithFlags(&ping, flags));
  CHECK_CUDA(cudaEventCreateWithFlags(&pong, flags));
  const double events = MedianHopMicros(s, hops, reps, [&](int) {
    for (int i = 0; i < rounds; ++i) {
      CHECK_CUDA(cudaEventRecord(ping, s.a));
      CHECK_CUDA(cudaStreamWaitEvent(s.b, ping, 0));
      CHECK_CUDA(cudaEventRecord(pong, s.b));
      CHECK_CUDA(cudaStreamWaitEvent(s.a, pong, 0));
    }
  });

  char line[512];
  std::snprintf(
      line, sizeof(line),
      "| mechanism | us per hop (median of %d, %d hops) | vs one-stream "
      "baseline |\n"
      "|---|---|---|\n"
      "| one stream, no cross-stream signal (baseline) | %.2f | 1.00x |\n"
      "| stream memory ops (cuStreamWrite/WaitValue64) | %.2f | %.2fx |\n"
      "| interprocess events (record / StreamWaitEvent) | %.2f | %.2fx |\n",
      reps, hops, baseline, mem_ops, mem_ops / baseline, events,
      events / baseline);
  std::printf("%s", line);
  std::ofstream(out_dir + "/signal_bench.md") << line;
  std::ofstream(out_dir + "/signal_bench.json")
      << "{\"hops\": " << hops << ", \"baseline_us\": " << baseline
      << ", \"mem_ops_us\": " << mem_ops << ", \"events_us\": " << events
      << "}\n";
  CHECK_CUDA(cudaFree(words));
  return 0;
}

}  // namespace
}  // namespace hostkv

int main(int argc, char** argv) { return hostkv::Main(argc, argv); }
