// A transfer reduced to what the copy paths need: matched runs of host and
// device token slots, each contiguous on both sides.
#ifndef HOSTKV_KERNELS_COPY_PLAN_H_
#define HOSTKV_KERNELS_COPY_PLAN_H_

#include <cstdint>
#include <vector>

#include "kernels/pool_geometry.h"

namespace hostkv {

struct TokenRun {
  uint64_t host_token;    // first host token slot
  uint64_t device_token;  // first device token slot
  uint64_t num_tokens;
};

// A run of host token slots or device token slots.
struct SlotSpan {
  uint64_t first;
  uint64_t count;
};

// Zips host and device spans into runs contiguous on both sides. The totals
// must be equal (callers validate this); spans of length 0 are skipped.
std::vector<TokenRun> ZipRuns(const std::vector<SlotSpan>& host,
                              const std::vector<SlotSpan>& device);

enum class CopyDirection : uint8_t { kHostToDevice, kDeviceToHost };

// kKernel moves one chunk (token row, or head for page_head) per copy, like
// the SM gather/scatter kernel; kDirect coalesces chunks that are contiguous
// on both sides into one copy, like the copy-engine path.
enum class CopyMechanism : uint8_t { kKernel, kDirect };

// Base addresses of one layer's device buffers (V is null for MLA).
struct LayerBuffers {
  uint8_t* plane[2];
};

// One layer-by-layer copy between a host pool and an engine's device buffers.
struct CopyTask {
  PoolGeometry geometry;
  uint8_t* host_base = nullptr;
  const LayerBuffers* layers = nullptr;  // geometry.num_layers entries
  std::vector<TokenRun> runs;
  std::vector<uint64_t> run_starts;  // prefix sums of runs[i].num_tokens
  uint64_t total_tokens = 0;
  CopyDirection direction = CopyDirection::kHostToDevice;
  CopyMechanism mechanism = CopyMechanism::kDirect;

  // Fills run_starts and total_tokens from runs.
  void IndexRuns();
};

// Copies tokens [token_begin, token_end) (positions in the concatenated
// runs) of one layer, every plane.
// REQUIRES: task.IndexRuns() was called; token_end <= total_tokens.
void CopyLayerSlice(const CopyTask& task, uint32_t layer, uint64_t token_begin,
                    uint64_t token_end);

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_COPY_PLAN_H_
