// An engine's device KV buffers, opened by the daemon so that transfers can
// copy into and out of them. CPU backend: each buffer is a range of a POSIX
// shared-memory segment the engine created. CUDA backend: each is a range of
// a CUDA allocation opened from its IPC handle (server/cuda/).
#ifndef HOSTKV_SERVER_DEVICE_IMPORT_H_
#define HOSTKV_SERVER_DEVICE_IMPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/copy_plan.h"
#include "server/gpu_backend.h"
#include "server/host_pool.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

// A device buffer as a client names it (validated by DeviceImport).
struct DeviceBufferRef {
  std::string shm_name;
  uint64_t offset = 0;
  uint64_t size = 0;
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

// Owns the mappings of one registration; immutable after Open, so
// thread-safe. Keeps its pool alive and counted in pool->imports().
class DeviceImport {
 public:
  // A CUDA import: `layers` are device addresses in the daemon's mappings,
  // which `gpu` owns.
  static std::unique_ptr<DeviceImport> ForGpu(
      std::shared_ptr<HostPool> pool, uint64_t token_slots,
      std::vector<LayerBuffers> layers, std::unique_ptr<GpuImportState> gpu);

  // Maps every distinct segment once and checks each buffer against it and
  // against the pool's geometry. InvalidArgument for wrong counts, sizes
  // too small for token_slots rows, or offset + size beyond the segment;
  // PermissionDenied for the daemon's own segments (names starting with
  // `reserved_prefix`) and, when the client's uid is known (`peer_uid`), for
  // segments another user owns; the segment's error if it cannot be opened.
  static absl::StatusOr<std::unique_ptr<DeviceImport>> OpenShm(
      std::shared_ptr<HostPool> pool, const DeviceImportSpec& spec,
      const std::string& reserved_prefix, std::optional<uint32_t> peer_uid);

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

#endif  // HOSTKV_SERVER_DEVICE_IMPORT_H_
