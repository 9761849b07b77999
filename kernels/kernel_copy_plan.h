// The per-row address math of the SM gather/scatter copy kernel, written once
// for the CUDA kernel (kernels/cuda/copy_kernels.cu) and for a CPU emulation
// of it, so that CPU tests check the exact arithmetic the GPU runs.
//
// The kernel moves one layer: row r of the copy is plane kv = r / num_tokens
// of token i = r % num_tokens, stored as chunks_per_row() chunks (one, or one
// per head for page_head). One warp copies one row at a time; its 32 lanes
// copy each chunk together, with the widest vector type the addresses and the
// chunk size allow.
//
// Compiles under nvcc (C++17) as well as the host compiler.
#ifndef HOSTKV_KERNELS_KERNEL_COPY_PLAN_H_
#define HOSTKV_KERNELS_KERNEL_COPY_PLAN_H_

#include <cstdint>
#include <vector>

#include "kernels/copy_plan.h"
#include "kernels/host_device.h"
#include "kernels/layout_offsets.h"
#include "kernels/pool_geometry.h"

namespace hostkv {

// Threads of a warp, warps of a block, and blocks when the caller gives no
// limit: few, since the copy shares the SMs with the engine's kernels.
inline constexpr uint32_t kKernelCopyLanes = 32;
inline constexpr uint32_t kKernelCopyWarpsPerBlock = 8;
inline constexpr uint32_t kKernelCopyDefaultBlocks = 16;

// One layer's copy, passed by value to the kernel. Pointers are as the
// copying processor sees them: for the GPU, host_base is the device address
// of the (mapped, pinned) host pool and the token arrays are device-resident.
struct KernelCopyArgs {
  PoolGeometry geometry;
  uint8_t* host_base;
  uint8_t* device_plane[2];     // this layer's K and V buffers; V null for MLA
  const uint64_t* host_tokens;  // num_tokens host token slots
  const uint64_t* device_tokens;  // num_tokens device token slots
  uint64_t num_tokens;
  uint32_t layer;
  CopyDirection direction;
};

// One chunk of one row: `bytes` bytes from src to dst.
struct KernelChunk {
  const uint8_t* src;
  uint8_t* dst;
  uint64_t bytes;
};

// Rows of the copy: every token in every plane.
HOSTKV_HD uint64_t KernelCopyRows(const KernelCopyArgs& a) {
  return a.geometry.kv_planes() * a.num_tokens;
}

// What one row of the copy is: its plane and its token slots on both sides
// (loaded once per row, whatever the number of chunks).
struct KernelRow {
  uint32_t kv;
  uint64_t host_token;
  uint64_t device_token;
};

// REQUIRES: row < KernelCopyRows(a).
HOSTKV_HD KernelRow KernelRowAt(const KernelCopyArgs& a, uint64_t row) {
  const uint64_t i = row % a.num_tokens;
  return {static_cast<uint32_t>(row / a.num_tokens), a.host_tokens[i],
          a.device_tokens[i]};
}

// The source and destination of chunk `chunk` of row `r`.
// REQUIRES: chunk < a.geometry.chunks_per_row(), the token slots are in
//           range of the pool and device buffers.
HOSTKV_HD KernelChunk KernelChunkOf(const KernelCopyArgs& a, const KernelRow& r,
                                    uint32_t chunk) {
  uint8_t* host = a.host_base + HostChunkOffset(a.geometry, r.kv, a.layer,
                                                r.host_token, chunk);
  // A select, not device_plane[kv]: a dynamic index into a kernel parameter
  // would make nvcc copy the parameter to local memory.
  uint8_t* plane = r.kv == 0 ? a.device_plane[0] : a.device_plane[1];
  uint8_t* device =
      plane + DeviceChunkOffset(a.geometry, r.device_token, chunk);
  const uint64_t bytes = a.geometry.chunk_bytes();
  if (a.direction == CopyDirection::kHostToDevice) {
    return {host, device, bytes};
  }
  return {device, host, bytes};
}

// The same for row number `row`.
// REQUIRES: row < KernelCopyRows(a), and as KernelChunkOf.
HOSTKV_HD KernelChunk KernelChunkAt(const KernelCopyArgs& a, uint64_t row,
                                    uint32_t chunk) {
  return KernelChunkOf(a, KernelRowAt(a, row), chunk);
}

// The widest of 16, 8, 4, 2, 1 bytes that divides both addresses and the
// byte count: every vector of that width is aligned and none overruns.
HOSTKV_HD uint32_t KernelVectorWidth(const void* src, const void* dst,
                                     uint64_t bytes) {
  const uint64_t bits =
      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(src)) |
      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(dst)) | bytes;
  for (uint32_t width = 16; width > 1; width /= 2) {
    if (bits % width == 0) return width;
  }
  return 1;
}

// Blocks the launcher starts for `rows` rows: one warp per row up to
// `max_blocks` (0: kKernelCopyDefaultBlocks); the warps then stride over the
// remaining rows. 0 when there are no rows; at most 2^31 - 1 (gridDim.x).
HOSTKV_HD uint32_t KernelCopyBlocks(uint64_t rows, uint32_t max_blocks) {
  uint64_t limit = max_blocks == 0 ? kKernelCopyDefaultBlocks : max_blocks;
  if (limit > 0x7fffffffu) limit = 0x7fffffffu;
  const uint64_t wanted =
      (rows + kKernelCopyWarpsPerBlock - 1) / kKernelCopyWarpsPerBlock;
  return static_cast<uint32_t>(wanted < limit ? wanted : limit);
}

// A transfer's runs expanded to one host and one device slot per token.
struct TokenIndex {
  std::vector<uint64_t> host_tokens;
  std::vector<uint64_t> device_tokens;
};
TokenIndex BuildTokenIndex(const std::vector<TokenRun>& runs);

// The same into caller-owned arrays of the runs' total token count (the GPU
// path writes them into pinned memory the kernel reads).
void ExpandTokenIndex(const std::vector<TokenRun>& runs, uint64_t* host_tokens,
                      uint64_t* device_tokens);

// Runs the kernel's work on the CPU: the default grid's warps, each over its
// rows, each chunk split among 32 lanes in vectors of KernelVectorWidth.
// Pointers in `args` are CPU pointers. Does nothing when num_tokens is 0.
void RunKernelCopyOnCpu(const KernelCopyArgs& args);

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_KERNEL_COPY_PLAN_H_
