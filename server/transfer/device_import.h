// An engine's device KV buffers, opened by the daemon so that transfers can
// copy into and out of them. CPU backend: each buffer is a range of a POSIX
// shared-memory segment the engine created. CUDA backend: each is a range of
// a CUDA allocation opened from its IPC handle (server/cuda/).
#ifndef HOSTKV_SERVER_TRANSFER_DEVICE_IMPORT_H_
#define HOSTKV_SERVER_TRANSFER_DEVICE_IMPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/copy_plan.h"
#include "server/transfer/gpu_backend.h"
#include "server/pool/host_pool.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

// A device buffer as a client names it (validated by DeviceImport).
struct DeviceBufferRef {
  std::string shm_name;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t passed_fd = 0;  // non-zero: a passed descriptor, not shm_name
};

struct DeviceImportSpec {
  uint64_t token_slots = 0;
  std::vector<DeviceBufferRef> k;  // one per layer (MLA: the latent)
  std::vector<DeviceBufferRef> v;  // one per layer (MHA), none (MLA)
};

// Checks the buffer counts of a registration against the pool's geometry
// and token_slots against its bounds (InvalidArgument).
absl::Status CheckImportShape(const PoolGeometry& g, uint64_t token_slots,
                              size_t k_buffers, size_t v_buffers);

// What a session may register as shared-memory device buffers.
struct ShmAccessPolicy {
  // Names with this prefix belong to the daemon: refused.
  std::string reserved_prefix = "/hostkv.";
  // The session peer's uid: named segments must belong to it (root
  // included). Unset: the peer is unknown and names are accepted unchecked
  // (--allow_unverified_shm_names).
  std::optional<uint32_t> peer_uid;
  // Also accepted: segments in this group with group read-write permission
  // (--shm_group, set only when the peer is a member).
  std::optional<uint32_t> shared_group;
  // Resolves DeviceBufferRef::passed_fd handles to a descriptor.
  std::function<absl::StatusOr<ScopedFd>(uint64_t handle)> passed_fd;
};

// OK if `fd` is a read-write memfd sealed against shrinking (F_SEAL_SHRINK)
// and not empty, so that no mapping of it can lose its pages; else
// InvalidArgument saying what is missing.
absl::Status CheckSealedMemfd(int fd);

// Owns the mappings of one registration; immutable after Open, so
// thread-safe. Keeps its pool alive and counted in pool->imports().
class DeviceImport {
 public:
  // A CUDA import: `layers` are device addresses in the daemon's mappings,
  // which `gpu` owns.
  static std::unique_ptr<DeviceImport> ForGpu(
      std::shared_ptr<HostPool> pool, uint64_t token_slots,
      std::vector<LayerBuffers> layers, std::unique_ptr<GpuImportState> gpu);

  // Maps every distinct segment (name or passed descriptor) once and checks
  // each buffer against it and against the pool's geometry.
  // InvalidArgument for wrong counts, sizes too small for token_slots rows,
  // or offset + size beyond the segment; PermissionDenied for the daemon's
  // own segments and for segments `policy` does not allow; NotFound for an
  // unknown passed_fd; the segment's error if it cannot be opened.
  static absl::StatusOr<std::unique_ptr<DeviceImport>> OpenShm(
      std::shared_ptr<HostPool> pool, const DeviceImportSpec& spec,
      const ShmAccessPolicy& policy);

  ~DeviceImport();
  DeviceImport(const DeviceImport&) = delete;
  DeviceImport& operator=(const DeviceImport&) = delete;

  const std::shared_ptr<HostPool>& pool() const { return pool_; }
  uint64_t token_slots() const { return token_slots_; }
  // Per layer: the K and V (MLA: latent, null) base addresses.
  const std::vector<LayerBuffers>& layers() const { return layers_; }
  // The CUDA state of a CUDA import; null for the CPU backend.
  GpuImportState* gpu() const { return gpu_.get(); }

 private:
  DeviceImport(std::shared_ptr<HostPool> pool, uint64_t token_slots);

  const std::shared_ptr<HostPool> pool_;
  const uint64_t token_slots_;
  std::vector<ShmSegment> segments_;
  std::vector<LayerBuffers> layers_;
  std::unique_ptr<GpuImportState> gpu_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TRANSFER_DEVICE_IMPORT_H_
