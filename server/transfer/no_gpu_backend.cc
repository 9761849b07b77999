// CreateGpuBackend for builds without CUDA: the daemon serves the CPU
// backend alone.
#include "server/transfer/gpu_backend.h"

namespace hostkv {

absl::StatusOr<std::unique_ptr<GpuBackend>> CreateGpuBackend(
    const GpuBackendOptions&) {
  return absl::UnimplementedError(
      "hostkvd was built without CUDA (no nvcc at configure time, or "
      "-DHOSTKV_ENABLE_CUDA=OFF)");
}

std::string DescribeGpuSupport() {
  return "backends: cpu (built without CUDA)";
}

}  // namespace hostkv
