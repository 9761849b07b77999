#include "server/cuda/cuda_pool_pinning.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/driver_api.h"
#include "server/pool/memory_budget.h"
#include "spdlog/spdlog.h"

namespace hostkv {

CudaPoolPinning::CudaPoolPinning(std::string pool, uint8_t* base,
                                 uint64_t bytes, std::vector<PinChunk> chunks,
                                 std::function<absl::Status()> wait_resident,
                                 std::function<void(bool ok)> done)
    : pool_(std::move(pool)),
      base_(base),
      bytes_(bytes),
      chunks_(std::move(chunks)),
      wait_resident_(std::move(wait_resident)),
      done_(std::move(done)),
      start_(absl::Now()),
      thread_([this] { Run(); }) {}

CudaPoolPinning::~CudaPoolPinning() {
  stop_.store(true);
  thread_.join();
  for (size_t i = 0; i < registered_; ++i) {
    const absl::Status s = CudaStatus(
        cudaHostUnregister(base_ + chunks_[i].offset), "cudaHostUnregister");
    if (!s.ok()) spdlog::warn("pool '{}': {}", pool_, std::string(s.message()));
  }
}

PoolPinning::Progress CudaPoolPinning::progress() const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.state = state_;
  p.pinned_bytes = pinned_bytes_;
  p.total_bytes = bytes_;
  p.elapsed = state_ == v1::PIN_PINNING ? absl::Now() - start_ : elapsed_;
  p.error = error_;
  return p;
}

uint8_t* CudaPoolPinning::FindDeviceBase(size_t registered) const {
  void* first = nullptr;
  for (size_t i = 0; i < registered; ++i) {
    void* device = nullptr;
    const absl::Status s = CudaStatus(
        cudaHostGetDevicePointer(&device, base_ + chunks_[i].offset, 0),
        "cudaHostGetDevicePointer");
    if (!s.ok()) {
      spdlog::warn("pool '{}': {}; copy kernels cannot address it", pool_,
                   std::string(s.message()));
      return nullptr;
    }
    if (i == 0) first = device;
    if (static_cast<uint8_t*>(device) !=
        static_cast<uint8_t*>(first) + chunks_[i].offset) {
      spdlog::warn("pool '{}': its chunks have scattered device addresses; "
                   "copy kernels cannot address it (DIRECT copies still can)",
                   pool_);
      return nullptr;
    }
  }
  return static_cast<uint8_t*>(first);
}

void CudaPoolPinning::Run() {
  // Portable registrations are visible to every device; register with the
  // first one current.
  ScopedDevice device(0);
  absl::Status status = device.status();
  // Registering resident memory faults nothing in: much faster than
  // cudaHostRegister's own faulting, and the fill runs on many threads.
  if (status.ok() && wait_resident_) {
    status = wait_resident_();
    if (!status.ok() && !absl::IsCancelled(status)) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "the pool's memory could not be made resident: ", status.message()));
    }
  }
  for (size_t i = 0; status.ok() && i < chunks_.size(); ++i) {
    if (stop_.load()) {
      status = absl::CancelledError("the pool was deleted while pinning");
      break;
    }
    const PinChunk& chunk = chunks_[i];
    status = CudaStatus(
        cudaHostRegister(base_ + chunk.offset, chunk.bytes,
                         cudaHostRegisterPortable | cudaHostRegisterMapped),
        absl::StrCat("cudaHostRegister of chunk ", i, " (", chunk.bytes,
                     " bytes at offset ", chunk.offset, ")"));
    if (!status.ok()) break;
    registered_ = i + 1;
    absl::MutexLock lock(&mu_);
    pinned_bytes_ += chunk.bytes;
  }
  if (status.ok()) device_base_.store(FindDeviceBase(registered_));
  const absl::Duration elapsed = absl::Now() - start_;
  {
    absl::MutexLock lock(&mu_);
    elapsed_ = elapsed;
    state_ = status.ok() ? v1::PIN_PINNED : v1::PIN_FAILED;
    error_ = std::string(status.message());
  }
  if (status.ok()) {
    spdlog::info("pool '{}' pinned: {} in {} chunks in {} ({:.1f} GB/s)",
                 pool_, FormatBytes(bytes_), chunks_.size(),
                 absl::FormatDuration(elapsed),
                 static_cast<double>(bytes_) / 1e9 /
                     std::max(absl::ToDoubleSeconds(elapsed), 1e-9));
  } else if (!absl::IsCancelled(status)) {
    spdlog::error("pool '{}': pinning failed: {}", pool_, std::string(status.message()));
  }
  if (done_) done_(status.ok());
}

}  // namespace hostkv
