// A transfer reduced to what the copy paths need: matched runs of host and
// device token slots, each contiguous on both sides.
#ifndef HOSTKV_KERNELS_COPY_PLAN_H_
#define HOSTKV_KERNELS_COPY_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/layout_offsets.h"
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

// One contiguous copy of a layer: `bytes` at host_base + host and at
// layers[layer].plane[kv] + device.
struct CopyPiece {
  uint64_t host;
  uint64_t device;
  uint64_t bytes;
};

// Whether ForEachPiece merges chunks contiguous on both sides: as the
// task's mechanism says (the GPU paths), or always (the CPU backend, where
// the mechanism names no different hardware and one memcpy per token row
// only costs).
enum class Coalesce : uint8_t { kByMechanism, kAlways };

// Calls fn(const CopyPiece&) for the pieces of tokens [token_begin,
// token_end) (positions in the concatenated runs) of one layer and plane, in
// order: one per chunk (kKernel), or chunks contiguous on both sides merged
// (kDirect, or `coalesce` kAlways). The CPU path and the GPU copy-engine
// path both copy these.
// REQUIRES: task.IndexRuns() was called; token_end <= total_tokens.
template <typename Fn>
void ForEachPiece(const CopyTask& task, uint32_t layer, uint32_t kv,
                  uint64_t token_begin, uint64_t token_end, Fn&& fn,
                  Coalesce coalesce = Coalesce::kByMechanism);

// Every piece of one layer (all tokens), plane by plane: what the GPU
// copy-engine path hands to one batched copy.
std::vector<CopyPiece> LayerPieces(const CopyTask& task, uint32_t layer,
                                   uint32_t kv);

// Copies tokens [token_begin, token_end) (positions in the concatenated
// runs) of one layer, every plane.
// REQUIRES: task.IndexRuns() was called; token_end <= total_tokens.
void CopyLayerSlice(const CopyTask& task, uint32_t layer, uint64_t token_begin,
                    uint64_t token_end);

// The run holding token position `token` (REQUIRES: IndexRuns()).
size_t RunAt(const CopyTask& task, uint64_t token);

template <typename Fn>
void ForEachPiece(const CopyTask& task, uint32_t layer, uint32_t kv,
                  uint64_t token_begin, uint64_t token_end, Fn&& fn,
                  Coalesce merge) {
  const PoolGeometry& g = task.geometry;
  const uint32_t chunks = g.chunks_per_row();
  const uint64_t chunk_bytes = g.chunk_bytes();
  const bool coalesce = merge == Coalesce::kAlways ||
                        task.mechanism == CopyMechanism::kDirect;
  CopyPiece pending{0, 0, 0};
  for (size_t r = RunAt(task, token_begin); r < task.runs.size(); ++r) {
    const uint64_t run_start = task.run_starts[r];
    if (run_start >= token_end) break;
    const TokenRun& run = task.runs[r];
    const uint64_t begin = (token_begin > run_start ? token_begin : run_start) -
                           run_start;
    const uint64_t run_end = run_start + run.num_tokens;
    const uint64_t end = (token_end < run_end ? token_end : run_end) - run_start;
    for (uint64_t i = begin; i < end; ++i) {
      for (uint32_t c = 0; c < chunks; ++c) {
        const CopyPiece next{
            HostChunkOffset(g, kv, layer, run.host_token + i, c),
            DeviceChunkOffset(g, run.device_token + i, c), chunk_bytes};
        if (coalesce && pending.bytes != 0 &&
            pending.host + pending.bytes == next.host &&
            pending.device + pending.bytes == next.device) {
          pending.bytes += next.bytes;
          continue;
        }
        if (pending.bytes != 0) fn(pending);
        pending = next;
      }
    }
  }
  if (pending.bytes != 0) fn(pending);
}

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_COPY_PLAN_H_
