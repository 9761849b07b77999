// The threads that serve one uid's command rings (server/service/ring_server.h).
//
// Why few threads per uid, each serving several rings: a thread asleep on a
// ring's doorbell becomes runnable whenever its client rings it, and the
// kernel shares a CPU among runnable threads, not among users. With one
// thread per ring, a uid holding 16 rings and ringing them ~100 times a
// second had 16 runnable threads beside another user's one, and that user's
// ring thread got a sixteenth of a CPU while the first uid stayed within its
// CPU share (tests/bench/README.md, "Another user's rings beside yours").
// So a uid's rings are served by at most ceil(--ring_cpu_per_uid) threads,
// as many calls as its share lets run at once anyway: a uid can have no
// more runnable ring threads than cores in its share, however many rings it
// opens and however often it rings them.
//
// A thread serves up to kMaxRingsPerThread rings and sleeps on all their
// doorbells at once with futex_waitv (Linux 5.16). Without futex_waitv, or
// without a CPU bound (--ring_cpu_per_uid=0), each ring has its own thread.
#ifndef HOSTKV_SERVER_SERVICE_RING_THREADS_H_
#define HOSTKV_SERVER_SERVICE_RING_THREADS_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/service/ring_quota.h"

namespace hostkv {

class RingServer;

class RingThreads {
 public:
  // A thread waits on its rings' doorbells and its own word: at most
  // FUTEX_WAITV_MAX (128) words in all.
  static constexpr size_t kMaxRingsPerThread = 127;

  // `max_threads` 0: a thread per ring. Past max_threads, a ring goes to the
  // thread with the fewest rings (a new thread only if all hold
  // kMaxRingsPerThread). `cpu` may be null (no bound). The threads spin for
  // `spin` after each call before they sleep.
  RingThreads(size_t max_threads, std::shared_ptr<RingCpuAccount> cpu,
              absl::Duration spin);
  // Every ring must have left (RingServer's destructor waits for that).
  ~RingThreads();
  RingThreads(const RingThreads&) = delete;
  RingThreads& operator=(const RingThreads&) = delete;

  // Starts serving `ring` (which must stay alive until its thread lets it
  // go: RingServer::Stop, then RingServer::ended()).
  void Add(RingServer* ring) ABSL_LOCKS_EXCLUDED(mu_);
  // A ring's thread let it go / its destructor waits for that
  // (RingServer::Release, ~RingServer).
  void MarkReleased(RingServer* ring) ABSL_LOCKS_EXCLUDED(mu_);
  void AwaitReleased(RingServer* ring) ABSL_LOCKS_EXCLUDED(mu_);
  // Threads running now (tests, logs).
  size_t threads() const ABSL_LOCKS_EXCLUDED(mu_);

  // Whether this kernel has futex_waitv (else a thread per ring).
  static bool CanWaitOnMany();

  class Thread;
  // Wakes `thread` to look at its rings again (one was added or stopped).
  static void Poke(Thread* thread);

 private:
  void ReapEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_threads_;
  const std::shared_ptr<RingCpuAccount> cpu_;
  const absl::Duration spin_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Thread>> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_RING_THREADS_H_
