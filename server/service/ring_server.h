// A session's command ring, daemon side (proto/contract/command_ring.h):
// the shared segment and the thread that serves it. The thread spins for a
// short while after each call (an engine's calls come in bursts) and then
// sleeps on the ring's doorbell. The CPU the thread uses (calls and spin) is
// charged to its uid's RingCpuAccount (server/service/ring_quota.h); once
// that is overdrawn the thread neither spins nor serves until it refills.
//
// One thread per ring: a thread sleeps on one futex word (the doorbell),
// and waiting on many words needs futex_waitv (Linux 5.16) or polling. The
// threads are bounded by the quota (--max_command_rings and
// --max_command_rings_per_uid) and their CPU by --ring_cpu_per_uid.
#ifndef HOSTKV_SERVER_SERVICE_RING_SERVER_H_
#define HOSTKV_SERVER_SERVICE_RING_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/contract/command_ring.h"
#include "proto/contract/shm_segment.h"
#include "server/service/request_handler.h"
#include "server/service/ring_quota.h"

namespace hostkv {

class RingServer {
 public:
  // How long the thread keeps polling after a call before it sleeps, by
  // default (--command_ring_spin). Waking a sleeping thread costs 5-10 µs
  // on bare metal and 50-100 µs on some VMs: an engine whose calls come
  // closer together than this never pays it.
  static constexpr absl::Duration kDefaultSpin = absl::Microseconds(250);

  // Creates the segment of session `session_id` (the 16-byte secret) and
  // starts its thread, which holds `grant` (its place in the RingQuota)
  // until it ends. `handler` must outlive the ring.
  static absl::StatusOr<std::unique_ptr<RingServer>> Start(
      RequestHandler* handler, std::string session_id, RingGrant grant = {},
      absl::Duration spin = kDefaultSpin, uint32_t slots = kRingSlots,
      uint32_t slot_bytes = kRingSlotBytes);
  // Stop(), then waits for the thread (it finishes the call it runs).
  ~RingServer();
  RingServer(const RingServer&) = delete;
  RingServer& operator=(const RingServer&) = delete;

  // A new read-write descriptor of the segment, for the client.
  absl::StatusOr<ScopedFd> ClientFd() const;
  uint64_t size() const { return segment_.size(); }
  // Asks the thread to end after the call it runs; does not wait.
  void Stop();
  // The thread has ended (its destructor will not wait).
  bool ended() const { return ended_.load(); }
  // Calls answered so far.
  uint64_t calls() const { return calls_.load(); }

 private:
  RingServer(RequestHandler* handler, std::string session_id, RingGrant grant,
             absl::Duration spin, ShmSegment segment, uint32_t slots,
             uint32_t slot_bytes);
  RingHeader* header() const {
    return reinterpret_cast<RingHeader*>(segment_.data());
  }
  void Loop();
  // Charges the CPU this thread used since the last charge to its uid;
  // with `now_or_later`, only if kChargeEvery passed since then.
  void ChargeCpu(bool now_or_later = false);
  // Waits while the uid's CPU is overdrawn (or until Stop); true if it did.
  bool WaitForCpu();
  // Serves every slot submitted now; true if there was one (or if it
  // waited for the uid's CPU share first, having served none).
  bool ServeSubmitted();
  void Serve(RingSlot* slot);

  RequestHandler* const handler_;
  const std::string session_id_;
  RingGrant grant_;
  const absl::Duration spin_;
  ShmSegment segment_;
  // The shape as the daemon made it: never read back from the segment.
  const uint32_t slots_;
  const uint32_t slot_bytes_;
  std::string request_;  // the thread's copy of a request
  std::atomic<bool> stop_{false};
  absl::Notification stopping_;  // Stop() was called
  absl::Duration cpu_mark_;      // the thread's CPU time when last charged
  std::chrono::steady_clock::time_point charged_at_;  // and when
  static constexpr std::chrono::microseconds kChargeEvery{500};
  std::atomic<bool> ended_{false};
  std::atomic<uint64_t> calls_{0};
  std::thread thread_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_RING_SERVER_H_
