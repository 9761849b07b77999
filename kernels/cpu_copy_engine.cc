#include "kernels/cpu_copy_engine.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/fault_guard.h"

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

// One CopyLayerSlice call, in the shape RunGuarded takes. Trivially
// destructible, like everything CopyLayerSlice holds.
struct SliceArgs {
  const CopyTask* task;
  uint32_t layer;
  uint64_t token_begin;
  uint64_t token_end;
};

void CopySlice(void* arg) {
  const SliceArgs& a = *static_cast<const SliceArgs*>(arg);
  CopyLayerSlice(*a.task, a.layer, a.token_begin, a.token_end);
}

}  // namespace

CpuCopyEngine::CpuCopyEngine(WorkerPool* workers) : workers_(workers) {
  InstallFaultHandler();
}

absl::Status CpuCopyEngine::CopyLayers(
    const CopyTask& task, uint32_t layer_begin, uint32_t layer_end,
    const std::function<bool()>& keep_going,
    const std::function<void(uint32_t)>& layer_done) const {
  const uint64_t tokens = task.total_tokens;
  const uint64_t shards = ShardsFor(task, workers_->num_threads());
  std::vector<std::atomic<uint32_t>> remaining(layer_end - layer_begin);
  for (auto& r : remaining) r.store(static_cast<uint32_t>(shards));
  std::atomic<bool> faulted{false};
  std::atomic<uintptr_t> fault_address{0};
  std::atomic<uint32_t> fault_layer{0};
  workers_->ParallelFor(shards, [&](size_t shard) {
    const uint64_t begin = tokens * shard / shards;
    const uint64_t end = tokens * (shard + 1) / shards;
    for (uint32_t layer = layer_begin; layer < layer_end; ++layer) {
      if (faulted.load(std::memory_order_relaxed) || !keep_going()) return;
      if (begin < end) {
        SliceArgs args{&task, layer, begin, end};
        const GuardedFault fault = RunGuarded(&CopySlice, &args);
        if (fault.faulted) {
          if (!faulted.exchange(true)) {
            fault_address.store(fault.address);
            fault_layer.store(layer);
          }
          return;
        }
      }
      if (remaining[layer - layer_begin].fetch_sub(1) == 1) layer_done(layer);
    }
  });
  if (faulted.load()) {
    return absl::DataLossError(absl::StrCat(
        "device buffer memory vanished under the copy (SIGBUS at 0x",
        absl::Hex(fault_address.load()), " in layer ", fault_layer.load(),
        "): a registered segment was truncated"));
  }
  return absl::OkStatus();
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
