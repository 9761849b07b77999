// Device KV buffers for the CPU backend: a named POSIX shared-memory segment
// that the engine (or a test) writes and reads as if it were GPU memory, and
// that hostkvd maps to copy pages into and out of.
#ifndef HOSTKV_CLIENT_INCLUDE_HOSTKV_SHM_DEVICE_BUFFER_H_
#define HOSTKV_CLIENT_INCLUDE_HOSTKV_SHM_DEVICE_BUFFER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hostkv/v1/hostkv.pb.h"

namespace hostkv {

// Owns the segment: it is unlinked and unmapped on destruction. Move-only.
class ShmDeviceBuffer {
 public:
  // Creates a zeroed segment of `size` bytes with a unique name in
  // /dev/shm (mode 0600), registered by name (DeviceBuffer.shm_name).
  static absl::StatusOr<ShmDeviceBuffer> Create(uint64_t size);
  // Creates a zeroed memfd of `size` bytes sealed against shrinking: no
  // name at all; pass fd() with Client::PassDescriptor and register it with
  // DescribePassed. Preferred: nobody else can open it, and it cannot be
  // truncated under the daemon's copies.
  static absl::StatusOr<ShmDeviceBuffer> CreateSealed(uint64_t size);

  ShmDeviceBuffer(ShmDeviceBuffer&&) noexcept;
  ShmDeviceBuffer& operator=(ShmDeviceBuffer&&) noexcept;
  ~ShmDeviceBuffer();

  // The /dev/shm name; "memfd:..." for sealed buffers.
  const std::string& name() const;
  // The memfd of a sealed buffer; -1 for named ones.
  int fd() const;
  uint8_t* data() const;
  uint64_t size() const;

  // The registration entry for bytes [offset, offset + size) of this buffer.
  v1::DeviceBuffer Describe(uint64_t offset, uint64_t size) const;
  // The same, for a sealed buffer passed as `handle`.
  static v1::DeviceBuffer DescribePassed(uint64_t handle, uint64_t offset,
                                         uint64_t size);

 private:
  struct Impl;
  explicit ShmDeviceBuffer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_INCLUDE_HOSTKV_SHM_DEVICE_BUFFER_H_
