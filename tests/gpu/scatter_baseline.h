// The bench's same-shape scatter baseline: the pieces a per-layer load
// moves (one page of one layer of one plane each), from pinned host memory
// into device pages in a shuffled order, copied in this process without
// hostkvd: by a trivial kernel (one block per piece, reading the host
// through UVA) and by cudaMemcpyBatchAsync (the copy engines). hostkvd's
// GB/s beside these separates its own cost from the shape's.
#ifndef HOSTKV_TESTS_GPU_SCATTER_BASELINE_H_
#define HOSTKV_TESTS_GPU_SCATTER_BASELINE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace hostkv::gpu_testing {

// Enqueues on `stream` the copy of `n` pieces of `piece_bytes`: piece i from
// src + src_offsets[i] to dst + dst_offsets[i] (offset arrays in device
// memory). Returns the launch error.
cudaError_t LaunchPieceCopyKernel(const uint8_t* src, const uint64_t* src_offsets,
                                  uint8_t* dst, const uint64_t* dst_offsets,
                                  uint64_t piece_bytes, uint64_t n,
                                  cudaStream_t stream);

}  // namespace hostkv::gpu_testing

#endif  // HOSTKV_TESTS_GPU_SCATTER_BASELINE_H_
