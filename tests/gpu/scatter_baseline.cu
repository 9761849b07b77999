#include <cuda_runtime.h>

#include "tests/gpu/scatter_baseline.h"

namespace hostkv::gpu_testing {
namespace {

__global__ void PieceCopyKernel(const uint8_t* src, const uint64_t* src_offsets,
                                uint8_t* dst, const uint64_t* dst_offsets,
                                uint64_t piece_bytes, uint64_t n) {
  for (uint64_t p = blockIdx.x; p < n; p += gridDim.x) {
    const uint8_t* from = src + src_offsets[p];
    uint8_t* to = dst + dst_offsets[p];
    const bool wide = (reinterpret_cast<uintptr_t>(from) % 16 == 0) &&
                      (reinterpret_cast<uintptr_t>(to) % 16 == 0) &&
                      piece_bytes % 16 == 0;
    if (wide) {
      const uint4* f = reinterpret_cast<const uint4*>(from);
      uint4* t = reinterpret_cast<uint4*>(to);
      for (uint64_t i = threadIdx.x; i < piece_bytes / 16; i += blockDim.x) t[i] = f[i];
    } else {
      for (uint64_t i = threadIdx.x; i < piece_bytes; i += blockDim.x) to[i] = from[i];
    }
  }
}

}  // namespace

cudaError_t LaunchPieceCopyKernel(const uint8_t* src, const uint64_t* src_offsets,
                                  uint8_t* dst, const uint64_t* dst_offsets,
                                  uint64_t piece_bytes, uint64_t n,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = n < 1024 ? static_cast<unsigned>(n) : 1024u;
  PieceCopyKernel<<<blocks, 256, 0, stream>>>(src, src_offsets, dst, dst_offsets,
                                              piece_bytes, n);
  return cudaGetLastError();
}

}  // namespace hostkv::gpu_testing
