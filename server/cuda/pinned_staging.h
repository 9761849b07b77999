// Pinned, GPU-mapped host blocks for per-operation data that kernels read
// (the copy kernel's token index): cudaHostAlloc is far too slow to call per
// operation, pageable uploads may wait for the stream, and cudaFreeHost may
// synchronize the device, so blocks are kept and recycled until the backend
// goes (as many as were ever in flight at once). Kernels read them through
// UVA; nothing is uploaded.
#ifndef HOSTKV_SERVER_CUDA_PINNED_STAGING_H_
#define HOSTKV_SERVER_CUDA_PINNED_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace hostkv {

struct PinnedBlock {
  uint8_t* host = nullptr;    // where the CPU writes
  uint8_t* device = nullptr;  // where kernels read (cudaHostGetDevicePointer)
  size_t bytes = 0;
};

// Thread-safe.
class PinnedStaging {
 public:
  PinnedStaging() = default;
  ~PinnedStaging();  // frees every block (none may be in use)
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // A block of at least `bytes` (sizes are powers of two from 64 KiB).
  absl::StatusOr<PinnedBlock> Acquire(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives a block back once the GPU is done with it. No CUDA call.
  void Release(const PinnedBlock& block) ABSL_LOCKS_EXCLUDED(mu_);

  // Block size for a request of `bytes`.
  static size_t RoundUp(size_t bytes);

 private:
  static constexpr size_t kMinBlock = 64 << 10;
  absl::Mutex mu_;
  std::map<size_t, std::vector<PinnedBlock>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CUDA_PINNED_STAGING_H_
