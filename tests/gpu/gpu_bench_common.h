// What hostkv_gpu_bench's parts share: the page size, the models, and the
// checks that end the run through Fail() (gpu_bench.cc: it writes the
// report so far, stops the daemon and exits).
#ifndef HOSTKV_TESTS_GPU_GPU_BENCH_COMMON_H_
#define HOSTKV_TESTS_GPU_GPU_BENCH_COMMON_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace hostkv::gpu_bench {

inline constexpr uint32_t kPageSize = 64;

// Ends the run: the report so far is written with `what` as a note.
[[noreturn]] void Fail(const std::string& what);

inline void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Fail(what + ": " + status.ToString());
}
template <typename T>
T Check(absl::StatusOr<T> result, const std::string& what) {
  Check(result.status(), what);
  return std::move(*result);
}
inline void CheckCuda(cudaError_t error, const std::string& what) {
  if (error != cudaSuccess) {
    Fail(absl::StrCat(what, ": ", cudaGetErrorName(error), " (",
                      cudaGetErrorString(error), ")"));
  }
}

struct Model {
  std::string label;
  bool mla;
  uint32_t layers;
  uint32_t heads;
  uint32_t dim;  // MHA head_dim; MLA kv_lora_rank + qk_rope_head_dim
  uint32_t planes() const { return mla ? 1 : 2; }
  uint64_t row_bytes() const { return uint64_t{heads} * dim * 2; }  // bf16
  uint64_t op_bytes(uint64_t tokens) const {
    return tokens * planes() * layers * row_bytes();
  }
  uint64_t pool_bytes(uint64_t tokens) const {
    return (tokens / kPageSize + 1) * kPageSize * planes() * layers *
           row_bytes();
  }
};
// Llama-3-8B's KV (2 KiB rows per plane) and DeepSeek-V3's latent.
inline const Model kMha{"MHA 32L x 8H x 128D bf16", false, 32, 8, 128};
inline const Model kMla{"MLA 61L x 576 bf16", true, 61, 1, 576};

inline double Gbps(uint64_t bytes, double ms) {
  return ms > 0 ? bytes / ms / 1e6 : 0;
}

}  // namespace hostkv::gpu_bench

#endif  // HOSTKV_TESTS_GPU_GPU_BENCH_COMMON_H_
