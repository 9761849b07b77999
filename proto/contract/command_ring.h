// The command ring: a session's hot calls (Alloc, Free, Load, Backup,
// Lookup, Release, Publish) through shared memory instead of gRPC. Shared
// by hostkvd (server/service/ring_server.h) and the clients
// (client/command_ring_client.h, client/python/hostkv/_command_ring.py).
//
// An attached session asks for its ring on the session socket
// (SessionMessageKind::kOpenCommandRing); the reply carries a read-write
// memfd: a RingHeader, then `slots` slots of `slot_bytes` bytes, each a
// RingSlot followed by its payload. A slot carries one call at a time:
//
//   client: payload = the request (the hostkv.v1 message, serialized),
//           method, length, timeout_ms; state = kSubmitted (seq_cst);
//           doorbell += 1; FUTEX_WAKE(doorbell)
//   daemon: copies the request out, runs it as the gRPC handler would
//           (same RequestHandler method: one implementation of every
//           check), writes the answer (the response message, or the
//           error's text) with code and length; state = kAnswered;
//           FUTEX_WAKE(state)
//   client: waits on state (spins, then FUTEX_WAIT), reads the answer,
//           state = kFree.
//
// The request's session_id is ignored: a ring acts only for the session
// that opened it. The daemon never trusts what the client wrote: it reads
// method and length once, bounds them, and copies the payload before
// parsing. code kRingUseGrpc means the call was not run (its answer could
// exceed the slot); the client makes it over gRPC instead.
#ifndef HOSTKV_PROTO_CONTRACT_COMMAND_RING_H_
#define HOSTKV_PROTO_CONTRACT_COMMAND_RING_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace hostkv {

inline constexpr uint32_t kRingMagic = 0x52564b48;  // "HKVR"
inline constexpr uint32_t kRingVersion = 1;

enum class RingMethod : uint32_t {
  kAlloc = 1,    // AllocRequest -> AllocResponse
  kFree = 2,     // FreeRequest -> FreeResponse
  kLoad = 3,     // TransferRequest -> TransferResponse
  kBackup = 4,   // TransferRequest -> TransferResponse
  kLookup = 5,   // LookupRequest -> LookupResponse
  kRelease = 6,  // ReleaseRequest -> ReleaseResponse
  kPublish = 7,  // PublishRequest -> PublishResponse
  // ListEvictionsRequest -> ListEvictionsResponse; only on daemons that
  // announce kSessionFeatureRingListEvictions.
  kListEvictions = 8,
};
inline constexpr uint32_t kRingMethodCount = 8;

// RingSlot::state.
inline constexpr uint32_t kSlotFree = 0;
inline constexpr uint32_t kSlotSubmitted = 1;
inline constexpr uint32_t kSlotAnswered = 2;

// RingSlot::code beside absl::StatusCode's values: not run, use gRPC.
inline constexpr uint32_t kRingUseGrpc = 0x10000;

struct alignas(64) RingHeader {
  uint32_t magic;       // kRingMagic
  uint32_t version;     // kRingVersion
  uint32_t slots;       // slots after this header
  uint32_t slot_bytes;  // each slot: a RingSlot and its payload
  // The client adds 1 after each submission, then FUTEX_WAKEs it; the
  // daemon's thread sleeps on it when the ring is idle.
  std::atomic<uint32_t> doorbell;
  // 1 while the daemon's thread sleeps on `doorbell` (a C++ client with
  // seq_cst atomics may skip the wake when it reads 0).
  std::atomic<uint32_t> daemon_idle;
  uint32_t reserved[10];
};

struct alignas(64) RingSlot {
  std::atomic<uint32_t> state;  // kSlotFree, kSlotSubmitted, kSlotAnswered
  uint32_t method;              // RingMethod
  uint32_t length;              // payload bytes: the request, then the answer
  uint32_t code;                // the answer's absl::StatusCode, or kRingUseGrpc
  uint32_t timeout_ms;          // Lookup: how long a tier fetch may wait
  uint32_t reserved[11];
};

static_assert(sizeof(RingHeader) == 64, "RingHeader is part of the wire format");
static_assert(sizeof(RingSlot) == 64, "RingSlot is part of the wire format");

// The daemon's ring shape: 8 slots of 256 KiB (payload 256 KiB - 64).
inline constexpr uint32_t kRingSlots = 8;
inline constexpr uint32_t kRingSlotBytes = 256 * 1024;

inline uint64_t RingSegmentBytes(uint32_t slots, uint32_t slot_bytes) {
  return sizeof(RingHeader) + uint64_t{slots} * slot_bytes;
}
inline RingSlot* RingSlotAt(void* segment, uint32_t slot_bytes, uint32_t i) {
  return reinterpret_cast<RingSlot*>(static_cast<uint8_t*>(segment) +
                                     sizeof(RingHeader) +
                                     uint64_t{i} * slot_bytes);
}
inline uint8_t* RingPayload(RingSlot* slot) {
  return reinterpret_cast<uint8_t*>(slot) + sizeof(RingSlot);
}

// Shared (not FUTEX_PRIVATE) futex calls on a word of a mapped segment.
void FutexWakeShared(const std::atomic<uint32_t>* word);
// Sleeps while *word == expected, at most `timeout`.
void FutexWaitShared(const std::atomic<uint32_t>* word, uint32_t expected,
                     absl::Duration timeout);

}  // namespace hostkv

#endif  // HOSTKV_PROTO_CONTRACT_COMMAND_RING_H_
