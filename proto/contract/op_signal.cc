#include "proto/contract/op_signal.h"

#include "absl/strings/str_cat.h"
#include "proto/contract/command_ring.h"

namespace hostkv {

void BeginOpSignal(OpSignal& signal, uint64_t op_id) {
  signal.op_id.store(op_id, std::memory_order_seq_cst);
  signal.progress.store(0, std::memory_order_seq_cst);
}

void PublishLayersDone(OpSignal& signal, uint32_t layers_done) {
  // Monotonic: layers may be reported by several threads out of order.
  uint32_t current = signal.progress.load(std::memory_order_seq_cst);
  while (current < layers_done &&
         !signal.progress.compare_exchange_weak(current, layers_done,
                                                std::memory_order_seq_cst)) {
  }
  FutexWakeShared(&signal.progress);
}

void PublishFailure(OpSignal& signal) {
  signal.progress.fetch_or(OpSignal::kFailedBit, std::memory_order_seq_cst);
  FutexWakeShared(&signal.progress);
}

absl::Status WaitForLayers(const OpSignal& signal, uint64_t op_id,
                           uint32_t layers, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // Read progress before op_id: if op_id is still ours afterwards, the
    // progress value belongs to our operation (see BeginOpSignal's order).
    const uint32_t progress = signal.progress.load(std::memory_order_seq_cst);
    if (signal.op_id.load(std::memory_order_seq_cst) != op_id) {
      return absl::OkStatus();
    }
    if (progress & OpSignal::kFailedBit) {
      return absl::AbortedError(
          absl::StrCat("operation ", op_id, " was abandoned by the daemon after ",
                       progress & ~OpSignal::kFailedBit, " layers"));
    }
    if (progress >= layers) return absl::OkStatus();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("operation ", op_id, ": ", progress, " of ", layers,
                       " layers done when the wait timed out"));
    }
    FutexWaitShared(&signal.progress, progress, left);
  }
}

}  // namespace hostkv
