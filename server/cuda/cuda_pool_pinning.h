// PoolPinning with CUDA: registers a pool's memory (cudaHostRegister,
// portable + mapped) chunk by chunk on a background thread.
#ifndef HOSTKV_SERVER_CUDA_CUDA_POOL_PINNING_H_
#define HOSTKV_SERVER_CUDA_CUDA_POOL_PINNING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/transfer/gpu_backend.h"
#include "server/pool/pin_plan.h"

namespace hostkv {

class CudaPoolPinning : public PoolPinning {
 public:
  // Starts pinning `chunks` of [base, base + bytes) once `wait_resident`
  // (may be null) returned OK (GpuBackend::StartPinning).
  CudaPoolPinning(std::string pool, uint8_t* base, uint64_t bytes,
                  std::vector<PinChunk> chunks,
                  std::function<absl::Status()> wait_resident,
                  std::function<void(bool ok)> done);
  // Stops pinning, then unregisters every registered chunk.
  ~CudaPoolPinning() override;

  Progress progress() const override ABSL_LOCKS_EXCLUDED(mu_);
  uint8_t* device_base() const override { return device_base_.load(); }
  uint64_t chunk_bytes() const override {
    return chunks_.size() > 1 ? chunks_[0].bytes : 0;
  }

 private:
  void Run();
  // Finds the device address of every chunk; the pool's device base when
  // they form one range at the same offsets as the host addresses.
  uint8_t* FindDeviceBase(size_t registered) const;

  const std::string pool_;
  uint8_t* const base_;
  const uint64_t bytes_;
  const std::vector<PinChunk> chunks_;
  const std::function<absl::Status()> wait_resident_;
  const std::function<void(bool)> done_;
  const absl::Time start_;

  std::atomic<bool> stop_{false};
  std::atomic<uint8_t*> device_base_{nullptr};
  size_t registered_ = 0;  // chunks registered; written by the thread only

  mutable absl::Mutex mu_;
  v1::PinState state_ ABSL_GUARDED_BY(mu_) = v1::PIN_PINNING;
  uint64_t pinned_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration elapsed_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CUDA_CUDA_POOL_PINNING_H_
