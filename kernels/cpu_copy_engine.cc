#include "kernels/cpu_copy_engine.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/fault_guard.h"
#include "kernels/host_order_copy.h"

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

// Tokens [token_begin, token_end) of layers [layer_begin, layer_end) in the
// host pool's order (a backup), in the shape RunGuarded takes.
struct HostOrderArgs {
  const CopyTask* task;
  uint32_t layer_begin;
  uint32_t layer_end;
  uint64_t token_begin;
  uint64_t token_end;
};

void CopyHostOrder(void* arg) {
  const HostOrderArgs& a = *static_cast<const HostOrderArgs*>(arg);
  CopyHostOrderSlice(*a.task, a.layer_begin, a.layer_end, a.token_begin,
                     a.token_end);
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
  // A backup of several layers of page_head or page_first writes the host
  // pool in its own order, every
  // layer of a page at once (kernels/host_order_copy.h); its layers are then
  // done together, when the last worker is. Loads go layer by layer, so that
  // the first layers are usable early.
  const bool host_order = task.direction == CopyDirection::kDeviceToHost &&
                          layer_end - layer_begin > 1 &&
                          HostOrderHelps(task.geometry);
  std::vector<std::atomic<uint32_t>> remaining(layer_end - layer_begin);
  for (auto& r : remaining) r.store(static_cast<uint32_t>(shards));
  std::atomic<bool> faulted{false};
  std::atomic<uintptr_t> fault_address{0};
  std::atomic<uint32_t> fault_layer{0};
  auto fail = [&](const GuardedFault& fault, uint32_t layer) {
    if (!faulted.exchange(true)) {
      fault_address.store(fault.address);
      fault_layer.store(layer);
    }
  };
  workers_->ParallelFor(shards, [&](size_t shard) {
    const uint64_t begin = tokens * shard / shards;
    const uint64_t end = tokens * (shard + 1) / shards;
    if (host_order) {
      // As many steps as layers, keep_going() asked before each: as often
      // as the per-layer walk asks it, for as many bytes.
      const uint64_t step =
          std::max<uint64_t>(1, (end - begin) / (layer_end - layer_begin));
      for (uint64_t t = begin; t < end; t += step) {
        if (faulted.load(std::memory_order_relaxed) || !keep_going()) return;
        HostOrderArgs args{&task, layer_begin, layer_end, t,
                           std::min(end, t + step)};
        const GuardedFault fault = RunGuarded(&CopyHostOrder, &args);
        if (fault.faulted) return fail(fault, layer_begin);
      }
      for (uint32_t layer = layer_begin; layer < layer_end; ++layer) {
        if (remaining[layer - layer_begin].fetch_sub(1) == 1) layer_done(layer);
      }
      return;
    }
    for (uint32_t layer = layer_begin; layer < layer_end; ++layer) {
      if (faulted.load(std::memory_order_relaxed) || !keep_going()) return;
      if (begin < end) {
        SliceArgs args{&task, layer, begin, end};
        const GuardedFault fault = RunGuarded(&CopySlice, &args);
        if (fault.faulted) return fail(fault, layer);
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
