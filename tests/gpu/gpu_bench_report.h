// The results of hostkv_gpu_bench and their JSON and Markdown forms: every
// figure beside its baseline from the same run, and their ratio.
#ifndef HOSTKV_TESTS_GPU_GPU_BENCH_REPORT_H_
#define HOSTKV_TESTS_GPU_GPU_BENCH_REPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/bench/bench_util.h"

namespace hostkv::gpu_bench {

// The copy-engine limit for one model's transfer size: one contiguous
// cudaMemcpyAsync of the same bytes, pinned host memory.
struct Baseline {
  std::string model;
  uint64_t bytes = 0, layer_bytes = 0;
  double h2d_gbps = 0, d2h_gbps = 0, layer_h2d_ms = 0;
  // The same bytes in the pieces of a per-layer load (one page of one
  // layer of one plane each, device pages shuffled), all layers, H2D, in
  // this process: a trivial copy kernel, and cudaMemcpyBatchAsync (0: the
  // driver has none).
  uint64_t pieces = 0;
  double scatter_kernel_h2d_gbps = 0, scatter_batch_h2d_gbps = 0;
};

// One (model, layout, mechanism) through hostkvd; medians of the
// repetitions.
struct CaseResult {
  std::string model, layout, mechanism;
  std::string error;   // the first failed operation's, if any
  uint64_t bytes = 0;  // per operation
  int load_reps = 0, backup_reps = 0;
  double load_gbps = 0, first_layer_ms = 0, backup_gbps = 0;
  double load_call_us = 0, backup_call_us = 0;  // wall time of the RPC
  std::vector<double> layer_ms;  // per layer, from the start of a load
};

// The Load call against the bare RPC of the same daemon.
struct CallCost {
  bench::Samples load_us, get_pool_us;
  uint64_t runs = 0;  // device runs in each Load request
};

// Small loads (a few pages, every layer): from an event before the Load
// call to the event after the engine's stream passed its wait for layer 0,
// timed on the GPU: when the first layer is usable.
struct SmallLoad {
  uint32_t pages = 0;
  bench::Samples first_layer_us;
  bench::Samples call_us;  // the RPC's wall time
};

struct Report {
  std::vector<std::pair<std::string, std::string>> meta;
  std::vector<Baseline> baselines;
  std::vector<CaseResult> cases;
  CallCost call;
  std::vector<SmallLoad> small_loads;
  std::vector<std::string> notes;

  // The baseline of `model` (the first one if none matches).
  const Baseline& BaselineFor(const std::string& model) const;
};

std::string Json(const Report& report);
std::string Markdown(const Report& report);

}  // namespace hostkv::gpu_bench

#endif  // HOSTKV_TESTS_GPU_GPU_BENCH_REPORT_H_
