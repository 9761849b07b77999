#include "proto/contract/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hostkv {
namespace {
constexpr uint64_t kHugetlbfsMagic = 0x958458f6;  // linux/magic.h
}  // namespace

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.release();
  }
  return *this;
}

int ScopedFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

bool IsValidShmName(const std::string& name) {
  if (name.size() < 2 || name.size() > 201 || name[0] != '/') return false;
  if (name == "/." || name == "/..") return false;
  for (size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case ENOSPC:
    case ENOMEM:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

absl::StatusOr<ShmSegment> ShmSegment::Create(const std::string& name,
                                              uint64_t size, mode_t mode) {
  if (!IsValidShmName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("bad shm name '", name, "'"));
  }
  ScopedFd fd(shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, mode));
  if (fd.get() < 0) return ErrnoStatus(errno, "shm_open " + name);
  ShmSegment segment;
  segment.name_ = name;
  segment.unlink_ = true;  // from here on, failure removes the name
  fchmod(fd.get(), mode);  // shm_open's mode is filtered by the umask
  if (int err = posix_fallocate(fd.get(), 0, static_cast<off_t>(size));
      err != 0) {
    return ErrnoStatus(
        err, absl::StrCat("reserving ", size, " bytes of /dev/shm for ", name));
  }
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED,
                    fd.get(), 0);
  if (addr == MAP_FAILED) return ErrnoStatus(errno, "mmap " + name);
  segment.data_ = segment.map_base_ = static_cast<uint8_t*>(addr);
  segment.size_ = segment.map_bytes_ = segment.file_size_ = size;
  segment.owner_uid_ = geteuid();
  return segment;
}

absl::StatusOr<ShmSegment> ShmSegment::CreateSealed(const std::string& label,
                                                    uint64_t size,
                                                    bool reserve,
                                                    unsigned memfd_flags) {
  const std::string name = "memfd:" + label;
  ScopedFd fd(memfd_create(label.c_str(),
                           MFD_CLOEXEC | MFD_ALLOW_SEALING | memfd_flags));
  if (fd.get() < 0) return ErrnoStatus(errno, "memfd_create " + label);
  // A memfd is 0777: others could reopen a read-only descriptor read-write
  // through /proc/<pid>/fd.
  if (fchmod(fd.get(), 0600) != 0) return ErrnoStatus(errno, "fchmod " + name);
  if (!reserve) {
    if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("sizing ", name, " to ", size,
                                             " bytes"));
    }
  } else if (int err = posix_fallocate(fd.get(), 0, static_cast<off_t>(size));
             err != 0) {
    return ErrnoStatus(
        err, absl::StrCat("reserving ", size, " bytes of shared memory for ",
                          name));
  }
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    return ErrnoStatus(errno, "sealing " + name);
  }
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED,
                    fd.get(), 0);
  if (addr == MAP_FAILED) return ErrnoStatus(errno, "mmap " + name);
  ShmSegment segment;
  segment.name_ = name;
  segment.data_ = segment.map_base_ = static_cast<uint8_t*>(addr);
  segment.size_ = segment.map_bytes_ = segment.file_size_ = size;
  segment.owner_uid_ = geteuid();
  segment.owner_gid_ = getegid();
  segment.mode_ = S_IFREG | 0600;
  segment.fd_ = std::move(fd);
  return segment;
}

absl::StatusOr<ScopedFd> ShmSegment::ReopenFd(Access access) const {
  if (fd_.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment ", name_, " has no descriptor to reopen"));
  }
  const std::string path = absl::StrCat("/proc/self/fd/", fd_.get());
  ScopedFd fd(open(path.c_str(),
                   (access == Access::kReadWrite ? O_RDWR : O_RDONLY) |
                       O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "reopening " + name_);
  return fd;
}

absl::StatusOr<ShmSegment> ShmSegment::Open(const std::string& name,
                                            Access access) {
  return OpenMapping(name, 0, 0, /*whole=*/true, access);
}

absl::StatusOr<ShmSegment> ShmSegment::OpenRange(const std::string& name,
                                                 uint64_t offset,
                                                 uint64_t length,
                                                 Access access) {
  return OpenMapping(name, offset, length, /*whole=*/false, access);
}

absl::StatusOr<ShmSegment> ShmSegment::OpenMapping(const std::string& name,
                                                   uint64_t offset,
                                                   uint64_t length, bool whole,
                                                   Access access) {
  const bool writable = access == Access::kReadWrite;
  if (!IsValidShmName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("bad shm name '", name, "'"));
  }
  ScopedFd fd(shm_open(name.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0));
  if (fd.get() < 0) return ErrnoStatus(errno, "shm_open " + name);
  return MapDescriptor(fd.get(), name, offset, length, whole, access);
}

absl::StatusOr<ShmSegment> ShmSegment::AdoptSealed(ScopedFd fd,
                                                   const std::string& label,
                                                   uint64_t expected_size) {
  const std::string name = "memfd:" + label;
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
                       (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is not a memfd sealed against resizing"));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat " + name);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (!S_ISREG(st.st_mode) || size < expected_size || size == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, " is ", size, " bytes, not the ", expected_size, " expected"));
  }
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED,
                    fd.get(), 0);
  if (addr == MAP_FAILED) return ErrnoStatus(errno, "mmap " + name);
  ShmSegment segment;
  segment.name_ = name;
  segment.data_ = segment.map_base_ = static_cast<uint8_t*>(addr);
  segment.size_ = segment.map_bytes_ = segment.file_size_ = size;
  segment.owner_uid_ = st.st_uid;
  segment.owner_gid_ = st.st_gid;
  segment.mode_ = st.st_mode;
  segment.fd_ = std::move(fd);
  return segment;
}

absl::StatusOr<ShmSegment> ShmSegment::MapFd(int fd, const std::string& label,
                                             Access access) {
  return MapDescriptor(fd, label, 0, 0, /*whole=*/true, access);
}

absl::StatusOr<ShmSegment> ShmSegment::MapFdRange(int fd, const std::string& label,
                                                  uint64_t offset, uint64_t length,
                                                  Access access) {
  return MapDescriptor(fd, label, offset, length, /*whole=*/false, access);
}

absl::StatusOr<ShmSegment> ShmSegment::MapDescriptor(int fd, const std::string& name,
                                                     uint64_t offset, uint64_t length,
                                                     bool whole, Access access) {
  const bool writable = access == Access::kReadWrite;
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat " + name);
  if (!S_ISREG(st.st_mode) || st.st_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm segment ", name, " is empty or not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (whole) length = file_size;
  if (length == 0 || offset > file_size || length > file_size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes [", offset, ", +", length, ") are not within shm segment ",
        name, " of ", file_size, " bytes"));
  }
  // A hugetlbfs file (a hugetlb memfd) maps only at multiples of its page
  // size, which statfs gives as the block size.
  uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  struct statfs fs;
  if (fstatfs(fd, &fs) == 0 && static_cast<uint64_t>(fs.f_type) == kHugetlbfsMagic) {
    page = std::max<uint64_t>(page, static_cast<uint64_t>(fs.f_bsize));
  }
  const uint64_t map_offset = offset / page * page;
  // No overflow: offset + length <= file_size < 2^63.
  const uint64_t map_bytes = offset + length - map_offset;
  void* addr = mmap(nullptr, static_cast<size_t>(map_bytes),
                    writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED,
                    fd, static_cast<off_t>(map_offset));
  if (addr == MAP_FAILED) return ErrnoStatus(errno, "mmap " + name);
  ShmSegment segment;
  segment.name_ = name;
  segment.map_base_ = static_cast<uint8_t*>(addr);
  segment.map_bytes_ = map_bytes;
  segment.data_ = segment.map_base_ + (offset - map_offset);
  segment.size_ = length;
  segment.file_size_ = file_size;
  segment.owner_uid_ = st.st_uid;
  segment.owner_gid_ = st.st_gid;
  segment.mode_ = st.st_mode;
  return segment;
}

void ShmSegment::Unlink() {
  if (unlink_) shm_unlink(name_.c_str());
  unlink_ = false;
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    map_base_ = std::exchange(other.map_base_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    file_size_ = std::exchange(other.file_size_, 0);
    owner_uid_ = other.owner_uid_;
    owner_gid_ = other.owner_gid_;
    mode_ = other.mode_;
    unlink_ = std::exchange(other.unlink_, false);
    fd_ = std::move(other.fd_);
  }
  return *this;
}

ShmSegment::~ShmSegment() { Reset(); }

void ShmSegment::Reset() {
  if (map_base_ != nullptr) munmap(map_base_, map_bytes_);
  if (unlink_) shm_unlink(name_.c_str());
  data_ = map_base_ = nullptr;
  size_ = map_bytes_ = file_size_ = 0;
  unlink_ = false;
  fd_ = ScopedFd();
}

}  // namespace hostkv
