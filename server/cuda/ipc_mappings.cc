#include "server/cuda/ipc_mappings.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/driver_api.h"
#include "spdlog/spdlog.h"

namespace hostkv {

IpcMappingRef& IpcMappingRef::operator=(IpcMappingRef&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    handle_ = std::move(other.handle_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

void IpcMappingRef::Release() {
  if (owner_ != nullptr) owner_->Release(handle_);
  owner_ = nullptr;
  base_ = nullptr;
}

absl::StatusOr<IpcMappingRef> IpcMappings::Open(const std::string& handle,
                                                int device) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(handle);
  if (it == open_.end()) {
    ScopedDevice on_device(device);
    if (!on_device.status().ok()) {
      return absl::FailedPreconditionError(on_device.status().message());
    }
    cudaIpcMemHandle_t ipc;
    static_assert(sizeof(ipc) == 64, "cudaIpcMemHandle_t is 64 bytes");
    std::memcpy(&ipc, handle.data(), sizeof(ipc));
    void* base = nullptr;
    const absl::Status opened = CudaStatus(
        cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle");
    if (!opened.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          opened.message(), ". The handle must come from cudaIpcGetMemHandle "
          "on a live cudaMalloc allocation of a process on this node (memory "
          "from the virtual memory API, e.g. PyTorch expandable_segments, "
          "cannot be exported this way)"));
    }
    absl::StatusOr<AllocationRange> range = GetAllocationRange(base);
    if (!range.ok()) {
      cudaIpcCloseMemHandle(base);
      return absl::FailedPreconditionError(range.status().message());
    }
    // The handle names the allocation's base (cudaIpcGetMemHandle), so the
    // range starts at `base`.
    const uint64_t size =
        range->size - (reinterpret_cast<uintptr_t>(base) - range->base);
    it = open_.emplace(handle, Entry{static_cast<uint8_t*>(base), size, device, 0})
             .first;
    spdlog::debug("opened IPC allocation of {} bytes on device {}", size,
                  device);
  } else if (it->second.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this IPC handle is open on device ", it->second.device,
        " already, not on device ", device));
  }
  ++it->second.uses;
  IpcMappingRef ref;
  ref.owner_ = this;
  ref.handle_ = handle;
  ref.base_ = it->second.base;
  ref.size_ = it->second.size;
  ref.device_ = device;
  return ref;
}

void IpcMappings::Release(const std::string& handle) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(handle);
  if (it == open_.end() || --it->second.uses != 0) return;
  ScopedDevice on_device(it->second.device);
  const absl::Status closed =
      CudaStatus(cudaIpcCloseMemHandle(it->second.base), "cudaIpcCloseMemHandle");
  if (!closed.ok()) spdlog::warn("{}", std::string(closed.message()));
  open_.erase(it);
}

size_t IpcMappings::open_count() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

}  // namespace hostkv
