// The signal values of one import's operations: the value its GPU signal
// words take after each layer of an operation, rising with every operation.
#ifndef HOSTKV_SERVER_TRANSFER_SIGNAL_SEQUENCE_H_
#define HOSTKV_SERVER_TRANSFER_SIGNAL_SEQUENCE_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hostkv {

// The largest signal value (2^63 - 1): stream waits compare wrapping
// (CU_STREAM_WAIT_VALUE_GEQ), so values stay below 2^63.
inline constexpr uint64_t kMaxSignalValue = (uint64_t{1} << 63) - 1;

// The last value given out or claimed; each Next or Claim is atomic, so
// values never decrease in the order the calls return. Thread-safe.
class SignalSequence {
 public:
  // Continues above `last` (what the words held at registration).
  explicit SignalSequence(uint64_t last = 0) : last_(last) {}

  // REQUIRES: no Next or Claim has run yet (for a value read after
  // construction, as CudaImportState reads the words).
  void Start(uint64_t last) { last_.store(last); }

  // One above the last value; the last value from then on.
  // FailedPrecondition, and nothing changes, once the last value is
  // kMaxSignalValue (a client claimed it): the words cannot rise further.
  absl::StatusOr<uint64_t> Next();

  // Makes `value` the last value. InvalidArgument, and nothing changes,
  // unless last < value <= kMaxSignalValue.
  absl::Status Claim(uint64_t value);

  uint64_t last() const { return last_.load(); }

 private:
  std::atomic<uint64_t> last_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TRANSFER_SIGNAL_SEQUENCE_H_
