#include "kernels/cpu_copy_engine.h"

#include <algorithm>

namespace hostkv {
namespace {

// Below this many bytes per shard, waking another thread costs more than it
// saves.
constexpr uint64_t kMinShardBytes = 256 * 1024;

}  // namespace

void CpuCopyEngine::CopyLayer(const CopyTask& task, uint32_t layer) const {
  const uint64_t tokens = task.total_tokens;
  if (tokens == 0) return;
  const uint64_t layer_bytes =
      tokens * task.geometry.token_stride() * task.geometry.kv_planes();
  const uint64_t shards = std::max<uint64_t>(
      1, std::min<uint64_t>({workers_->num_threads(),
                             layer_bytes / kMinShardBytes, tokens}));
  workers_->ParallelFor(shards, [&](size_t shard) {
    const uint64_t begin = tokens * shard / shards;
    const uint64_t end = tokens * (shard + 1) / shards;
    CopyLayerSlice(task, layer, begin, end);
  });
}

}  // namespace hostkv
