// Device allocations of engine processes, opened from their CUDA IPC
// handles. Each handle is opened once for the whole daemon and shared by
// every import (of any session) that names it, then closed when the last lets
// go: older drivers refuse a second open of one handle in a process, newer
// ones count them, and one mapping per allocation is what both need.
#ifndef HOSTKV_SERVER_CUDA_IPC_MAPPINGS_H_
#define HOSTKV_SERVER_CUDA_IPC_MAPPINGS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace hostkv {

class IpcMappings;

// One use of an opened allocation; move-only. Releasing the last use closes
// the mapping (cudaIpcCloseMemHandle).
class IpcMappingRef {
 public:
  IpcMappingRef() = default;
  IpcMappingRef(IpcMappingRef&& other) noexcept { *this = std::move(other); }
  IpcMappingRef& operator=(IpcMappingRef&& other) noexcept;
  ~IpcMappingRef() { Release(); }

  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }  // bytes of the allocation
  int device() const { return device_; }
  void Release();

 private:
  friend class IpcMappings;
  IpcMappings* owner_ = nullptr;
  std::string handle_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  int device_ = -1;
};

// Thread-safe. Must outlive every IpcMappingRef it handed out.
class IpcMappings {
 public:
  // Opens (or shares) the allocation of a 64-byte cudaIpcMemHandle_t on
  // `device` (the device it lives on, in this process's numbering).
  // InvalidArgument if it is already open on another device;
  // FailedPrecondition with CUDA's reason if it cannot be opened.
  absl::StatusOr<IpcMappingRef> Open(const std::string& handle, int device)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Handles open now.
  size_t open_count() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class IpcMappingRef;
  struct Entry {
    uint8_t* base;
    uint64_t size;
    int device;
    uint64_t uses;
  };
  void Release(const std::string& handle) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CUDA_IPC_MAPPINGS_H_
