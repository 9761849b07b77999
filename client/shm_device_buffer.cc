#include "hostkv/shm_device_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/shm_segment.h"
#include "proto/contract/status_macros.h"

namespace hostkv {

struct ShmDeviceBuffer::Impl {
  ShmSegment segment;
  ScopedFd memfd;  // sealed buffers
};

ShmDeviceBuffer::ShmDeviceBuffer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
ShmDeviceBuffer::ShmDeviceBuffer(ShmDeviceBuffer&&) noexcept = default;
ShmDeviceBuffer& ShmDeviceBuffer::operator=(ShmDeviceBuffer&&) noexcept =
    default;
ShmDeviceBuffer::~ShmDeviceBuffer() = default;

absl::StatusOr<ShmDeviceBuffer> ShmDeviceBuffer::Create(uint64_t size) {
  static std::atomic<uint64_t> counter{0};
  const std::string name =
      absl::StrCat("/hostkv-dev.", getpid(), ".", counter.fetch_add(1));
  ASSIGN_OR_RETURN(ShmSegment segment, ShmSegment::Create(name, size, 0600));
  auto impl = std::make_unique<Impl>();
  impl->segment = std::move(segment);
  return ShmDeviceBuffer(std::move(impl));
}

absl::StatusOr<ShmDeviceBuffer> ShmDeviceBuffer::CreateSealed(uint64_t size) {
  ScopedFd fd(memfd_create("hostkv-device-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd.get() < 0) {
    return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0 ||
      fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return absl::InternalError(
        absl::StrCat("sizing/sealing a memfd: ", std::strerror(errno)));
  }
  ASSIGN_OR_RETURN(ShmSegment segment,
                   ShmSegment::MapFd(fd.get(), absl::StrCat("memfd:", fd.get()),
                                     ShmSegment::Access::kReadWrite));
  auto impl = std::make_unique<Impl>();
  impl->segment = std::move(segment);
  impl->memfd = std::move(fd);
  return ShmDeviceBuffer(std::move(impl));
}

const std::string& ShmDeviceBuffer::name() const { return impl_->segment.name(); }
int ShmDeviceBuffer::fd() const { return impl_->memfd.get(); }

v1::DeviceBuffer ShmDeviceBuffer::DescribePassed(uint64_t handle,
                                                 uint64_t offset,
                                                 uint64_t size) {
  v1::DeviceBuffer buffer;
  buffer.set_passed_fd(handle);
  buffer.set_offset(offset);
  buffer.set_size(size);
  return buffer;
}
uint8_t* ShmDeviceBuffer::data() const { return impl_->segment.data(); }
uint64_t ShmDeviceBuffer::size() const { return impl_->segment.size(); }

v1::DeviceBuffer ShmDeviceBuffer::Describe(uint64_t offset,
                                           uint64_t size) const {
  v1::DeviceBuffer buffer;
  buffer.set_shm_name(name());
  buffer.set_offset(offset);
  buffer.set_size(size);
  return buffer;
}

}  // namespace hostkv
