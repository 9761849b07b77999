#include "server/service/ring_server.h"

#include <sched.h>
#include <time.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/service/ring_call.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A word the client may write at any time: read once, as it is now.
uint32_t ReadShared(const uint32_t& word) {
  return __atomic_load_n(&word, __ATOMIC_RELAXED);
}

// The calling thread's CPU time.
absl::Duration ThreadCpuTime() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return absl::DurationFromTimespec(ts);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingServer>> RingServer::Start(
    RequestHandler* handler, std::string session_id, RingGrant grant,
    absl::Duration spin, uint32_t slots, uint32_t slot_bytes) {
  if (slots == 0 || slot_bytes < 2 * sizeof(RingSlot) ||
      slot_bytes % alignof(RingSlot) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad command ring shape: ", slots, " slots of ", slot_bytes, " bytes"));
  }
  absl::StatusOr<ShmSegment> segment = ShmSegment::CreateSealed(
      "hostkv-ring", RingSegmentBytes(slots, slot_bytes));
  if (!segment.ok()) return segment.status();
  std::unique_ptr<RingServer> ring(
      new RingServer(handler, std::move(session_id), std::move(grant), spin,
                     std::move(*segment), slots, slot_bytes));
  ring->thread_ = std::thread([r = ring.get()] { r->Loop(); });
  return ring;
}

RingServer::RingServer(RequestHandler* handler, std::string session_id,
                       RingGrant grant, absl::Duration spin, ShmSegment segment,
                       uint32_t slots, uint32_t slot_bytes)
    : handler_(handler),
      session_id_(std::move(session_id)),
      grant_(std::move(grant)),
      spin_(spin),
      segment_(std::move(segment)),
      slots_(slots),
      slot_bytes_(slot_bytes) {
  RingHeader* h = header();
  h->magic = kRingMagic;
  h->version = kRingVersion;
  h->slots = slots_;
  h->slot_bytes = slot_bytes_;
  h->doorbell.store(0);
  h->daemon_idle.store(0);
  for (uint32_t i = 0; i < slots_; ++i) {
    RingSlotAt(segment_.data(), slot_bytes_, i)->state.store(kSlotFree);
  }
  request_.reserve(slot_bytes_);
}

RingServer::~RingServer() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<ScopedFd> RingServer::ClientFd() const {
  return segment_.ReopenFd(ShmSegment::Access::kReadWrite);
}

void RingServer::Stop() {
  if (!stop_.exchange(true)) stopping_.Notify();
  header()->doorbell.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeShared(&header()->doorbell);
}

void RingServer::Loop() {
  RingHeader* h = header();
  auto last_call = std::chrono::steady_clock::now();
  uint32_t polls = 0;
  const auto spin = absl::ToChronoNanoseconds(spin_);
  cpu_mark_ = ThreadCpuTime();
  while (!stop_.load(std::memory_order_relaxed)) {
    if (ServeSubmitted()) {
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
        if (grant_.cpu() != nullptr &&
            grant_.cpu()->Overdrawn() > absl::ZeroDuration()) {
          last_call -= spin;
        }
      } else {
        CpuRelax();
      }
      continue;
    }
    ChargeCpu();
    // Idle: announce it, then look once more before sleeping (a client
    // that submitted before reading daemon_idle == 0 is seen here).
    h->daemon_idle.store(1, std::memory_order_seq_cst);
    const uint32_t seen = h->doorbell.load(std::memory_order_seq_cst);
    if (!ServeSubmitted() && !stop_.load()) {
      // A bounded sleep: a client rewriting the doorbell can only delay
      // its own ring's end.
      FutexWaitShared(&h->doorbell, seen, absl::Seconds(1));
    }
    ChargeCpu();
    h->daemon_idle.store(0, std::memory_order_seq_cst);
    last_call = std::chrono::steady_clock::now();
  }
  ended_.store(true);
}

void RingServer::ChargeCpu(bool now_or_later) {
  if (grant_.cpu() == nullptr) return;
  // Reading the thread's CPU time is a system call: on the hot path it is
  // read at most every kChargeEvery, the CPU used meanwhile charged then.
  const auto wall = std::chrono::steady_clock::now();
  if (now_or_later && wall - charged_at_ < kChargeEvery) return;
  charged_at_ = wall;
  const absl::Duration now = ThreadCpuTime();
  grant_.cpu()->Charge(now - cpu_mark_);
  cpu_mark_ = now;
}

bool RingServer::WaitForCpu() {
  if (grant_.cpu() == nullptr) return false;
  const absl::Duration wait = grant_.cpu()->Overdrawn();
  if (wait <= absl::ZeroDuration()) return false;
  // The uid's rings used more than their share: this one serves nothing
  // until the share refills. Its client's calls wait meanwhile; no other
  // uid's do.
  stopping_.WaitForNotificationWithTimeout(wait);
  ChargeCpu();
  return true;
}

bool RingServer::ServeSubmitted() {
  bool served = false;
  for (uint32_t i = 0; i < slots_; ++i) {
    RingSlot* slot = RingSlotAt(segment_.data(), slot_bytes_, i);
    if (slot->state.load(std::memory_order_acquire) != kSlotSubmitted) continue;
    // Once per pass: the calls of one pass may overdraw the uid's share by
    // at most the ring's slots.
    if (!served && WaitForCpu()) return true;  // waited: look again
    RingCpuAccount* cpu = grant_.cpu();
    if (cpu != nullptr && !cpu->BeginCall(stopping_)) return true;  // stopped
    Serve(slot);
    if (cpu != nullptr) cpu->EndCall();
    served = true;
  }
  return served;
}

void RingServer::Serve(RingSlot* slot) {
  const uint64_t capacity = slot_bytes_ - sizeof(RingSlot);
  const uint32_t method = ReadShared(slot->method);
  const uint32_t length = ReadShared(slot->length);
  const uint32_t timeout_ms = ReadShared(slot->timeout_ms);
  RingAnswer answer;
  if (length > capacity) {
    answer.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
    answer.answer = absl::StrCat("a command ring request of ", length,
                                 " bytes; a slot holds ", capacity);
  } else if (absl::Status open = handler_->AwaitOpen(); !open.ok()) {
    answer.code = static_cast<uint32_t>(open.code());
    answer.answer = std::string(open.message());
  } else {
    // Copied before it is parsed: the client may change the slot meanwhile.
    request_.assign(reinterpret_cast<const char*>(RingPayload(slot)), length);
    const absl::Time deadline =
        absl::Now() +
        (timeout_ms == 0 ? absl::Seconds(60) : absl::Milliseconds(timeout_ms));
    answer = RunRingCall(*handler_, handler_->pools(), session_id_, method,
                         request_, deadline, capacity);
  }
  if (answer.code != kRingUseGrpc && handler_->metrics() != nullptr) {
    const char* name = RingMethodName(method);
    handler_->metrics()->RecordRpc(name != nullptr ? name : "CommandRing",
                                   static_cast<absl::StatusCode>(answer.code));
  }
  if (answer.answer.size() > capacity) {
    if (answer.code == 0) {
      // RunRingCall's bounds make this unreachable; if it is reached, the
      // call ran and its answer is lost to the client.
      spdlog::error("command ring: a {} answer of {} bytes exceeds the slot",
                    RingMethodName(method), answer.answer.size());
      answer.code = static_cast<uint32_t>(absl::StatusCode::kInternal);
      answer.answer = "the answer exceeds the command ring's slot";
    } else {
      answer.answer.resize(capacity);
    }
  }
  std::memcpy(RingPayload(slot), answer.answer.data(), answer.answer.size());
  __atomic_store_n(&slot->length, static_cast<uint32_t>(answer.answer.size()),
                   __ATOMIC_RELAXED);
  __atomic_store_n(&slot->code, answer.code, __ATOMIC_RELAXED);
  calls_.fetch_add(1, std::memory_order_relaxed);  // counted before it is seen
  slot->state.store(kSlotAnswered, std::memory_order_seq_cst);
  FutexWakeShared(&slot->state);
}

}  // namespace hostkv
