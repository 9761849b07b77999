#include "kernels/cuda/driver_api.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hostkv {
namespace {

// Driver API version of the entry points we ask for (their signatures have
// not changed since CUDA 12.0).
constexpr unsigned kDriverApiVersion = 12000;

template <typename Fn>
absl::Status Lookup(const char* symbol, Fn* fn) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error = cudaGetDriverEntryPointByVersion(
      symbol, &ptr, kDriverApiVersion, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess ||
      ptr == nullptr) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver has no ", symbol, " (", cudaGetErrorString(error),
        ")"));
  }
  *fn = reinterpret_cast<Fn>(ptr);
  return absl::OkStatus();
}

absl::StatusOr<DriverApi> LoadDriverApi() {
  DriverApi api{};
  absl::Status s = Lookup("cuMemGetAddressRange", &api.mem_get_address_range);
  if (s.ok()) s = Lookup("cuStreamWriteValue64", &api.stream_write_value64);
  if (s.ok()) s = Lookup("cuStreamWaitValue64", &api.stream_wait_value64);
  if (s.ok()) s = Lookup("cuGetErrorString", &api.get_error_string);
  if (s.ok()) s = Lookup("cuDeviceGet", &api.device_get);
  if (s.ok()) s = Lookup("cuDeviceGetAttribute", &api.device_get_attribute);
  if (s.ok()) s = Lookup("cuPointerGetAttribute", &api.pointer_get_attribute);
  if (!s.ok()) return s;
  return api;
}

}  // namespace

absl::StatusOr<const DriverApi*> GetDriverApi() {
  static const absl::StatusOr<DriverApi>* const api =
      new absl::StatusOr<DriverApi>(LoadDriverApi());
  if (!api->ok()) return api->status();
  return &**api;
}

absl::Status CudaStatus(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so later calls start clean
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(error),
                                          " (", cudaGetErrorString(error), ")"));
}

absl::Status DriverStatus(CUresult result, const std::string& what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* text = "unknown error";
  if (absl::StatusOr<const DriverApi*> api = GetDriverApi(); api.ok()) {
    (*api)->get_error_string(result, &text);
  }
  return absl::InternalError(absl::StrCat(what, ": CUresult ",
                                          static_cast<int>(result), " (",
                                          text ? text : "?", ")"));
}

absl::StatusOr<AllocationRange> GetAllocationRange(const void* ptr) {
  absl::StatusOr<const DriverApi*> api = GetDriverApi();
  if (!api.ok()) return api.status();
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult r = (*api)->mem_get_address_range(
      &base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) return DriverStatus(r, "cuMemGetAddressRange");
  return AllocationRange{static_cast<uintptr_t>(base), size};
}

ScopedDevice::ScopedDevice(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    cudaGetLastError();
    previous_ = -1;
  }
  if (previous_ != device) {
    status_ = CudaStatus(cudaSetDevice(device),
                         absl::StrCat("cudaSetDevice(", device, ")"));
  }
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

absl::StatusOr<HostRegistration> HostRegistration::Create(void* ptr,
                                                          size_t bytes) {
  absl::Status s = CudaStatus(
      cudaHostRegister(ptr, bytes,
                       cudaHostRegisterPortable | cudaHostRegisterMapped),
      "cudaHostRegister");
  if (!s.ok()) return s;
  HostRegistration registration;
  registration.host_ = ptr;
  s = CudaStatus(cudaHostGetDevicePointer(&registration.device_, ptr, 0),
                 "cudaHostGetDevicePointer");
  if (!s.ok()) return s;
  return registration;
}

HostRegistration::~HostRegistration() {
  if (host_ != nullptr) cudaHostUnregister(host_);
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : host_(std::exchange(other.host_, nullptr)),
      device_(std::exchange(other.device_, nullptr)) {}

HostRegistration& HostRegistration::operator=(
    HostRegistration&& other) noexcept {
  if (this != &other) {
    if (host_ != nullptr) cudaHostUnregister(host_);
    host_ = std::exchange(other.host_, nullptr);
    device_ = std::exchange(other.device_, nullptr);
  }
  return *this;
}

bool Supports64BitStreamMemOps(int device) {
  absl::StatusOr<const DriverApi*> api = GetDriverApi();
  if (!api.ok()) return false;
  CUdevice dev = 0;
  int supported = 0;
  return (*api)->device_get(&dev, device) == CUDA_SUCCESS &&
         (*api)->device_get_attribute(
             &supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
             dev) == CUDA_SUCCESS &&
         supported != 0;
}

}  // namespace hostkv
