// Puts one transfer on its import's stream: the wait for "KV written"
// (backups), then per layer the copies (SM kernel or copy-engine DMA)
// followed by the layer's signal word.
#ifndef HOSTKV_SERVER_CUDA_CUDA_TRANSFER_H_
#define HOSTKV_SERVER_CUDA_CUDA_TRANSFER_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "server/cuda/cuda_import.h"
#include "server/cuda/pinned_staging.h"
#include "server/transfer/transfer_engine.h"

namespace hostkv {

struct CudaTransferOptions {
  unsigned kernel_blocks = 0;    // 0: the kernel's default
  uint64_t pin_chunk_bytes = 0;  // PoolPinning::chunk_bytes() of the pool
  // DMA batches set cudaMemcpyFlagPreferOverlapWithCompute.
  bool prefer_overlap = true;
  // The device cannot use host pointers for registered memory
  // (cudaDevAttrCanUseHostPointerForRegisteredMem = 0): DMA names the pool
  // by its device address (pool_device_base) instead of its CPU address.
  bool dma_through_device_base = false;
  // Called on the host right after each layer's copies and signal are
  // enqueued (e.g. to enqueue a host callback that publishes the layer).
  std::function<void(uint32_t layer)> after_layer;
};

// Writes op.signal_value into every layer word of the operation, on the
// import's stream, without copying: for operations that are abandoned
// before their copies are enqueued, so that no engine stream waits for them
// forever (the failure reaches the client through the signal record).
absl::Status SignalLayers(const TransferOp& op, CudaImportState& gpu);

// Writes the kernel's token index of `task` into `block`: total_tokens host
// token slots, then total_tokens device token slots. InternalError if the
// block is too small.
absl::Status FillTokenIndex(const CopyTask& task, const PinnedBlock& block);

// Enqueues everything for `op` on gpu.stream() (the import's device must be
// current): the wait for the engine's mark (op.wait_kv_written, loads and
// backups alike), then per layer the copies and the signal word.
// `pool_device_base` is the pool as kernels address it, and
// `token_index` a block FillTokenIndex filled (both only needed for
// KERNEL); the block must stay untouched until the stream passes the
// operation. Every layer's signal word is written even when a copy fails to
// enqueue, so no engine stream waits forever; the first error is returned
// (the operation must then be reported failed).
absl::Status EnqueueTransfer(const TransferOp& op, CudaImportState& gpu,
                             uint8_t* pool_device_base,
                             const PinnedBlock* token_index,
                             const CudaTransferOptions& options);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CUDA_CUDA_TRANSFER_H_
