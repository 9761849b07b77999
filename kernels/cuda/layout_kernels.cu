// CUDA side of the layout math: compiles layout_offsets.h for the device, so
// the GPU and the CPU path share one definition of every layout. The copy
// kernels of the GPU backend build on this file.
#include <cstdint>

#include "kernels/cuda/layout_kernels.h"
#include "kernels/layout_offsets.h"

namespace hostkv {
namespace {

__global__ void HostChunkOffsetsKernel(PoolGeometry g, const ChunkCoord* coords,
                                       uint64_t* offsets, uint64_t n) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const ChunkCoord c = coords[i];
  offsets[i] = HostChunkOffset(g, c.kv, c.layer, c.token, c.chunk);
}

}  // namespace

int ComputeHostChunkOffsetsOnDevice(const PoolGeometry& g,
                                    const ChunkCoord* coords, uint64_t* offsets,
                                    uint64_t n) {
  if (n == 0) return 0;
  ChunkCoord* d_coords = nullptr;
  uint64_t* d_offsets = nullptr;
  cudaError_t err = cudaMalloc(&d_coords, n * sizeof(ChunkCoord));
  if (err == cudaSuccess) err = cudaMalloc(&d_offsets, n * sizeof(uint64_t));
  if (err == cudaSuccess) {
    err = cudaMemcpy(d_coords, coords, n * sizeof(ChunkCoord),
                     cudaMemcpyHostToDevice);
  }
  if (err == cudaSuccess) {
    const unsigned threads = 256;
    const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
    HostChunkOffsetsKernel<<<blocks, threads>>>(g, d_coords, d_offsets, n);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    err = cudaMemcpy(offsets, d_offsets, n * sizeof(uint64_t),
                     cudaMemcpyDeviceToHost);
  }
  cudaFree(d_coords);
  cudaFree(d_offsets);
  return static_cast<int>(err);
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace hostkv
