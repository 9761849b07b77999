// The SM gather/scatter copy kernel: moves one layer's token rows between
// the pinned host pool (read or written through UVA) and the engine's device
// buffers. Which bytes go where is kernels/kernel_copy_plan.h, shared with the
// CPU emulation that the CPU tests check; this file only adds the warps.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/copy_kernels.h"
#include "kernels/kernel_copy_plan.h"

namespace hostkv {
namespace {

constexpr uint32_t kThreadsPerBlock =
    kKernelCopyLanes * kKernelCopyWarpsPerBlock;  // 256

// Lane `lane` of a warp copies vectors lane, lane + 32, ... of the `n`
// vectors of T at src to dst (the vectors KernelVectorWidth chose, so each is
// aligned and the last ends at the chunk's end). The loads of an unrolled
// step are issued before its stores, so that each lane keeps several reads of
// (possibly PCIe-distant) memory in flight. src and dst never overlap: one is
// in the host pool, the other in a device buffer. Host memory is read with
// plain loads; the read-only path (__ldg) is not needed for it.
template <typename T>
__device__ __forceinline__ void CopyVectors(const uint8_t* src, uint8_t* dst,
                                            uint64_t n, uint32_t lane) {
  constexpr uint32_t kUnroll = 4;
  const T* __restrict__ s = reinterpret_cast<const T*>(src);
  T* __restrict__ d = reinterpret_cast<T*>(dst);
  uint64_t v = lane;
  // Whole steps: v + 96 < n, so all four vectors exist.
  for (; v + (kUnroll - 1) * kKernelCopyLanes < n;
       v += kUnroll * kKernelCopyLanes) {
    T x[kUnroll];
#pragma unroll
    for (uint32_t u = 0; u < kUnroll; ++u) x[u] = s[v + u * kKernelCopyLanes];
#pragma unroll
    for (uint32_t u = 0; u < kUnroll; ++u) d[v + u * kKernelCopyLanes] = x[u];
  }
  for (; v < n; v += kKernelCopyLanes) d[v] = s[v];
}

// Copies one chunk with the widest vectors its addresses allow.
__device__ __forceinline__ void CopyChunk(const KernelChunk& c, uint32_t lane) {
  switch (KernelVectorWidth(c.src, c.dst, c.bytes)) {
    case 16:
      CopyVectors<uint4>(c.src, c.dst, c.bytes / 16, lane);
      break;
    case 8:
      CopyVectors<uint2>(c.src, c.dst, c.bytes / 8, lane);
      break;
    case 4:
      CopyVectors<uint32_t>(c.src, c.dst, c.bytes / 4, lane);
      break;
    case 2:
      CopyVectors<uint16_t>(c.src, c.dst, c.bytes / 2, lane);
      break;
    default:
      CopyVectors<uint8_t>(c.src, c.dst, c.bytes, lane);
      break;
  }
}

// Chunks of a row whose loads are issued together before their stores.
constexpr uint32_t kRowBatch = 8;

// Copies chunks [first, first + count) of row `r` (count <= kRowBatch). When
// every chunk is small (at most one 16-byte vector per lane: page_head rows,
// one chunk per head) and 16-byte aligned, each lane issues all the batch's
// loads before any store, so a row's reads over PCIe overlap instead of
// waiting one chunk at a time; otherwise chunk by chunk (CopyVectors already
// batches the loads of a large chunk).
__device__ __forceinline__ void CopyRowChunks(const KernelCopyArgs& args,
                                              const KernelRow& r,
                                              uint32_t first, uint32_t count,
                                              uint32_t lane) {
  KernelChunk c[kRowBatch];
  bool batched = args.geometry.chunk_bytes() <= 16ull * kKernelCopyLanes;
#pragma unroll
  for (uint32_t k = 0; k < kRowBatch; ++k) {
    if (k < count) {
      c[k] = KernelChunkOf(args, r, first + k);
      batched = batched && KernelVectorWidth(c[k].src, c[k].dst, c[k].bytes) == 16;
    }
  }
  if (!batched) {
    for (uint32_t k = 0; k < count; ++k) CopyChunk(c[k], lane);
    return;
  }
  const uint64_t vectors = args.geometry.chunk_bytes() / 16;  // <= 32
  uint4 x[kRowBatch];
#pragma unroll
  for (uint32_t k = 0; k < kRowBatch; ++k) {
    if (k < count && lane < vectors) {
      x[k] = reinterpret_cast<const uint4*>(c[k].src)[lane];
    }
  }
#pragma unroll
  for (uint32_t k = 0; k < kRowBatch; ++k) {
    if (k < count && lane < vectors) {
      reinterpret_cast<uint4*>(c[k].dst)[lane] = x[k];
    }
  }
}

// One warp per row, striding over the rows by the number of warps in the
// grid; the whole warp takes the same branches (the vector width depends on
// the chunk, not the lane). The token index is in device memory (uploaded
// once per operation, see server/cuda/cuda_transfer.cc).
__global__ void __launch_bounds__(kThreadsPerBlock)
    LayerCopyKernel(const KernelCopyArgs args) {
  const uint32_t lane = threadIdx.x % kKernelCopyLanes;
  const uint64_t warps_per_block = blockDim.x / kKernelCopyLanes;
  const uint64_t first_row =
      blockIdx.x * warps_per_block + threadIdx.x / kKernelCopyLanes;
  const uint64_t num_warps = gridDim.x * warps_per_block;
  const uint64_t rows = KernelCopyRows(args);
  const uint32_t chunks = args.geometry.chunks_per_row();
  for (uint64_t row = first_row; row < rows; row += num_warps) {
    const KernelRow r = KernelRowAt(args, row);  // the index, read once
    for (uint32_t chunk = 0; chunk < chunks; chunk += kRowBatch) {
      const uint32_t count =
          chunks - chunk < kRowBatch ? chunks - chunk : kRowBatch;
      CopyRowChunks(args, r, chunk, count, lane);
    }
  }
}

}  // namespace

int LaunchLayerCopyKernel(const KernelCopyArgs& args, unsigned max_blocks,
                          void* stream) {
  if (args.num_tokens == 0) return 0;
  const PoolGeometry& g = args.geometry;
  const bool planes_set =
      args.device_plane[0] != nullptr &&
      (g.kv_planes() == 1 || args.device_plane[1] != nullptr);
  if (args.host_base == nullptr || !planes_set || args.host_tokens == nullptr ||
      args.device_tokens == nullptr || args.layer >= g.num_layers ||
      g.page_size == 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const uint32_t blocks = KernelCopyBlocks(KernelCopyRows(args), max_blocks);
  LayerCopyKernel<<<blocks, kThreadsPerBlock, 0,
                    static_cast<cudaStream_t>(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace hostkv
