#include "server/cuda/cuda_transfer.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/copy_plan.h"
#include "kernels/cuda/copy_kernels.h"
#include "kernels/cuda/driver_api.h"
#include "kernels/kernel_copy_plan.h"
#include "proto/contract/status_macros.h"

namespace hostkv {
namespace {

// Set once the driver turns cudaMemcpyBatchAsync down (older than 12.8).
std::atomic<bool> batch_unsupported{false};

// Copy-engine path for one layer: every coalesced piece of every plane in
// one batched call (per-piece cudaMemcpyAsync when batches are unsupported).
absl::Status EnqueueLayerDma(const TransferOp& op, uint32_t layer,
                             uint8_t* pool_device_base,
                             const CudaTransferOptions& options,
                             cudaStream_t stream) {
  const CopyTask& task = op.task;
  const uint64_t pin_chunk_bytes = options.pin_chunk_bytes;
  // Where the device cannot use CPU addresses of registered memory, the
  // copies name the pool through its device mapping.
  uint8_t* const host_base =
      options.dma_through_device_base ? pool_device_base : task.host_base;
  if (host_base == nullptr) {
    return absl::FailedPreconditionError(
        "this device cannot use host pointers for registered memory and the "
        "pool has no single device address range");
  }
  const bool to_device = task.direction == CopyDirection::kHostToDevice;
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (uint32_t kv = 0; kv < task.geometry.kv_planes(); ++kv) {
    uint8_t* device = task.layers[layer].plane[kv];
    ForEachPiece(task, layer, kv, 0, task.total_tokens,
                 [&](const CopyPiece& piece) {
                   // Cut where one pinned registration ends and the next
                   // begins: a copy must lie within one.
                   uint64_t host = piece.host;
                   uint64_t dev = piece.device;
                   uint64_t left = piece.bytes;
                   while (left > 0) {
                     uint64_t n = left;
                     if (pin_chunk_bytes != 0) {
                       n = std::min(n, pin_chunk_bytes - host % pin_chunk_bytes);
                     }
                     uint8_t* host_ptr = host_base + host;
                     uint8_t* device_ptr = device + dev;
                     dsts.push_back(to_device ? device_ptr : host_ptr);
                     srcs.push_back(to_device ? host_ptr : device_ptr);
                     sizes.push_back(n);
                     host += n;
                     dev += n;
                     left -= n;
                   }
                 });
  }
  if (dsts.empty()) return absl::OkStatus();
  if (!batch_unsupported.load(std::memory_order_relaxed)) {
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attrs.flags = options.prefer_overlap ? cudaMemcpyFlagPreferOverlapWithCompute
                                         : cudaMemcpyFlagDefault;
    size_t attrs_index = 0;
    const cudaError_t error = cudaMemcpyBatchAsync(
        dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attrs,
        &attrs_index, 1, stream);
    if (error == cudaSuccess) return absl::OkStatus();
    if (error != cudaErrorNotSupported &&
        error != cudaErrorCallRequiresNewerDriver) {
      return CudaStatus(error, absl::StrCat("cudaMemcpyBatchAsync of layer ",
                                            layer, " (", dsts.size(),
                                            " copies)"));
    }
    cudaGetLastError();
    batch_unsupported.store(true, std::memory_order_relaxed);
  }
  for (size_t i = 0; i < dsts.size(); ++i) {
    const cudaError_t error = cudaMemcpyAsync(dsts[i], srcs[i], sizes[i],
                                              cudaMemcpyDefault, stream);
    if (error != cudaSuccess) {
      return CudaStatus(error, absl::StrCat("cudaMemcpyAsync of layer ", layer));
    }
  }
  return absl::OkStatus();
}

// The kernel's token index in device memory for one operation: uploaded
// once from the pinned block (stream-ordered allocation, freed on the stream
// after the last layer), so that the layers do not each read it over PCIe.
// Falls back to reading the pinned block through UVA when the device has no
// stream-ordered allocator.
class DeviceTokenIndex {
 public:
  DeviceTokenIndex(const PinnedBlock& block, uint64_t bytes,
                   cudaStream_t stream)
      : stream_(stream), tokens_(reinterpret_cast<const uint64_t*>(block.device)) {
    void* device = nullptr;
    if (cudaMallocAsync(&device, bytes, stream) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (cudaMemcpyAsync(device, block.host, bytes, cudaMemcpyHostToDevice,
                        stream) != cudaSuccess) {
      cudaGetLastError();
      cudaFreeAsync(device, stream);
      return;
    }
    device_ = device;
    tokens_ = static_cast<const uint64_t*>(device);
  }
  ~DeviceTokenIndex() {
    if (device_ != nullptr) cudaFreeAsync(device_, stream_);
  }
  DeviceTokenIndex(const DeviceTokenIndex&) = delete;
  DeviceTokenIndex& operator=(const DeviceTokenIndex&) = delete;
  const uint64_t* tokens() const { return tokens_; }

 private:
  const cudaStream_t stream_;
  void* device_ = nullptr;
  const uint64_t* tokens_;
};

// Kernel path: one launch per layer, reading the token index `tokens`
// (host slots, then device slots) from device memory.
absl::Status EnqueueLayerKernel(const TransferOp& op, uint32_t layer,
                                uint8_t* pool_device_base,
                                const uint64_t* tokens, unsigned blocks,
                                cudaStream_t stream) {
  const uint64_t n = op.task.total_tokens;
  if (n == 0) return absl::OkStatus();
  if (pool_device_base == nullptr) {
    return absl::FailedPreconditionError(
        "the pool has no device address for copy kernels");
  }
  KernelCopyArgs args{};
  args.geometry = op.task.geometry;
  args.host_base = pool_device_base;
  args.device_plane[0] = op.task.layers[layer].plane[0];
  args.device_plane[1] = op.task.layers[layer].plane[1];
  args.host_tokens = tokens;
  args.device_tokens = tokens + n;
  args.num_tokens = n;
  args.layer = layer;
  args.direction = op.task.direction;
  return CudaStatus(
      static_cast<cudaError_t>(LaunchLayerCopyKernel(args, blocks, stream)),
      absl::StrCat("copy kernel of layer ", layer));
}

// Writes op.signal_value into the word of `layer`, on the import's stream.
absl::Status SignalLayer(const DriverApi& api, const TransferOp& op,
                         CudaImportState& gpu, uint32_t layer) {
  return DriverStatus(
      api.stream_write_value64(
          reinterpret_cast<CUstream>(gpu.stream()),
          reinterpret_cast<CUdeviceptr>(gpu.signal_words() + layer),
          op.signal_value, CU_STREAM_WRITE_VALUE_DEFAULT),
      absl::StrCat("signalling layer ", layer));
}

}  // namespace

absl::Status FillTokenIndex(const CopyTask& task, const PinnedBlock& block) {
  const uint64_t n = task.total_tokens;
  if (block.bytes < 2 * n * sizeof(uint64_t)) {
    return absl::InternalError("token index block too small");
  }
  uint64_t* host_tokens = reinterpret_cast<uint64_t*>(block.host);
  ExpandTokenIndex(task.runs, host_tokens, host_tokens + n);
  return absl::OkStatus();
}

absl::Status SignalLayers(const TransferOp& op, CudaImportState& gpu) {
  if (!gpu.has_signals()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  absl::Status status;
  for (uint32_t layer = op.layer_begin; layer < op.layer_end; ++layer) {
    const absl::Status s = SignalLayer(*api, op, gpu, layer);
    if (status.ok()) status = s;
  }
  return status;
}

absl::Status EnqueueTransfer(const TransferOp& op, CudaImportState& gpu,
                             uint8_t* pool_device_base,
                             const PinnedBlock* token_index,
                             const CudaTransferOptions& options) {
  const cudaStream_t stream = gpu.stream();
  const DriverApi* api = nullptr;
  if (gpu.has_signals()) {
    absl::StatusOr<const DriverApi*> loaded = GetDriverApi();
    if (!loaded.ok()) return loaded.status();
    api = *loaded;
  }
  absl::Status status;
  // Loads wait too: the engine's mark then says its compute stream no
  // longer reads the slots this load overwrites.
  if (api != nullptr && op.wait_kv_written != 0) {
    status = DriverStatus(
        api->stream_wait_value64(
            reinterpret_cast<CUstream>(stream),
            reinterpret_cast<CUdeviceptr>(gpu.kv_word_device()),
            op.wait_kv_written, CU_STREAM_WAIT_VALUE_GEQ),
        "waiting for the engine's mark");
  }
  const bool kernel = op.task.mechanism == CopyMechanism::kKernel;
  if (status.ok() && kernel && token_index == nullptr) {
    status = absl::InternalError("a kernel copy without its token index");
  }
  std::optional<DeviceTokenIndex> tokens;
  if (status.ok() && kernel && op.task.total_tokens > 0) {
    tokens.emplace(*token_index, 2 * op.task.total_tokens * sizeof(uint64_t),
                   stream);
  }
  for (uint32_t layer = op.layer_begin; layer < op.layer_end; ++layer) {
    if (status.ok()) {
      status = kernel ? EnqueueLayerKernel(
                            op, layer, pool_device_base,
                            tokens.has_value() ? tokens->tokens() : nullptr,
                            options.kernel_blocks, stream)
                      : EnqueueLayerDma(op, layer, pool_device_base, options,
                                        stream);
    }
    if (api != nullptr) {
      // Signalled even after a failure: an engine stream waiting for this
      // layer must not hang; the failure reaches the client through the
      // operation's signal record.
      const absl::Status signalled = SignalLayer(*api, op, gpu, layer);
      if (status.ok()) status = signalled;
    }
    if (status.ok() && options.after_layer) options.after_layer(layer);
  }
  return status;
}

}  // namespace hostkv
