#include "kernels/copy_plan.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

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

// Copies (host offset, device offset) pieces. Pieces wait in a short queue whose sources are prefetched when they enter
// it: scattered small pieces (page_head rows, page_first rows) would
// otherwise stall on one cache miss at a time.
class SliceCopier {
 public:
  SliceCopier(uint8_t* host, uint8_t* device, CopyDirection direction)
      : host_(host), device_(device), direction_(direction) {}
  // Trivially destructible, and the caller flushes: a fault guard
  // (kernels/fault_guard.h) may abandon a copy in the middle, skipping the
  // frames rather than unwinding them.

  void Add(uint64_t host_offset, uint64_t device_offset, uint64_t bytes) {
    if (size_ == kDepth) CopyOldest();
    queue_[(head_ + size_) % kDepth] = {host_offset, device_offset, bytes};
    ++size_;
    Prefetch(Source(host_offset, device_offset), bytes);
  }

  void Flush() {
    while (size_ != 0) CopyOldest();
  }

 private:
  struct Piece {
    uint64_t host;
    uint64_t device;
    uint64_t bytes;
  };
  static constexpr uint32_t kDepth = 8;
  static constexpr uint64_t kMaxPrefetchBytes = 512;

  const uint8_t* Source(uint64_t host_offset, uint64_t device_offset) const {
    return direction_ == CopyDirection::kHostToDevice ? host_ + host_offset
                                                      : device_ + device_offset;
  }
  static void Prefetch(const uint8_t* p, uint64_t bytes) {
    const uint64_t n = std::min(bytes, kMaxPrefetchBytes);
    for (uint64_t off = 0; off < n; off += 64) __builtin_prefetch(p + off);
  }
  void CopyOldest() {
    const Piece& p = queue_[head_];
    if (direction_ == CopyDirection::kHostToDevice) {
      std::memcpy(device_ + p.device, host_ + p.host, p.bytes);
    } else {
      std::memcpy(host_ + p.host, device_ + p.device, p.bytes);
    }
    head_ = (head_ + 1) % kDepth;
    --size_;
  }

  uint8_t* const host_;
  uint8_t* const device_;
  const CopyDirection direction_;
  Piece queue_[kDepth];
  uint32_t head_ = 0;
  uint32_t size_ = 0;
};

static_assert(std::is_trivially_destructible_v<SliceCopier>,
              "guarded copies are abandoned, not unwound");

}  // namespace

size_t RunAt(const CopyTask& task, uint64_t token) {
  return std::upper_bound(task.run_starts.begin(), task.run_starts.end(),
                          token) -
         task.run_starts.begin() - 1;
}

std::vector<CopyPiece> LayerPieces(const CopyTask& task, uint32_t layer,
                                   uint32_t kv) {
  std::vector<CopyPiece> pieces;
  ForEachPiece(task, layer, kv, 0, task.total_tokens,
               [&pieces](const CopyPiece& piece) { pieces.push_back(piece); });
  return pieces;
}

void CopyLayerSlice(const CopyTask& task, uint32_t layer, uint64_t token_begin,
                    uint64_t token_end) {
  for (uint32_t kv = 0; kv < task.geometry.kv_planes(); ++kv) {
    // The pieces come coalesced, whatever the mechanism: on the CPU it
    // names no different hardware.
    SliceCopier copier(task.host_base, task.layers[layer].plane[kv],
                       task.direction);
    ForEachPiece(task, layer, kv, token_begin, token_end,
                 [&copier](const CopyPiece& piece) {
                   copier.Add(piece.host, piece.device, piece.bytes);
                 },
                 Coalesce::kAlways);
    copier.Flush();
  }
}

}  // namespace hostkv
