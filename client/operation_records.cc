#include "client/operation_records.h"

#include <algorithm>

#include "proto/contract/op_signal.h"

namespace hostkv {
namespace {

// Operations kept for a resume before the finished ones are dropped (a
// daemon has at most signal_slots of a session's in flight).
constexpr size_t kPruneAt = 256;
constexpr size_t kReplacementsKept = 4096;
// Ids made up for a daemon that sends none (random ids are never this high
// in practice; they only need to differ from each other here).
constexpr uint64_t kMadeUpIds = uint64_t{1} << 63;

}  // namespace

void OperationRecords::UseSegment(SignalRecords records) {
  absl::MutexLock lock(&mu_);
  if (records.id == 0) records.id = kMadeUpIds + ++made_up_;
  current_ = records.id;
  segments_[records.id] =
      std::make_shared<const SignalRecords>(std::move(records));
}

uint64_t OperationRecords::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

std::shared_ptr<const SignalRecords> OperationRecords::Segment(
    uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = segments_.find(id == 0 ? current_ : id);
  return it == segments_.end() ? nullptr : it->second;
}

void OperationRecords::Track(SubmittedOp op) {
  std::vector<Operation> kept;
  {
    absl::MutexLock lock(&mu_);
    outstanding_[KeyOf(op.op)] = std::move(op);
    if (outstanding_.size() < kPruneAt) return;
    kept.reserve(outstanding_.size());
    for (const auto& [key, submitted] : outstanding_) kept.push_back(submitted.op);
  }
  // Outside the lock: Ended takes it.
  std::vector<Key> done;
  for (const Operation& o : kept) {
    if (Ended(o)) done.push_back(KeyOf(o));
  }
  absl::MutexLock lock(&mu_);
  for (const Key& key : done) outstanding_.erase(key);
}

std::vector<SubmittedOp> OperationRecords::TakeOutstanding() {
  absl::MutexLock lock(&mu_);
  std::vector<SubmittedOp> ops;
  ops.reserve(outstanding_.size());
  for (auto& [key, op] : outstanding_) ops.push_back(std::move(op));
  outstanding_.clear();
  return ops;
}

std::optional<absl::StatusOr<Operation>> OperationRecords::Replacement(
    const Operation& op) const {
  absl::MutexLock lock(&mu_);
  auto it = replacements_.find(KeyOf(op));
  if (it == replacements_.end()) return std::nullopt;
  return it->second;
}

void OperationRecords::Replace(const Operation& op,
                               absl::StatusOr<Operation> replacement) {
  absl::MutexLock lock(&mu_);
  if (replacements_.insert_or_assign(KeyOf(op), std::move(replacement))
          .second) {
    replacement_order_.push_back(KeyOf(op));
  }
  if (replacement_order_.size() > kReplacementsKept) {
    const size_t drop = replacement_order_.size() - kReplacementsKept;
    for (size_t i = 0; i < drop; ++i)
      replacements_.erase(replacement_order_[i]);
    replacement_order_.erase(replacement_order_.begin(),
                             replacement_order_.begin() + drop);
  }
}

bool OperationRecords::Ended(const Operation& op, uint32_t layers) const {
  std::shared_ptr<const SignalRecords> records = Segment(op.signal_segment);
  if (records == nullptr || op.signal_segment == 0 ||
      op.signal_index >= records->slots) {
    return false;
  }
  const OpSignal& signal = reinterpret_cast<const OpSignal*>(
      records->segment.data())[op.signal_index];
  const absl::Status s =
      WaitForLayers(signal, op.op_id, layers == 0 ? op.num_layers : layers,
                    absl::ZeroDuration());
  return s.ok() || absl::IsAborted(s);
}

}  // namespace hostkv
