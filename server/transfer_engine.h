// Runs loads and backups in the background, in submission order. CPU imports:
// one operation at a time, layer by layer, each layer spread over the copy
// threads and signalled as soon as it is copied. CUDA imports: handed to the
// GPU backend, which enqueues them on the import's stream and returns; a CPU
// operation of a session waits for that session's GPU operations first.
#ifndef HOSTKV_SERVER_TRANSFER_ENGINE_H_
#define HOSTKV_SERVER_TRANSFER_ENGINE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kernels/copy_plan.h"
#include "kernels/cpu_copy_engine.h"
#include "kernels/worker_pool.h"
#include "absl/time/time.h"
#include "server/daemon_metrics.h"
#include "server/device_import.h"
#include "server/gpu_backend.h"
#include "server/host_pool.h"
#include "server/signal_board.h"

namespace hostkv {

// Everything one operation needs; holds its pool, import and signal board
// alive until it finishes.
struct TransferOp {
  uint64_t op_id = 0;
  OwnerTag owner = kNoOwner;  // the submitting session
  PinnedPages host_pages;  // released before the last layer is signalled
  std::shared_ptr<DeviceImport> import;
  std::shared_ptr<SignalBoard> signals;
  uint32_t signal_index = 0;
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;
  absl::Time submitted;
  uint64_t bytes = 0;
  CopyTask task;
  // CUDA imports: the value the import's GPU signal words take after each
  // layer (assigned by Submit), and the "KV written" value a backup waits for.
  uint64_t signal_value = 0;
  uint64_t wait_kv_written = 0;
};

// Ends an operation: unpins its pages, drops it (and with it the import and
// pool, so a client that sees the end finds the daemon done with its
// buffers), then marks its signal record finished (or failed).
void FinishOp(std::unique_ptr<TransferOp> op, bool failed);

// Thread-safe.
class TransferEngine {
 public:
  // `metrics` and `gpu` may be null.
  TransferEngine(unsigned copy_threads, DaemonMetrics* metrics,
                 GpuBackend* gpu = nullptr);
  ~TransferEngine();  // Drains, then stops.

  // Enqueues `op` and returns its signal_value (0 unless it is a CUDA
  // import with signal words). Unavailable once shutting down (the op's
  // record is then finished as failed).
  absl::StatusOr<uint64_t> Submit(std::unique_ptr<TransferOp> op)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Finishes the queued operations, then stops accepting new ones.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void DispatchLoop();
  // Copies `op` on the CPU; false if it was abandoned (session ended).
  bool Run(TransferOp& op);

  DaemonMetrics* const metrics_;
  GpuBackend* const gpu_;
  WorkerPool workers_;
  CpuCopyEngine copier_;

  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<TransferOp>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool running_op_ ABSL_GUARDED_BY(mu_) = false;
  std::thread dispatcher_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TRANSFER_ENGINE_H_
