// Host-callable entry points of the CUDA layout code (no CUDA headers here).
#ifndef HOSTKV_KERNELS_CUDA_LAYOUT_KERNELS_H_
#define HOSTKV_KERNELS_CUDA_LAYOUT_KERNELS_H_

#include <cstdint>

#include "kernels/pool_geometry.h"

namespace hostkv {

struct ChunkCoord {
  uint32_t kv;
  uint32_t layer;
  uint64_t token;
  uint32_t chunk;
  uint32_t pad;
};

// Computes HostChunkOffset for every coordinate on the GPU (the GPU test
// compares the result with the CPU). Returns the cudaError_t value (0 = ok).
int ComputeHostChunkOffsetsOnDevice(const PoolGeometry& g,
                                    const ChunkCoord* coords, uint64_t* offsets,
                                    uint64_t n);

// Number of usable CUDA devices; 0 without a driver or GPU.
int CudaDeviceCount();

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_CUDA_LAYOUT_KERNELS_H_
