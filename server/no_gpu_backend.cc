// CreateGpuBackend for builds without CUDA: the daemon serves the CPU
// backend alone.
#include "server/gpu_backend.h"

namespace hostkv {

absl::StatusOr<std::unique_ptr<GpuBackend>> CreateGpuBackend(
    const GpuBackendOptions&) {
  return absl::UnimplementedError(
      "hostkvd was built without CUDA (nvcc was not found at configure time)");
}

}  // namespace hostkv
