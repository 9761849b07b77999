// GpuBackend with CUDA: the devices, pool pinning, IPC imports, and the
// operations in flight on the imports' streams.
#ifndef HOSTKV_SERVER_CUDA_CUDA_BACKEND_H_
#define HOSTKV_SERVER_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/cuda/ipc_mappings.h"
#include "server/cuda/pinned_staging.h"
#include "server/transfer/gpu_backend.h"
#include "server/transfer/gpu_op_tracker.h"

namespace hostkv {

class CudaImportState;
class SignalBoard;

class CudaBackend : public GpuBackend {
 public:
  // NotFound without a usable device; FailedPrecondition if the driver
  // lacks what hostkv needs.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      const GpuBackendOptions& options);
  // Waits for every operation in flight.
  ~CudaBackend() override;

  std::string Describe() const override;
  std::string PciBusId() const override;
  std::unique_ptr<PoolPinning> StartPinning(
      const std::string& pool, uint8_t* base, uint64_t bytes, uint64_t align,
      std::function<absl::Status()> wait_resident,
      std::function<void(bool ok)> done) override;
  absl::StatusOr<std::unique_ptr<DeviceImport>> OpenImport(
      std::shared_ptr<HostPool> pool, const GpuImportSpec& spec) override;
  absl::Status Enqueue(std::unique_ptr<TransferOp> op) override
      ABSL_LOCKS_EXCLUDED(mu_, done_mu_);
  void AwaitIdle(std::optional<OwnerTag> owner) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Device {
    int ordinal;
    std::string uuid;  // 16 bytes
    std::string name;
    int major, minor;
    uint64_t memory;
    bool stream_mem_ops64;
    // cudaDevAttrCanUseHostPointerForRegisteredMem: copies may name pinned
    // host memory by its CPU address. Where 0, DMA goes through the pool's
    // device address (cudaHostGetDevicePointer) instead.
    bool host_pointer_for_registered_mem;
  };
  struct CallbackToken {
    CudaBackend* backend;
    uint64_t id;
  };
  // A per-layer host callback: publishes that `layers_done` layers of the
  // operation in record `index` of `board` are copied. The board outlives
  // it: the operation (which holds the board) is finished only by the
  // callback enqueued after this one on the same stream, or by the
  // watchdog once the context failed and no callback runs any more.
  struct LayerToken {
    SignalBoard* board;
    uint32_t index;
    uint32_t layers_done;
  };
  // The last operation a session put on a stream: a later one on another
  // stream (another import) waits for it, keeping the session's order.
  struct LastOp {
    cudaStream_t stream;
    cudaEvent_t event;
    int device;
  };

  explicit CudaBackend(const GpuBackendOptions& options);
  absl::StatusOr<int> ResolveDevice(const GpuBufferRef& ref,
                                    const std::string& where) const;
  void OrderAfterLastOp(OwnerTag owner, cudaStream_t stream)
      ABSL_LOCKS_EXCLUDED(mu_);
  void RecordLastOp(OwnerTag owner, cudaStream_t stream, int device)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The host callback: `data` is the backend, the id is queued separately
  // (cudaLaunchHostFunc takes one pointer; see Enqueue).
  static void OnStreamReached(void* token);
  static void OnLayerReached(void* token);
  void CompletionLoop() ABSL_LOCKS_EXCLUDED(done_mu_);
  // Why `op` must not be copied now (context failed, session ended, the
  // import's mark waits released); OK if it may.
  absl::Status CheckCanCopy(const TransferOp& op, const CudaImportState& gpu)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Enqueues a host callback after layer `layer` of `op` (all but its last
  // layer: Finish publishes that one), so host waiters see each layer.
  void PublishAfterLayer(const TransferOp& op, cudaStream_t stream,
                         uint32_t layer);
  void Finish(std::unique_ptr<GpuOpTracker::Entry> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The watchdog's look at one operation: releases an overdue mark wait;
  // returns the context's error if its stream reports one.
  std::string Inspect(const GpuOpTracker::Watched& watched);
  // Every second while operations are in flight, asks their streams for
  // errors. A failed CUDA context (a device fault) runs no more host
  // callbacks: its operations are then finished as failed here, new ones
  // are refused, and options_.on_fatal is told.
  void WatchdogLoop() ABSL_LOCKS_EXCLUDED(mu_, done_mu_);

  // Signal words in use by a live import, [begin, end) in the daemon's
  // mappings: two imports counting in the same words would make waits pass
  // early. Claimed at OpenImport, released when the import closes.
  absl::Status ClaimSignalWords(uintptr_t begin, uintptr_t end)
      ABSL_LOCKS_EXCLUDED(claims_mu_);
  void ReleaseSignalWords(uintptr_t begin) ABSL_LOCKS_EXCLUDED(claims_mu_);

  const GpuBackendOptions options_;
  absl::Mutex claims_mu_;
  std::map<uintptr_t, uintptr_t> claims_ ABSL_GUARDED_BY(claims_mu_);
  std::vector<Device> devices_;
  IpcMappings mappings_;
  PinnedStaging staging_;

  // The operations on streams. Lock order: tracker_'s lock before mu_.
  GpuOpTracker tracker_;
  mutable absl::Mutex mu_;
  std::string fatal_ ABSL_GUARDED_BY(mu_);  // why the context failed
  absl::flat_hash_map<OwnerTag, LastOp> last_op_ ABSL_GUARDED_BY(mu_);

  // Filled by CUDA's callback thread (which must not call CUDA).
  absl::Mutex done_mu_;
  std::deque<uint64_t> done_ ABSL_GUARDED_BY(done_mu_);
  bool stopping_ ABSL_GUARDED_BY(done_mu_) = false;
  std::thread completer_;
  std::thread watchdog_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CUDA_CUDA_BACKEND_H_
