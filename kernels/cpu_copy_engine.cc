#include "kernels/cpu_copy_engine.h"

#include <algorithm>
#include <atomic>
#include <vector>

namespace hostkv {
namespace {

// Below this many bytes per shard, waking another thread costs more than it
// saves.
constexpr uint64_t kMinShardBytes = 256 * 1024;

// How many workers one layer of `task` is worth.
uint64_t ShardsFor(const CopyTask& task, size_t threads) {
  const uint64_t tokens = task.total_tokens;
  const uint64_t layer_bytes =
      tokens * task.geometry.token_stride() * task.geometry.kv_planes();
  return std::max<uint64_t>(
      1, std::min<uint64_t>({threads, layer_bytes / kMinShardBytes, tokens}));
}

}  // namespace

void CpuCopyEngine::CopyLayers(
    const CopyTask& task, uint32_t layer_begin, uint32_t layer_end,
    const std::function<bool()>& keep_going,
    const std::function<void(uint32_t)>& layer_done) const {
  const uint64_t tokens = task.total_tokens;
  const uint64_t shards = ShardsFor(task, workers_->num_threads());
  std::vector<std::atomic<uint32_t>> remaining(layer_end - layer_begin);
  for (auto& r : remaining) r.store(static_cast<uint32_t>(shards));
  workers_->ParallelFor(shards, [&](size_t shard) {
    const uint64_t begin = tokens * shard / shards;
    const uint64_t end = tokens * (shard + 1) / shards;
    for (uint32_t layer = layer_begin; layer < layer_end; ++layer) {
      if (!keep_going()) return;
      if (begin < end) CopyLayerSlice(task, layer, begin, end);
      if (remaining[layer - layer_begin].fetch_sub(1) == 1) layer_done(layer);
    }
  });
}

void CpuCopyEngine::CopyLayer(const CopyTask& task, uint32_t layer) const {
  const uint64_t tokens = task.total_tokens;
  if (tokens == 0) return;
  const uint64_t shards = ShardsFor(task, workers_->num_threads());
  workers_->ParallelFor(shards, [&](size_t shard) {
    const uint64_t begin = tokens * shard / shards;
    const uint64_t end = tokens * (shard + 1) / shards;
    CopyLayerSlice(task, layer, begin, end);
  });
}

}  // namespace hostkv
