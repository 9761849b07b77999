// POSIX shared-memory segments (/dev/shm) mapped into this process: the host
// pools, the per-session signal records and, on the CPU backend, the
// engines' device buffers. Used by the daemon and the client alike.
#ifndef HOSTKV_PROTO_CONTRACT_SHM_SEGMENT_H_
#define HOSTKV_PROTO_CONTRACT_SHM_SEGMENT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace hostkv {

// Owns a file descriptor; move-only.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  int release();

 private:
  int fd_ = -1;
};

// A mapping of a shared-memory segment, whole or a range of it. Not
// thread-safe to move;
// the bytes themselves are shared with other processes.
class ShmSegment {
 public:
  // Creates segment `name` ("/name") of `size` bytes with `mode`, reserves
  // its memory (so a full /dev/shm fails here, not with SIGBUS later) and
  // maps it read-write. The segment is unlinked when this object dies.
  // Returns AlreadyExists if the name is taken, ResourceExhausted if the
  // memory cannot be reserved.
  static absl::StatusOr<ShmSegment> Create(const std::string& name,
                                           uint64_t size, mode_t mode);

  // Creates an anonymous segment (a memfd labelled `label`) of `size` bytes,
  // mode 0600, with its memory reserved (or, with reserve false, none of it
  // yet: the caller reserves it, e.g. range by range with fallocate, before
  // touching a byte), sealed against shrinking and
  // growing (F_SEAL_SHRINK | F_SEAL_GROW, then F_SEAL_SEAL) and mapped
  // read-write. Nobody can open it by name, and no descriptor of it, even a
  // read-write one, can cut it short under this mapping (SIGBUS). fd() is
  // its descriptor; ReopenFd hands out new ones. name() is "memfd:<label>".
  // `memfd_flags` are added to memfd_create's (MFD_HUGETLB and a size:
  // `size` must then be a multiple of that page size).
  static absl::StatusOr<ShmSegment> CreateSealed(const std::string& label,
                                                 uint64_t size,
                                                 bool reserve = true,
                                                 unsigned memfd_flags = 0);

  // Opens and maps an existing segment, read-write or read-only; the
  // segment is not unlinked later. Returns NotFound, PermissionDenied or
  // InvalidArgument (empty segment) with the reason.
  enum class Access { kReadOnly, kReadWrite };
  static absl::StatusOr<ShmSegment> Open(const std::string& name,
                                         Access access = Access::kReadWrite);

  // Opens an existing segment and maps only the OS pages that hold bytes
  // [offset, offset + length) of it; data() then points at byte `offset`,
  // size() is `length`, and file_size() and owner_uid() are read from the
  // descriptor that was mapped. Returns InvalidArgument if length is 0 or the
  // range is not within the segment, else as Open.
  static absl::StatusOr<ShmSegment> OpenRange(const std::string& name,
                                              uint64_t offset, uint64_t length,
                                              Access access);

  // Maps the whole file behind descriptor `fd` (a memfd or a segment
  // another process passed), or bytes [offset, offset + length) of it;
  // `label` names it in errors and name(). Errors of Open / OpenRange. The
  // descriptor may be closed afterwards.
  static absl::StatusOr<ShmSegment> MapFd(int fd, const std::string& label,
                                          Access access);
  static absl::StatusOr<ShmSegment> MapFdRange(int fd, const std::string& label,
                                               uint64_t offset, uint64_t length,
                                               Access access);

  // An empty segment that maps nothing.
  // Takes over a sealed memfd that CreateSealed made (e.g. in a daemon that
  // ran before, kept by the state keeper) and maps it read-write; the
  // segment keeps `fd` (ReopenFd works). FailedPrecondition unless `fd` is
  // a memfd sealed against shrinking and growing, of at least
  // `expected_size` bytes.
  static absl::StatusOr<ShmSegment> AdoptSealed(ScopedFd fd,
                                                const std::string& label,
                                                uint64_t expected_size);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ~ShmSegment();

  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The segment's size when it was mapped (size() unless OpenRange).
  uint64_t file_size() const { return file_size_; }
  uid_t owner_uid() const { return owner_uid_; }
  gid_t owner_gid() const { return owner_gid_; }
  mode_t mode() const { return mode_; }  // st_mode when mapped

  // A segment of CreateSealed: its descriptor (else -1), and a new open of
  // it, read-only or read-write (through /proc/self/fd, so that a
  // read-only descriptor really is one: a dup would share the read-write
  // file description).
  int fd() const { return fd_.get(); }
  absl::StatusOr<ScopedFd> ReopenFd(Access access) const;

  // Removes the segment's name now (a segment this process created); the
  // mapping and descriptors opened before stay valid.
  void Unlink();

 private:
  // Open (whole) and OpenRange.
  static absl::StatusOr<ShmSegment> OpenMapping(const std::string& name,
                                                uint64_t offset,
                                                uint64_t length, bool whole,
                                                Access access);
  // Every mapping: `fd` (whole, or [offset, offset + length)).
  static absl::StatusOr<ShmSegment> MapDescriptor(int fd, const std::string& name,
                                                  uint64_t offset, uint64_t length,
                                                  bool whole, Access access);
  void Reset();

  std::string name_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  // The mapping itself: OpenRange maps whole OS pages around [data_,
  // data_ + size_).
  uint8_t* map_base_ = nullptr;
  uint64_t map_bytes_ = 0;
  uint64_t file_size_ = 0;
  uid_t owner_uid_ = 0;
  gid_t owner_gid_ = 0;
  mode_t mode_ = 0;
  bool unlink_ = false;
  ScopedFd fd_;  // CreateSealed
};

// True if `name` is a well-formed POSIX shm name: "/" then 1..200 of
// [A-Za-z0-9._-], not "." or "..".
bool IsValidShmName(const std::string& name);

}  // namespace hostkv

#endif  // HOSTKV_PROTO_CONTRACT_SHM_SEGMENT_H_
