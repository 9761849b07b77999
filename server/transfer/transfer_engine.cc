#include "server/transfer/transfer_engine.h"

#include <algorithm>
#include <string>
#include <utility>

#include "proto/contract/status_macros.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

bool IsLoad(const TransferOp& op) {
  return op.task.direction == CopyDirection::kHostToDevice;
}

}  // namespace

void FinishOp(std::unique_ptr<TransferOp> op, bool failed) {
  op->host_pages.Release();
  std::shared_ptr<SignalBoard> signals = std::move(op->signals);
  const uint32_t index = op->signal_index;
  op.reset();
  signals->Finish(index, failed);
}

void TransferEngine::Finish(std::unique_ptr<TransferOp> op, bool failed) {
  if (options_.on_finish) options_.on_finish(*op, failed);
  FinishOp(std::move(op), failed);
}

TransferEngine::TransferEngine(unsigned copy_threads, DaemonMetrics* metrics,
                               GpuBackend* gpu, TransferEngineOptions options)
    : options_(options),
      metrics_(metrics),
      gpu_(gpu),
      workers_(copy_threads == 0 ? 1 : copy_threads),
      copier_(&workers_),
      dispatcher_([this] { DispatchLoop(); }) {}

TransferEngine::~TransferEngine() {
  Drain();
  dispatcher_.join();
}

absl::Status TransferEngine::AssignSignalValue(TransferOp& op) {
  GpuImportState* gpu = op.import->gpu();
  if (gpu == nullptr || !gpu->has_signals()) {
    if (op.signal_value == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "signal_value needs a CUDA import registered with gpu_signals");
  }
  if (op.signal_value != 0) return gpu->ClaimSignalValue(op.signal_value);
  ASSIGN_OR_RETURN(op.signal_value, gpu->NextSignalValue());
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> TransferEngine::Submit(
    std::unique_ptr<TransferOp> op) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    // Assigned under the queue's lock: values follow the session's queue
    // order (an import belongs to one session), which is the order of the
    // import's stream, so the words never decrease.
    refused = stopping_ ? absl::UnavailableError("the daemon is shutting down")
                        : AssignSignalValue(*op);
    if (refused.ok()) {
      const uint64_t signal_value = op->signal_value;
      const OwnerTag owner = op->owner;
      Pending pending;
      pending.next_layer = op->layer_begin;
      pending.seq = next_seq_++;
      pending.op = std::move(op);
      std::deque<Pending>& queue = queues_[owner];
      if (queue.empty()) turns_.push_back(owner);
      queue.push_back(std::move(pending));
      ++queued_ops_;
      return signal_value;
    }
  }
  FinishOp(std::move(op), /*failed=*/true);
  return refused;
}

size_t TransferEngine::Abandon(OwnerTag owner) {
  std::vector<std::unique_ptr<TransferOp>> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (running_ == owner) abandon_running_.store(true);
    auto it = queues_.find(owner);
    if (it != queues_.end()) {
      std::deque<Pending> kept;  // CUDA ops (see the header)
      for (Pending& pending : it->second) {
        if (pending.op->import->gpu() != nullptr) {
          kept.push_back(std::move(pending));
        } else {
          dropped.push_back(std::move(pending.op));
        }
      }
      queued_ops_ -= dropped.size();
      if (kept.empty()) {
        queues_.erase(it);
        turns_.erase(std::find(turns_.begin(), turns_.end(), owner));
      } else {
        it->second = std::move(kept);
      }
    }
  }
  for (std::unique_ptr<TransferOp>& op : dropped) {
    spdlog::debug("op {} of session {} abandoned in the queue", op->op_id,
                  owner);
    Finish(std::move(op), /*failed=*/true);
  }
  return dropped.size();
}

void TransferEngine::Drain() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queues_.empty() && !running_.has_value();
    };
    mu_.Await(absl::Condition(&idle));
  }
  if (gpu_ != nullptr) gpu_->AwaitIdle(std::nullopt);
}

uint64_t TransferEngine::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_ops_ + (running_.has_value() ? 1 : 0);
}

void TransferEngine::DispatchLoop() {
  RunAsBatchWork();  // it copies too (WorkerPool's caller shard)
  while (std::optional<Pending> pending = Next()) {
    std::optional<Pending> rest = Step(std::move(*pending));
    if (rest.has_value()) {
      Requeue(std::move(*rest));
    } else {
      absl::MutexLock lock(&mu_);
      running_.reset();
    }
  }
}

std::optional<TransferEngine::Pending> TransferEngine::Next() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !turns_.empty() || stopping_;
  };
  mu_.Await(absl::Condition(&ready));
  if (turns_.empty()) return std::nullopt;  // stopping and drained
  // The session whose turn it is, unless its next op is a backup and
  // another session's next is a load (for a bounded number of times).
  size_t pick = 0;
  if (!options_.fair) {
    for (size_t i = 1; i < turns_.size(); ++i) {
      if (queues_.at(turns_[i]).front().seq <
          queues_.at(turns_[pick]).front().seq) {
        pick = i;
      }
    }
  } else if (!IsLoad(*queues_.at(turns_[0]).front().op) &&
             loads_ahead_ < options_.max_loads_ahead) {
    for (size_t i = 1; i < turns_.size(); ++i) {
      if (IsLoad(*queues_.at(turns_[i]).front().op)) {
        pick = i;
        break;
      }
    }
  }
  loads_ahead_ = pick == 0 ? 0 : loads_ahead_ + 1;
  const OwnerTag owner = turns_[pick];
  turns_.erase(turns_.begin() + static_cast<std::ptrdiff_t>(pick));
  auto it = queues_.find(owner);
  Pending pending = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) {
    queues_.erase(it);
  } else {
    turns_.push_back(owner);  // its next turn comes after everyone else's
  }
  --queued_ops_;
  running_ = owner;
  abandon_running_.store(false);
  return pending;
}

void TransferEngine::Requeue(Pending pending) {
  {
    absl::MutexLock lock(&mu_);
    running_.reset();
    if (!abandon_running_.load()) {
      std::deque<Pending>& queue = queues_[pending.op->owner];
      if (queue.empty()) turns_.push_back(pending.op->owner);
      queue.push_front(std::move(pending));  // still first in its session
      ++queued_ops_;
      return;
    }
  }
  spdlog::debug("op {} abandoned between slices: its session ended",
                pending.op->op_id);
  Finish(std::move(pending.op), /*failed=*/true);
}

std::optional<TransferEngine::Pending> TransferEngine::Step(Pending pending) {
  TransferOp& op = *pending.op;
  if (op.import->gpu() != nullptr) {
    // gpu_ is never null here (CUDA imports need the backend). Ops of a
    // session that ended go too: the backend signals their layers
    // without copying, so no engine stream waits for them forever.
    if (gpu_ == nullptr) {
      Finish(std::move(pending.op), /*failed=*/true);
    } else if (absl::Status s = gpu_->Enqueue(std::move(pending.op)); !s.ok()) {
      spdlog::error("GPU transfer failed to enqueue: {}",
                    std::string(s.message()));
    }
    return std::nullopt;
  }
  if (pending.next_layer == op.layer_begin) {
    // Keeps a session's order when it mixes CUDA and CPU imports.
    if (gpu_ != nullptr) gpu_->AwaitIdle(op.owner);
    pending.started = absl::Now();
  }
  const uint32_t slice_end = SliceEnd(pending);
  absl::StatusOr<bool> done = RunSlice(pending, slice_end);
  if (!done.ok()) {
    if (done.status().code() == absl::StatusCode::kCancelled) {
      spdlog::debug("op {} abandoned: its session ended", op.op_id);
    } else {
      spdlog::warn("op {} of session {} failed: {}", op.op_id, op.owner,
                   std::string(done.status().message()));
    }
    Finish(std::move(pending.op), /*failed=*/true);
    return std::nullopt;
  }
  if (!*done) {
    pending.next_layer = slice_end;
    return pending;
  }
  if (metrics_ != nullptr) {
    // From the first slice: includes the turns other sessions took.
    metrics_->RecordTransfer(op.task.direction, op.task.mechanism, op.bytes,
                             absl::Now() - pending.started);
  }
  Finish(std::move(pending.op), /*failed=*/false);
  return std::nullopt;
}

uint32_t TransferEngine::SliceEnd(const Pending& pending) const {
  const TransferOp& op = *pending.op;
  const uint64_t layers = op.layer_end - op.layer_begin;
  const uint64_t layer_bytes = std::max<uint64_t>(1, op.bytes / layers);
  const uint64_t per_slice =
      options_.fair ? std::max<uint64_t>(1, options_.slice_bytes / layer_bytes)
                    : layers;
  return static_cast<uint32_t>(
      std::min<uint64_t>(op.layer_end, pending.next_layer + per_slice));
}

absl::StatusOr<bool> TransferEngine::RunSlice(Pending& pending,
                                              uint32_t slice_end) {
  TransferOp& op = *pending.op;
  const CopyDirection direction = op.task.direction;
  std::atomic<uint32_t> layers_done{0};
  absl::Status copied = copier_.CopyLayers(
      op.task, pending.next_layer, slice_end,
      [this, &op] {
        return !op.signals->cancelled() && !abandon_running_.load();
      },
      [&](uint32_t layer) {
        if (layer + 1 == op.layer_end) {
          // Every layer is copied. A client that sees the last layer may
          // free or read the pages at once: unpin them first.
          op.host_pages.Release();
          HostPool& pool = *op.import->pool();
          (direction == CopyDirection::kHostToDevice ? pool.completed_loads()
                                                     : pool.completed_backups())
              .fetch_add(1);
        }
        if (op.host_layer_progress || layer + 1 == op.layer_end) {
          op.signals->Publish(op.signal_index, layer - op.layer_begin + 1);
        }
        if (metrics_ != nullptr) {
          metrics_->RecordLayerReady(direction, absl::Now() - op.submitted);
        }
        layers_done.fetch_add(1);
      });
  if (!copied.ok()) return copied;
  if (layers_done.load() != slice_end - pending.next_layer) {
    return absl::CancelledError("its session ended");
  }
  return slice_end == op.layer_end;
}

}  // namespace hostkv
