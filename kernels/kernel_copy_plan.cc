#include "kernels/kernel_copy_plan.h"

#include <cstring>

namespace hostkv {

void ExpandTokenIndex(const std::vector<TokenRun>& runs, uint64_t* host_tokens,
                      uint64_t* device_tokens) {
  uint64_t i = 0;
  for (const TokenRun& run : runs) {
    for (uint64_t t = 0; t < run.num_tokens; ++t, ++i) {
      host_tokens[i] = run.host_token + t;
      device_tokens[i] = run.device_token + t;
    }
  }
}

TokenIndex BuildTokenIndex(const std::vector<TokenRun>& runs) {
  uint64_t total = 0;
  for (const TokenRun& run : runs) total += run.num_tokens;
  TokenIndex index;
  index.host_tokens.resize(total);
  index.device_tokens.resize(total);
  ExpandTokenIndex(runs, index.host_tokens.data(), index.device_tokens.data());
  return index;
}

namespace {

// What one warp does with one chunk: lane l copies vectors l, l + 32, ...
// (memcpy stands for the kernel's typed vector loads and stores).
void CopyChunkAsWarp(const KernelChunk& c) {
  const uint32_t width = KernelVectorWidth(c.src, c.dst, c.bytes);
  const uint64_t vectors = c.bytes / width;
  for (uint32_t lane = 0; lane < kKernelCopyLanes; ++lane) {
    for (uint64_t v = lane; v < vectors; v += kKernelCopyLanes) {
      std::memcpy(c.dst + v * width, c.src + v * width, width);
    }
  }
}

}  // namespace

void RunKernelCopyOnCpu(const KernelCopyArgs& args) {
  if (args.num_tokens == 0) return;
  const uint64_t rows = KernelCopyRows(args);
  const uint32_t chunks = args.geometry.chunks_per_row();
  // The warps of the default grid, each striding over the rows.
  const uint64_t warps = static_cast<uint64_t>(KernelCopyBlocks(rows, 0)) *
                         kKernelCopyWarpsPerBlock;
  for (uint64_t warp = 0; warp < warps; ++warp) {
    for (uint64_t row = warp; row < rows; row += warps) {
      const KernelRow r = KernelRowAt(args, row);
      for (uint32_t chunk = 0; chunk < chunks; ++chunk) {
        CopyChunkAsWarp(KernelChunkOf(args, r, chunk));
      }
    }
  }
}

}  // namespace hostkv
