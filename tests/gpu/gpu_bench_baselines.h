// hostkv_gpu_bench's baselines, measured in the same run as the transfers
// through hostkvd: one contiguous cudaMemcpyAsync of the same bytes (the
// copy-engine limit), and the same-shape scatter copies (see Baseline).
#ifndef HOSTKV_TESTS_GPU_GPU_BENCH_BASELINES_H_
#define HOSTKV_TESTS_GPU_GPU_BENCH_BASELINES_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tests/gpu/gpu_bench_common.h"
#include "tests/gpu/gpu_bench_report.h"

namespace hostkv::gpu_bench {

// Median time of `reps` contiguous cudaMemcpyAsync calls, after a warm-up.
double CopyMs(void* dst, const void* src, uint64_t bytes, cudaStream_t stream,
              int reps);

// The scatter baselines of `b`: every layer's pieces from `host` (pinned,
// mapped, b->bytes) into `device` (b->bytes) at shuffled pages.
void MeasureScatter(const Model& m, uint64_t tokens, int reps, void* host,
                    void* device, cudaStream_t stream, Baseline* b);

// Every baseline of `m` for transfers of `tokens`. Fails the run on a CUDA error.
Baseline MeasureBaseline(const Model& m, uint64_t tokens, int reps);

}  // namespace hostkv::gpu_bench

#endif  // HOSTKV_TESTS_GPU_GPU_BENCH_BASELINES_H_
