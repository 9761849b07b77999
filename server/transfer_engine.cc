#include "server/transfer_engine.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace hostkv {

void FinishOp(std::unique_ptr<TransferOp> op, bool failed) {
  op->host_pages.Release();
  std::shared_ptr<SignalBoard> signals = std::move(op->signals);
  const uint32_t index = op->signal_index;
  op.reset();
  signals->Finish(index, failed);
}

TransferEngine::TransferEngine(unsigned copy_threads, DaemonMetrics* metrics,
                               GpuBackend* gpu)
    : metrics_(metrics),
      gpu_(gpu),
      workers_(copy_threads == 0 ? 1 : copy_threads),
      copier_(&workers_),
      dispatcher_([this] { DispatchLoop(); }) {}

TransferEngine::~TransferEngine() {
  Drain();
  dispatcher_.join();
}

absl::StatusOr<uint64_t> TransferEngine::Submit(
    std::unique_ptr<TransferOp> op) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    FinishOp(std::move(op), /*failed=*/true);
    return absl::UnavailableError("the daemon is shutting down");
  }
  // Assigned under the queue's lock: values follow the queue order, which
  // is the order of the import's stream, so the words never decrease.
  GpuImportState* gpu = op->import->gpu();
  if (gpu != nullptr && gpu->has_signals()) {
    op->signal_value = gpu->NextSignalValue();
  }
  const uint64_t signal_value = op->signal_value;
  queue_.push_back(std::move(op));
  return signal_value;
}

void TransferEngine::Drain() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queue_.empty() && !running_op_;
    };
    mu_.Await(absl::Condition(&idle));
  }
  if (gpu_ != nullptr) gpu_->AwaitIdle(std::nullopt);
}

uint64_t TransferEngine::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size() + (running_op_ ? 1 : 0);
}

void TransferEngine::DispatchLoop() {
  while (true) {
    std::unique_ptr<TransferOp> op;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and drained
      op = std::move(queue_.front());
      queue_.pop_front();
      running_op_ = true;
    }
    if (op->import->gpu() != nullptr) {
      // gpu_ is never null here (CUDA imports need the backend). Ops of a
      // session that ended go too: the backend signals their layers
      // without copying, so no engine stream waits for them forever.
      if (gpu_ == nullptr) {
        FinishOp(std::move(op), /*failed=*/true);
      } else if (absl::Status s = gpu_->Enqueue(std::move(op)); !s.ok()) {
        spdlog::error("GPU transfer failed to enqueue: {}", std::string(s.message()));
      }
    } else {
      // Keeps a session's order when it mixes CUDA and CPU imports.
      if (gpu_ != nullptr) gpu_->AwaitIdle(op->owner);
      const bool completed = Run(*op);
      FinishOp(std::move(op), !completed);
    }
    absl::MutexLock lock(&mu_);
    running_op_ = false;
  }
}

bool TransferEngine::Run(TransferOp& op) {
  const absl::Time start = absl::Now();
  const CopyDirection direction = op.task.direction;
  std::atomic<bool> complete{false};
  copier_.CopyLayers(
      op.task, op.layer_begin, op.layer_end,
      [&op] { return !op.signals->cancelled(); },
      [&](uint32_t layer) {
        if (layer + 1 == op.layer_end) {
          // Every layer is copied. A client that sees the last layer may
          // free or read the pages at once: unpin them first.
          op.host_pages.Release();
          HostPool& pool = *op.import->pool();
          (direction == CopyDirection::kHostToDevice ? pool.completed_loads()
                                                     : pool.completed_backups())
              .fetch_add(1);
          complete.store(true);
        }
        op.signals->Publish(op.signal_index, layer - op.layer_begin + 1);
        if (metrics_ != nullptr) {
          metrics_->RecordLayerReady(direction, absl::Now() - op.submitted);
        }
      });
  if (!complete.load()) {
    spdlog::debug("op {} abandoned: its session ended", op.op_id);
    return false;
  }
  if (metrics_ != nullptr) {
    metrics_->RecordTransfer(direction, op.task.mechanism, op.bytes,
                             absl::Now() - start);
  }
  return true;
}

}  // namespace hostkv
