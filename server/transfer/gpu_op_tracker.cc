#include "server/transfer/gpu_op_tracker.h"

#include <utility>

#include "server/transfer/device_import.h"

namespace hostkv {

void GpuOpTracker::Begin(OwnerTag owner) {
  absl::MutexLock lock(&mu_);
  ++in_flight_[owner];
  ++total_in_flight_;
}

uint64_t GpuOpTracker::Add(std::unique_ptr<Entry> entry) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = ++next_id_;
  ops_.emplace(id, std::move(entry));
  return id;
}

std::unique_ptr<GpuOpTracker::Entry> GpuOpTracker::Take(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = ops_.find(id);
  if (it == ops_.end()) return nullptr;
  std::unique_ptr<Entry> entry = std::move(it->second);
  ops_.erase(it);
  return entry;
}

std::vector<std::unique_ptr<GpuOpTracker::Entry>> GpuOpTracker::TakeAll() {
  std::vector<std::unique_ptr<Entry>> all;
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : ops_) all.push_back(std::move(entry));
  ops_.clear();
  return all;
}

std::vector<GpuOpTracker::Watched> GpuOpTracker::Watch(absl::Time now) {
  std::vector<Watched> out;
  absl::MutexLock lock(&mu_);
  out.reserve(ops_.size());
  for (const auto& [id, entry] : ops_) {
    out.push_back(Watched{id, entry->op->op_id, entry->op->import, now >= entry->wait_deadline,
                          entry->op->wait_kv_written});
  }
  return out;
}

void GpuOpTracker::End(OwnerTag owner, const std::function<void()>& on_idle) {
  absl::MutexLock lock(&mu_);
  --total_in_flight_;
  auto it = in_flight_.find(owner);
  if (it == in_flight_.end()) return;
  if (--it->second == 0) {
    in_flight_.erase(it);
    if (on_idle) on_idle();
  }
}

bool GpuOpTracker::AwaitIdle(std::optional<OwnerTag> owner,
                             absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return owner.has_value() ? !in_flight_.contains(*owner)
                             : total_in_flight_ == 0;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

size_t GpuOpTracker::size() const {
  absl::MutexLock lock(&mu_);
  return ops_.size();
}

}  // namespace hostkv
