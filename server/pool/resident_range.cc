#include "server/pool/resident_range.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/pool/pin_plan.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace hostkv {
namespace {

absl::Status RangeError(int err, const char* what, const SegmentRange& range) {
  const std::string msg =
      absl::StrCat(what, " of bytes [", range.offset, ", +", range.bytes,
                   ") of the pool: ", std::strerror(err));
  if (err == ENOMEM || err == ENOSPC || err == EFAULT || err == EFBIG) {
    return absl::ResourceExhaustedError(msg);
  }
  return absl::InternalError(msg);
}

}  // namespace

void TouchResident(uint8_t* p, uint64_t bytes) {
  for (uint64_t off = 0; off < bytes; off += kOsPageBytes) {
    __atomic_fetch_add(reinterpret_cast<uint64_t*>(p + off), 0, __ATOMIC_RELAXED);
  }
}

absl::Status MakeResident(uint8_t* base, const SegmentRange& range, int reserve_fd,
                          ResidentMethod* method) {
  if (range.bytes == 0) return absl::OkStatus();
  uint8_t* p = base + range.offset;
  // MADV_POPULATE_WRITE allocates what is missing itself and reports a
  // shortage as ENOMEM / EFAULT, never a SIGBUS: no fallocate first (one
  // syscall less per range, and no contention on the file's lock).
  for (;;) {
    if (madvise(p, range.bytes, MADV_POPULATE_WRITE) == 0) {
      *method = ResidentMethod::kPopulate;
      return absl::OkStatus();
    }
    // EINTR / EAGAIN: a signal or a page briefly busy; the populated part
    // stays populated, so the retry is cheap.
    if (errno == EINTR || errno == EAGAIN) continue;
    if (errno == EINVAL) break;
    return RangeError(errno, "MADV_POPULATE_WRITE", range);
  }
  // An older kernel: the user-space touch, which would take a shortage as
  // a SIGBUS, so the memory is allocated in the file first.
  if (reserve_fd >= 0) {
    int rc;
    do {
      rc = fallocate(reserve_fd, 0, static_cast<off_t>(range.offset),
                     static_cast<off_t>(range.bytes));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return RangeError(errno, "reserving memory", range);
  }
  TouchResident(p, range.bytes);
  *method = ResidentMethod::kTouch;
  return absl::OkStatus();
}

}  // namespace hostkv
