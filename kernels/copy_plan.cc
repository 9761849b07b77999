#include "kernels/copy_plan.h"

#include <algorithm>
#include <cstring>

#include "kernels/layout_offsets.h"

namespace hostkv {

std::vector<TokenRun> ZipRuns(const std::vector<SlotSpan>& host,
                              const std::vector<SlotSpan>& device) {
  std::vector<TokenRun> runs;
  size_t h = 0, d = 0;
  uint64_t h_used = 0, d_used = 0;
  while (h < host.size() && d < device.size()) {
    const uint64_t h_left = host[h].count - h_used;
    const uint64_t d_left = device[d].count - d_used;
    const uint64_t n = std::min(h_left, d_left);
    if (n != 0) {
      const uint64_t host_token = host[h].first + h_used;
      const uint64_t device_token = device[d].first + d_used;
      if (!runs.empty() &&
          runs.back().host_token + runs.back().num_tokens == host_token &&
          runs.back().device_token + runs.back().num_tokens == device_token) {
        runs.back().num_tokens += n;
      } else {
        runs.push_back({host_token, device_token, n});
      }
    }
    h_used += n;
    d_used += n;
    if (h_used == host[h].count) ++h, h_used = 0;
    if (d_used == device[d].count) ++d, d_used = 0;
  }
  return runs;
}

void CopyTask::IndexRuns() {
  run_starts.resize(runs.size());
  total_tokens = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    run_starts[i] = total_tokens;
    total_tokens += runs[i].num_tokens;
  }
}

namespace {

// Accumulates (host offset, device offset) chunks and copies each maximal
// contiguous piece once (kDirect), or every chunk by itself (kKernel).
class SliceCopier {
 public:
  SliceCopier(uint8_t* host, uint8_t* device, CopyDirection direction,
              bool coalesce)
      : host_(host), device_(device), direction_(direction),
        coalesce_(coalesce) {}
  ~SliceCopier() { Flush(); }

  void Add(uint64_t host_offset, uint64_t device_offset, uint64_t bytes) {
    if (coalesce_ && bytes_ != 0 && host_off_ + bytes_ == host_offset &&
        dev_off_ + bytes_ == device_offset) {
      bytes_ += bytes;
      return;
    }
    Flush();
    host_off_ = host_offset;
    dev_off_ = device_offset;
    bytes_ = bytes;
  }

  void Flush() {
    if (bytes_ == 0) return;
    if (direction_ == CopyDirection::kHostToDevice) {
      std::memcpy(device_ + dev_off_, host_ + host_off_, bytes_);
    } else {
      std::memcpy(host_ + host_off_, device_ + dev_off_, bytes_);
    }
    bytes_ = 0;
  }

 private:
  uint8_t* const host_;
  uint8_t* const device_;
  const CopyDirection direction_;
  const bool coalesce_;
  uint64_t host_off_ = 0;
  uint64_t dev_off_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace

void CopyLayerSlice(const CopyTask& task, uint32_t layer, uint64_t token_begin,
                    uint64_t token_end) {
  const PoolGeometry& g = task.geometry;
  const uint32_t chunks = g.chunks_per_row();
  const uint64_t chunk_bytes = g.chunk_bytes();
  const bool coalesce = task.mechanism == CopyMechanism::kDirect;
  // The run holding token_begin.
  const size_t first_run =
      std::upper_bound(task.run_starts.begin(), task.run_starts.end(),
                       token_begin) -
      task.run_starts.begin() - 1;
  for (uint32_t kv = 0; kv < g.kv_planes(); ++kv) {
    SliceCopier copier(task.host_base, task.layers[layer].plane[kv],
                       task.direction, coalesce);
    for (size_t r = first_run; r < task.runs.size(); ++r) {
      const uint64_t run_start = task.run_starts[r];
      if (run_start >= token_end) break;
      const TokenRun& run = task.runs[r];
      const uint64_t begin = std::max(token_begin, run_start) - run_start;
      const uint64_t end =
          std::min(token_end, run_start + run.num_tokens) - run_start;
      for (uint64_t i = begin; i < end; ++i) {
        for (uint32_t c = 0; c < chunks; ++c) {
          copier.Add(HostChunkOffset(g, kv, layer, run.host_token + i, c),
                     DeviceChunkOffset(g, run.device_token + i, c),
                     chunk_bytes);
        }
      }
    }
  }
}

}  // namespace hostkv
