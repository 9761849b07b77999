#include "server/service/ring_threads.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <utility>

#include "proto/contract/command_ring.h"
#include "server/service/ring_server.h"

namespace hostkv {
namespace {

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The calling thread's CPU time.
absl::Duration ThreadCpuTime() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

#ifdef SYS_futex_waitv
// Sleeps until one of `waiters` no longer holds its value or is woken, at
// most `timeout`. Shared (not FUTEX_PRIVATE) words, like the doorbells.
void FutexWaitAny(std::vector<futex_waitv>& waiters, absl::Duration timeout) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const timespec until =
      absl::ToTimespec(absl::DurationFromTimespec(now) + timeout);
  syscall(SYS_futex_waitv, waiters.data(),
          static_cast<unsigned>(waiters.size()), 0u, &until, CLOCK_MONOTONIC);
}
#endif

}  // namespace

bool RingThreads::CanWaitOnMany() {
#ifdef SYS_futex_waitv
  // An empty vector: EINVAL where the call exists, ENOSYS where it does not.
  static const bool can = [] {
    return syscall(SYS_futex_waitv, nullptr, 0u, 0u, nullptr,
                   CLOCK_MONOTONIC) == -1 &&
           errno != ENOSYS;
  }();
  return can;
#else
  return false;
#endif
}

// One thread and the rings it serves.
class RingThreads::Thread {
 public:
  // Starts the thread with its first ring (a thread never runs without one).
  Thread(RingThreads* parent, RingServer* first) : parent_(parent) {
    first->Attach(this);
    rings_.push_back(first);
    thread_ = std::thread([this] { Loop(); });
  }
  ~Thread() {
    if (thread_.joinable()) thread_.join();
  }

  // Takes `ring` unless the thread is ending (its last ring left) or full.
  bool TryAdd(RingServer* ring) ABSL_LOCKS_EXCLUDED(mu_) {
    ring->Attach(this);
    {
      absl::MutexLock lock(&mu_);
      if (ending_ || rings_.size() >= kMaxRingsPerThread) return false;
      rings_.push_back(ring);
    }
    Poke();
    return true;
  }
  // Rings it serves; none once it is ending.
  size_t rings() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return ending_ ? 0 : rings_.size();
  }
  bool ended() const { return ended_.load(); }

  void Poke() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      poked_ = true;
    }
    control_.fetch_add(1, std::memory_order_seq_cst);
    FutexWakeShared(&control_);
  }

 private:
  void Loop();
  // Takes the rings added and lets the stopped ones go; false once none is
  // left (the thread then ends).
  bool Refresh() ABSL_LOCKS_EXCLUDED(mu_);
  // Serves every call submitted now on its rings; true if there was one (or
  // if it waited for the uid's CPU share first).
  bool ServePass();
  // Sleeps on its rings' doorbells (and its own word) until one is rung.
  void Sleep();
  // Charges the CPU this thread used since the last charge to its uid;
  // with `now_or_later`, only if kChargeEvery passed since then.
  void ChargeCpu(bool now_or_later = false);
  // Waits while the uid's CPU is overdrawn (or until poked); true if it did.
  bool WaitForCpu() ABSL_LOCKS_EXCLUDED(mu_);

  RingThreads* const parent_;
  mutable absl::Mutex mu_;
  std::vector<RingServer*> rings_ ABSL_GUARDED_BY(mu_);
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool poked_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint32_t> control_{0};  // bumped by Poke; slept on with rings
  // The thread's own.
  uint32_t control_seen_ = 0;
  std::vector<RingServer*> serving_;
#ifdef SYS_futex_waitv
  std::vector<futex_waitv> waiters_;
#endif
  absl::Duration cpu_mark_;  // the thread's CPU time when last charged
  std::chrono::steady_clock::time_point charged_at_;  // and when
  static constexpr std::chrono::microseconds kChargeEvery{500};
  std::atomic<bool> ended_{false};
  std::thread thread_;
};

void RingThreads::Poke(Thread* thread) { thread->Poke(); }

void RingThreads::Thread::Loop() {
  auto last_call = std::chrono::steady_clock::now();
  uint32_t polls = 0;
  const auto spin = absl::ToChronoNanoseconds(parent_->spin_);
  RingCpuAccount* const cpu = parent_->cpu_.get();
  cpu_mark_ = ThreadCpuTime();
  control_seen_ = control_.load() - 1;  // look at the rings first
  while (true) {
    const uint32_t control = control_.load(std::memory_order_acquire);
    if (control != control_seen_) {
      control_seen_ = control;
      if (!Refresh()) break;
    }
    if (ServePass()) {
      ChargeCpu(/*now_or_later=*/true);
      last_call = std::chrono::steady_clock::now();
      continue;
    }
    if (std::chrono::steady_clock::now() - last_call < spin) {
      // On a busy machine the client may wait for this CPU.
      if (++polls % 64 == 0) {
        sched_yield();
        // The spin is the uid's CPU too: once overdrawn, sleep instead.
        ChargeCpu(/*now_or_later=*/true);
        if (cpu != nullptr && cpu->Overdrawn() > absl::ZeroDuration()) {
          last_call -= spin;
        }
      } else {
        CpuRelax();
      }
      continue;
    }
    ChargeCpu();
    // Overdrawn: wait for the share before sleeping on the doorbells, so
    // that a client ringing without calls cannot keep the thread busy.
    if (WaitForCpu()) continue;
    Sleep();
    ChargeCpu();
    last_call = std::chrono::steady_clock::now();
  }
  ChargeCpu();
  ended_.store(true);
}

bool RingThreads::Thread::Refresh() {
  std::vector<RingServer*> leaving;
  {
    absl::MutexLock lock(&mu_);
    poked_ = false;
    auto stopped = std::stable_partition(
        rings_.begin(), rings_.end(),
        [](RingServer* r) { return !r->stop_requested(); });
    leaving.assign(stopped, rings_.end());
    rings_.erase(stopped, rings_.end());
    serving_ = rings_;
    if (rings_.empty()) ending_ = true;
  }
  // Not under mu_: a ring's Stop() holds the ring's lock while it pokes.
  for (RingServer* r : leaving) r->Release();
  return !serving_.empty();
}

bool RingThreads::Thread::ServePass() {
  RingCpuAccount* const cpu = parent_->cpu_.get();
  bool served = false;
  for (RingServer* ring : serving_) {
    bool looked = false;
    for (uint32_t i = 0; i < ring->slots(); ++i) {
      if (ring->stop_requested()) break;  // it leaves at the next Refresh
      if (!ring->Submitted(i)) continue;
      // Once per ring and pass: the calls of a pass may overdraw the uid's
      // share by at most a ring's slots.
      if (!looked) {
        looked = true;
        if (WaitForCpu()) return true;  // waited: look again
      }
      if (cpu != nullptr &&
          !cpu->BeginCall([ring] { return ring->stop_requested(); })) {
        return true;  // the ring stopped while its call waited
      }
      ring->Serve(i);
      if (cpu != nullptr) cpu->EndCall();
      served = true;
    }
  }
  return served;
}

void RingThreads::Thread::Sleep() {
  for (RingServer* r : serving_) r->SetDaemonIdle(true);
  // Idle announced: look once more before sleeping (a client that submitted
  // before reading daemon_idle == 1 is seen here). A bounded sleep: a client
  // rewriting its doorbell can only delay its own ring's end.
  constexpr absl::Duration kMostSleep = absl::Seconds(1);
#ifdef SYS_futex_waitv
  if (CanWaitOnMany()) {
    waiters_.clear();
    for (RingServer* r : serving_) {
      waiters_.push_back(futex_waitv{
          .val = r->doorbell()->load(std::memory_order_seq_cst),
          .uaddr = reinterpret_cast<uintptr_t>(r->doorbell()),
          .flags = FUTEX_32,
          .__reserved = 0});
    }
    waiters_.push_back(
        futex_waitv{.val = control_seen_,
                    .uaddr = reinterpret_cast<uintptr_t>(&control_),
                    .flags = FUTEX_32,
                    .__reserved = 0});
    if (!ServePass() && control_.load() == control_seen_) {
      FutexWaitAny(waiters_, kMostSleep);
    }
    for (RingServer* r : serving_) r->SetDaemonIdle(false);
    return;
  }
#endif
  // A thread per ring: its ring's doorbell (which Stop() also rings).
  RingServer* ring = serving_.front();
  const uint32_t seen = ring->doorbell()->load(std::memory_order_seq_cst);
  if (!ServePass() && !ring->stop_requested()) {
    FutexWaitShared(ring->doorbell(), seen, kMostSleep);
  }
  ring->SetDaemonIdle(false);
}

void RingThreads::Thread::ChargeCpu(bool now_or_later) {
  RingCpuAccount* const cpu = parent_->cpu_.get();
  if (cpu == nullptr) return;
  // Reading the thread's CPU time is a system call: on the hot path it is
  // read at most every kChargeEvery, the CPU used meanwhile charged then.
  const auto wall = std::chrono::steady_clock::now();
  if (now_or_later && wall - charged_at_ < kChargeEvery) return;
  charged_at_ = wall;
  const absl::Duration now = ThreadCpuTime();
  cpu->Charge(now - cpu_mark_);
  cpu_mark_ = now;
}

bool RingThreads::Thread::WaitForCpu() {
  RingCpuAccount* const cpu = parent_->cpu_.get();
  if (cpu == nullptr) return false;
  const absl::Duration wait = cpu->Overdrawn();
  if (wait <= absl::ZeroDuration()) return false;
  // The uid's rings used more than their share: this thread serves nothing
  // until the share refills. Its clients' calls wait meanwhile; no other
  // uid's do. A ring added or stopped ends the wait (to be let go).
  {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&poked_), wait);
  }
  ChargeCpu();
  return true;
}

RingThreads::RingThreads(size_t max_threads,
                         std::shared_ptr<RingCpuAccount> cpu,
                         absl::Duration spin)
    : max_threads_(CanWaitOnMany() ? max_threads : 0),
      cpu_(std::move(cpu)),
      spin_(spin) {}

RingThreads::~RingThreads() {
  std::vector<std::unique_ptr<Thread>> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  threads.clear();  // joins: each ends once its last ring has left
}

void RingThreads::Add(RingServer* ring) {
  absl::MutexLock lock(&mu_);
  ReapEnded();
  if (max_threads_ != 0) {
    size_t running = 0;
    Thread* fewest = nullptr;
    size_t fewest_rings = kMaxRingsPerThread;
    for (const auto& t : threads_) {
      const size_t n = t->rings();
      if (n == 0) continue;  // ending
      ++running;
      if (n < fewest_rings) {
        fewest = t.get();
        fewest_rings = n;
      }
    }
    if (running >= max_threads_ && fewest != nullptr && fewest->TryAdd(ring)) {
      return;
    }
  }
  threads_.push_back(std::make_unique<Thread>(this, ring));
}

void RingThreads::MarkReleased(RingServer* ring) {
  absl::MutexLock lock(&mu_);
  ring->ended_.store(true);
}

void RingThreads::AwaitReleased(RingServer* ring) {
  absl::MutexLock lock(&mu_);
  // ended_ is set under mu_ (MarkReleased).
  auto released = [ring] { return ring->ended(); };
  mu_.Await(absl::Condition(&released));
}

size_t RingThreads::threads() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& t : threads_) n += t->ended() ? 0 : 1;
  return n;
}

void RingThreads::ReapEnded() {
  std::erase_if(threads_, [](const std::unique_ptr<Thread>& t) {
    return t->ended();
  });
}

}  // namespace hostkv
