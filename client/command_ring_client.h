// The client's end of a session's command ring
// (proto/contract/command_ring.h). Private to client/.
#ifndef HOSTKV_CLIENT_COMMAND_RING_CLIENT_H_
#define HOSTKV_CLIENT_COMMAND_RING_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/contract/command_ring.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

// Thread-safe.
class RingClient {
 public:
  // Maps the ring behind `fd` (`size` bytes, as the daemon's reply said)
  // and checks its header. Internal on a ring of another version.
  static absl::StatusOr<std::unique_ptr<RingClient>> Map(int fd, uint64_t size);

  // The serialized answer of `method` to `request`, nullopt when the call
  // must go over gRPC (no slot free, the request does not fit, or the
  // daemon said so). The daemon's errors as statuses; Unavailable when
  // `hung_up()` says the daemon is gone while waiting, DeadlineExceeded
  // after `timeout` (the slot is then the daemon's for good).
  std::optional<absl::StatusOr<std::string>> Call(
      RingMethod method, const std::string& request, absl::Duration timeout,
      const std::function<bool()>& hung_up);

  uint64_t calls() const { return calls_.load(); }

 private:
  RingClient(ShmSegment segment, uint32_t slots, uint32_t slot_bytes);
  RingHeader* header() const {
    return reinterpret_cast<RingHeader*>(segment_.data());
  }
  // A free slot's index (taken), or -1.
  int TakeSlot();
  void ReturnSlot(int index);

  ShmSegment segment_;
  const uint32_t slots_;
  const uint32_t slot_bytes_;
  std::atomic<uint64_t> free_mask_;  // bit i: slot i is ours to use
  std::atomic<uint64_t> calls_{0};
};

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_COMMAND_RING_CLIENT_H_
