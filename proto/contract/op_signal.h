// The shared-memory record through which hostkvd signals per-layer completion
// of a transfer to the client that submitted it (CPU backend).
//
// Each session has a segment of OpSignal records (OpenSessionResponse names
// it). The daemon owns the writes; the client maps it read-only and waits on
// `progress` with a futex. Protocol for one operation in record i:
//   daemon:  op_id = new id; progress = 0;     (before the RPC returns)
//   daemon:  progress = k  after layer k of the operation is copied
//   daemon:  progress |= kFailedBit            if the operation is abandoned
// A record is reused only after its previous operation finished, so a reader
// that finds another op_id knows its own operation is long complete.
#ifndef HOSTKV_PROTO_CONTRACT_OP_SIGNAL_H_
#define HOSTKV_PROTO_CONTRACT_OP_SIGNAL_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace hostkv {

struct alignas(64) OpSignal {
  static constexpr uint32_t kFailedBit = 1u << 31;

  std::atomic<uint32_t> progress;  // layers done, | kFailedBit on failure
  uint32_t reserved;
  std::atomic<uint64_t> op_id;     // the operation that owns this record
};

static_assert(sizeof(OpSignal) == 64, "OpSignal is part of the wire format");
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Daemon side: claims `signal` for `op_id` with no layers done.
void BeginOpSignal(OpSignal& signal, uint64_t op_id);

// Daemon side: raises the count of layers done to `layers_done` (never
// lowers it) and wakes every waiter.
void PublishLayersDone(OpSignal& signal, uint32_t layers_done);

// Daemon side: marks the operation failed and wakes every waiter.
void PublishFailure(OpSignal& signal);

// Client side: blocks until `layers` layers of operation `op_id` are done.
// Returns OK when they are (or the record moved on to a later operation),
// Aborted if the daemon abandoned the operation, DeadlineExceeded on timeout.
absl::Status WaitForLayers(const OpSignal& signal, uint64_t op_id,
                           uint32_t layers, absl::Duration timeout);

}  // namespace hostkv

#endif  // HOSTKV_PROTO_CONTRACT_OP_SIGNAL_H_
