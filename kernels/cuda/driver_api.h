// The few CUDA driver functions hostkv needs (address ranges, stream memory
// operations), looked up through the runtime (cudaGetDriverEntryPointByVersion)
// so that nothing links libcuda.so: binaries built with CUDA still start on
// machines without a driver. Also small helpers shared by the daemon's and
// the client's CUDA code.
#ifndef HOSTKV_KERNELS_CUDA_DRIVER_API_H_
#define HOSTKV_KERNELS_CUDA_DRIVER_API_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hostkv {

struct DriverApi {
  CUresult (*mem_get_address_range)(CUdeviceptr* base, size_t* size,
                                    CUdeviceptr ptr);
  CUresult (*stream_write_value64)(CUstream stream, CUdeviceptr addr,
                                   cuuint64_t value, unsigned int flags);
  CUresult (*stream_wait_value64)(CUstream stream, CUdeviceptr addr,
                                  cuuint64_t value, unsigned int flags);
  CUresult (*get_error_string)(CUresult error, const char** text);
  CUresult (*device_get)(CUdevice* device, int ordinal);
  CUresult (*device_get_attribute)(int* value, CUdevice_attribute attribute,
                                   CUdevice device);
  CUresult (*pointer_get_attribute)(void* data, CUpointer_attribute attribute,
                                    CUdeviceptr ptr);
};

// The driver functions, looked up once. FailedPrecondition without a driver.
absl::StatusOr<const DriverApi*> GetDriverApi();

// OK for cudaSuccess, else an error naming `what` and CUDA's reason (and
// clearing CUDA's sticky-free last error).
absl::Status CudaStatus(cudaError_t error, const std::string& what);
absl::Status DriverStatus(CUresult result, const std::string& what);

// The base and size of the CUDA allocation holding `ptr` (current device).
struct AllocationRange {
  uintptr_t base = 0;
  size_t size = 0;
};
absl::StatusOr<AllocationRange> GetAllocationRange(const void* ptr);

// Makes `device` current for its scope and restores the previous one.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  // The error of switching, if any.
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// Host memory registered with CUDA (cudaHostRegister, portable + mapped)
// for its scope, with its device address (cudaHostGetDevicePointer); for
// words a stream waits on or writes with stream memory operations. The
// memory must outlive it. Move-only.
class HostRegistration {
 public:
  // Registers [ptr, ptr + bytes) on the current device. Internal (with
  // CUDA's reason) if CUDA refuses.
  static absl::StatusOr<HostRegistration> Create(void* ptr, size_t bytes);
  HostRegistration() = default;
  ~HostRegistration();
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  void* device_address() const { return device_; }

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
};

// Whether the device supports 64-bit stream memory operations
// (cuStreamWaitValue64 / cuStreamWriteValue64).
bool Supports64BitStreamMemOps(int device);

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_CUDA_DRIVER_API_H_
