#include "server/transfer/signal_sequence.h"

#include "absl/strings/str_cat.h"

namespace hostkv {

absl::StatusOr<uint64_t> SignalSequence::Next() {
  uint64_t last = last_.load();
  do {
    if (last >= kMaxSignalValue) {
      return absl::FailedPreconditionError(
          "the import's signal values are used up (the last was 2^63 - 1); "
          "register its gpu_signals again, zeroed");
    }
  } while (!last_.compare_exchange_weak(last, last + 1));
  return last + 1;
}

absl::Status SignalSequence::Claim(uint64_t value) {
  if (value > kMaxSignalValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("signal_value ", value, " exceeds 2^63 - 1"));
  }
  uint64_t last = last_.load();
  do {
    if (value <= last) {
      return absl::InvalidArgumentError(absl::StrCat(
          "signal_value ", value,
          " is not above the import's last signal value ", last,
          " (an earlier transfer's, or what its words held at registration)"));
    }
  } while (!last_.compare_exchange_weak(last, value));
  return absl::OkStatus();
}

}  // namespace hostkv
