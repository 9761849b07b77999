#include "server/cuda/pinned_staging.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/driver_api.h"
#include "proto/contract/status_macros.h"

namespace hostkv {

size_t PinnedStaging::RoundUp(size_t bytes) {
  size_t size = kMinBlock;
  while (size < bytes) size *= 2;
  return size;
}

absl::StatusOr<PinnedBlock> PinnedStaging::Acquire(size_t bytes) {
  const size_t size = RoundUp(bytes);
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      PinnedBlock block = it->second.back();
      it->second.pop_back();
      return block;
    }
  }
  PinnedBlock block;
  block.bytes = size;
  void* host = nullptr;
  RETURN_IF_ERROR(CudaStatus(
      cudaHostAlloc(&host, size, cudaHostAllocPortable | cudaHostAllocMapped),
      absl::StrCat("cudaHostAlloc of ", size, " bytes")));
  block.host = static_cast<uint8_t*>(host);
  void* device = nullptr;
  const absl::Status mapped = CudaStatus(
      cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer");
  if (!mapped.ok()) {
    cudaFreeHost(host);
    return mapped;
  }
  block.device = static_cast<uint8_t*>(device);
  return block;
}

void PinnedStaging::Release(const PinnedBlock& block) {
  if (block.host == nullptr) return;
  absl::MutexLock lock(&mu_);
  free_[block.bytes].push_back(block);
}

PinnedStaging::~PinnedStaging() {
  absl::MutexLock lock(&mu_);
  for (auto& [size, blocks] : free_) {
    for (const PinnedBlock& b : blocks) cudaFreeHost(b.host);
  }
}

}  // namespace hostkv
