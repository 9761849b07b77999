// Runs loads and backups in the background. Each session (TransferOp::owner)
// has its own queue, run in its submission order; the sessions take turns
// (round-robin), and a session whose next operation is a load goes ahead of
// sessions whose next is a backup (loads are on the engine's critical path).
// CPU imports: one slice of a few layers at a time, each layer spread over
// the copy threads and signalled as soon as it is copied; between slices
// another session may be served, so one huge operation holds the others for
// one slice at most. CUDA imports: handed to the GPU backend, which enqueues
// them on the import's stream and returns; a CPU operation of a session
// waits for that session's GPU operations first.
#ifndef HOSTKV_SERVER_TRANSFER_TRANSFER_ENGINE_H_
#define HOSTKV_SERVER_TRANSFER_TRANSFER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/copy_plan.h"
#include "kernels/cpu_copy_engine.h"
#include "kernels/worker_pool.h"
#include "server/operations/daemon_metrics.h"
#include "server/transfer/device_import.h"
#include "server/transfer/gpu_backend.h"
#include "server/pool/host_pool.h"
#include "server/sessions/signal_board.h"

namespace hostkv {

// Everything one operation needs; holds its pool, import and signal board
// alive until it finishes.
struct TransferOp {
  uint64_t op_id = 0;
  OwnerTag owner = kNoOwner;  // the submitting session
  PinnedPages host_pages;     // released before the last layer is signalled
  std::shared_ptr<DeviceImport> import;
  std::shared_ptr<SignalBoard> signals;
  uint32_t signal_index = 0;
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;
  absl::Time submitted;
  uint64_t bytes = 0;
  CopyTask task;
  // CUDA imports: the value the import's GPU signal words take after each
  // layer (0 on submission: Submit assigns the next one; else the client's,
  // which Submit claims), and the "KV written" value a transfer waits for.
  uint64_t signal_value = 0;
  uint64_t wait_kv_written = 0;
  // Publish each layer's progress to the signal record as it is copied
  // (false: only at the end; TransferRequest.gpu_waits_only, CUDA imports
  // with signal words, and TransferRequest.progress_at_end, any import).
  bool host_layer_progress = true;
};

// Ends an operation: unpins its pages, drops it (and with it the import and
// pool, so a client that sees the end finds the daemon done with its
// buffers), then marks its signal record finished (or failed).
void FinishOp(std::unique_ptr<TransferOp> op, bool failed);

struct TransferEngineOptions {
  // A CPU operation runs in slices of whole layers of about this many bytes
  // (at least one layer); between slices the dispatcher may serve another
  // session.
  uint64_t slice_bytes = 64ull << 20;
  // A session whose next operation is a backup waits for at most this many
  // slices or operations of loads of other sessions before it is served
  // anyway (loads go first, backups are not starved).
  uint32_t max_loads_ahead = 8;
  // false: one queue for all sessions in submission order, each operation
  // whole (the engine before fair scheduling), as a benchmark's baseline.
  bool fair = true;
  // Called with each operation the engine finishes itself (not those the
  // GPU backend finishes), just before FinishOp, on the finishing thread.
  // For tests and tracing; may be empty.
  std::function<void(const TransferOp& op, bool failed)> on_finish;
};

// Thread-safe.
class TransferEngine {
 public:
  // `metrics` and `gpu` may be null.
  TransferEngine(unsigned copy_threads, DaemonMetrics* metrics,
                 GpuBackend* gpu = nullptr,
                 TransferEngineOptions options = TransferEngineOptions());
  ~TransferEngine();  // Drains, then stops.

  // Enqueues `op` and returns its signal_value: for a CUDA import with
  // signal words op->signal_value if set (claimed, in this session's queue
  // order, so the words never decrease), else the import's next value; 0
  // for other imports. On error nothing is enqueued and the op's record is
  // finished as failed: Unavailable once shutting down; InvalidArgument if
  // op->signal_value is set and the import has no signal words, or the
  // value is not above the import's last or exceeds kMaxSignalValue;
  // FailedPrecondition if the import's values are used up.
  absl::StatusOr<uint64_t> Submit(std::unique_ptr<TransferOp> op)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The session `owner` is ending: finishes each of its queued CPU
  // operations as failed at once, and stops the one in progress, if any, at
  // its next layer (it then finishes as failed too). Its queued CUDA
  // operations stay: their signal values are promised to the engine's
  // stream, and the GPU backend lets an ended session's operations through
  // without copying. Returns how many operations it finished.
  size_t Abandon(OwnerTag owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Finishes the queued operations, then stops accepting new ones.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A queued operation and how far its CPU copy has come.
  struct Pending {
    std::unique_ptr<TransferOp> op;
    uint32_t next_layer = 0;  // the first layer of the next slice
    absl::Time started;       // when its first slice started
    uint64_t seq = 0;         // submission order across sessions
  };

  // FinishOp, after telling options_.on_finish.
  void Finish(std::unique_ptr<TransferOp> op, bool failed);

  // Sets op.signal_value as Submit describes. Under mu_: the values follow
  // the queue order.
  absl::Status AssignSignalValue(TransferOp& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void DispatchLoop();
  // Takes the next operation to serve (round-robin, loads first); nullopt
  // once stopping and drained.
  std::optional<Pending> Next() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs one step of `pending`: hands a CUDA op to the backend, or copies
  // the next slice of a CPU op. Returns it if it has slices left.
  std::optional<Pending> Step(Pending pending);
  // Copies layers [pending.next_layer, slice_end) of a CPU op. Returns true
  // once its last layer is copied, false while layers are left, and an
  // error if it failed (abandoned, or its device memory vanished).
  absl::StatusOr<bool> RunSlice(Pending& pending, uint32_t slice_end);
  uint32_t SliceEnd(const Pending& pending) const;
  // Puts an unfinished `pending` back at the head of its session's queue.
  void Requeue(Pending pending) ABSL_LOCKS_EXCLUDED(mu_);

  const TransferEngineOptions options_;
  DaemonMetrics* const metrics_;
  GpuBackend* const gpu_;
  WorkerPool workers_;
  CpuCopyEngine copier_;
  // Set by Abandon for the session of the slice in progress.
  std::atomic<bool> abandon_running_{false};

  mutable absl::Mutex mu_;
  // Only sessions with queued operations; each in submission order.
  std::map<OwnerTag, std::deque<Pending>> queues_ ABSL_GUARDED_BY(mu_);
  // Each session of queues_ once, the next to be served first.
  std::deque<OwnerTag> turns_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_ops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Loads served in a row while a backup waited at the head of turns_.
  uint32_t loads_ahead_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The session whose operation the dispatcher holds outside the queues.
  std::optional<OwnerTag> running_ ABSL_GUARDED_BY(mu_);
  std::thread dispatcher_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TRANSFER_TRANSFER_ENGINE_H_
