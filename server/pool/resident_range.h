// Making bytes of a shared mapping resident (allocated and mapped
// writable) before anyone copies into them, at the kernel's speed.
#ifndef HOSTKV_SERVER_POOL_RESIDENT_RANGE_H_
#define HOSTKV_SERVER_POOL_RESIDENT_RANGE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "server/pool/fill_plan.h"

namespace hostkv {

// How a range was made resident.
enum class ResidentMethod : uint8_t {
  kPopulate,  // madvise(MADV_POPULATE_WRITE): one call per range (Linux >= 5.14)
  kTouch,     // the kernel refused it (EINVAL): one write fault per OS page
};

// Makes bytes `range` of the mapping at `base` resident: MADV_POPULATE_WRITE
// over the range (which allocates the memory and reports a shortage as an
// error, never a SIGBUS), or, where the kernel lacks it (EINVAL), the
// user-space touch (TouchResident) after allocating the range's memory in
// the mapped file `reserve_fd` (fallocate; when >= 0), so that a short
// machine fails here, not with a SIGBUS later. Contents are kept (safe on
// pages in use). Sets *method to what was used. ResourceExhausted when
// memory is short; Internal for other errors.
// REQUIRES: range OS-page aligned within a MAP_SHARED writable mapping.
absl::Status MakeResident(uint8_t* base, const SegmentRange& range, int reserve_fd,
                          ResidentMethod* method);

// The user-space way: an atomic add of 0 to one word of every OS page of
// [p, p + bytes) (a write fault each, the bytes unchanged even with other
// writers).
void TouchResident(uint8_t* p, uint64_t bytes);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_RESIDENT_RANGE_H_
