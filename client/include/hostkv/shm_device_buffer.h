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
  // Creates a zeroed segment of `size` bytes with a unique name.
  static absl::StatusOr<ShmDeviceBuffer> Create(uint64_t size);

  ShmDeviceBuffer(ShmDeviceBuffer&&) noexcept;
  ShmDeviceBuffer& operator=(ShmDeviceBuffer&&) noexcept;
  ~ShmDeviceBuffer();

  const std::string& name() const;
  uint8_t* data() const;
  uint64_t size() const;

  // The registration entry for bytes [offset, offset + size) of this buffer.
  v1::DeviceBuffer Describe(uint64_t offset, uint64_t size) const;

 private:
  struct Impl;
  explicit ShmDeviceBuffer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_INCLUDE_HOSTKV_SHM_DEVICE_BUFFER_H_
