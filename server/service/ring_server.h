// A session's command ring, daemon side (proto/contract/command_ring.h): the
// shared segment and how one of its calls is answered. The ring has no
// thread of its own: the threads of its uid (server/service/ring_threads.h)
// serve it, spinning for a short while after each call (an engine's calls
// come in bursts) and then sleeping on its doorbell with their other rings'.
// The CPU they use is charged to the uid's RingCpuAccount
// (server/service/ring_quota.h).
#ifndef HOSTKV_SERVER_SERVICE_RING_SERVER_H_
#define HOSTKV_SERVER_SERVICE_RING_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/contract/command_ring.h"
#include "proto/contract/shm_segment.h"
#include "server/service/request_handler.h"
#include "server/service/ring_quota.h"
#include "server/service/ring_threads.h"

namespace hostkv {

class RingServer {
 public:
  // How long a ring's thread keeps polling after a call before it sleeps,
  // by default (--command_ring_spin). Waking a sleeping thread costs 5-10 µs
  // on bare metal and 50-100 µs on some VMs: an engine whose calls come
  // closer together than this never pays it.
  static constexpr absl::Duration kDefaultSpin = absl::Microseconds(250);

  // Creates the segment of session `session_id` (the 16-byte secret) and
  // hands it to the threads of `grant` (its place in the RingQuota, held
  // until the ring ends). A grant without threads (tests) gets a thread of
  // the ring's own, spinning `spin`. `handler` must outlive the ring.
  static absl::StatusOr<std::unique_ptr<RingServer>> Start(
      RequestHandler* handler, std::string session_id, RingGrant grant = {},
      absl::Duration spin = kDefaultSpin, uint32_t slots = kRingSlots,
      uint32_t slot_bytes = kRingSlotBytes);
  // Stop(), then waits until its thread lets it go (after the call it runs).
  ~RingServer();
  RingServer(const RingServer&) = delete;
  RingServer& operator=(const RingServer&) = delete;

  // A new read-write descriptor of the segment, for the client.
  absl::StatusOr<ScopedFd> ClientFd() const;
  uint64_t size() const { return segment_.size(); }
  // Asks its thread to let it go after the call it runs; does not wait.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Its thread let it go (its destructor will not wait).
  bool ended() const { return ended_.load(); }
  // Calls answered so far.
  uint64_t calls() const { return calls_.load(); }

  // For the thread that serves it (server/service/ring_threads.cc).
  uint32_t slots() const { return slots_; }
  bool stop_requested() const { return stop_.load(std::memory_order_acquire); }
  // Slot `i` holds a submitted call.
  bool Submitted(uint32_t i) const;
  // Answers slot `i`'s call.
  void Serve(uint32_t i);
  // The word its client rings and the thread sleeps on.
  std::atomic<uint32_t>* doorbell() const { return &header()->doorbell; }
  // Tells the client whether it must wake the thread (1) or not (0).
  void SetDaemonIdle(bool idle) const;
  // The thread that serves it takes it / lets it go for good.
  void Attach(RingThreads::Thread* thread) ABSL_LOCKS_EXCLUDED(mu_);
  void Release() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class RingThreads;

  RingServer(RequestHandler* handler, std::string session_id, RingGrant grant,
             ShmSegment segment, uint32_t slots, uint32_t slot_bytes);
  RingHeader* header() const {
    return reinterpret_cast<RingHeader*>(segment_.data());
  }

  RequestHandler* const handler_;
  const std::string session_id_;
  RingGrant grant_;
  ShmSegment segment_;
  // The shape as the daemon made it: never read back from the segment.
  const uint32_t slots_;
  const uint32_t slot_bytes_;
  std::string request_;  // the serving thread's copy of a request
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  RingThreads::Thread* thread_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Its thread let it go. Set under threads_'s mutex, not the ring's own:
  // the thread is still unlocking that when the ring's destructor may go on.
  std::atomic<bool> ended_{false};
  // The threads that serve it; they outlive it (grant_ or own_threads_).
  RingThreads* threads_ = nullptr;
  std::atomic<uint64_t> calls_{0};
  // The thread of a ring started without a grant's threads (tests); joined
  // after the destructor has waited for ended_.
  std::shared_ptr<RingThreads> own_threads_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_RING_SERVER_H_
