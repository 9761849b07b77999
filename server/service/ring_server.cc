#include "server/service/ring_server.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/service/ring_call.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// A word the client may write at any time: read once, as it is now.
uint32_t ReadShared(const uint32_t& word) {
  return __atomic_load_n(&word, __ATOMIC_RELAXED);
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
  std::shared_ptr<RingThreads> threads = grant.threads();
  std::unique_ptr<RingServer> ring(
      new RingServer(handler, std::move(session_id), std::move(grant),
                     std::move(*segment), slots, slot_bytes));
  if (threads == nullptr) {
    threads = std::make_shared<RingThreads>(/*max_threads=*/0, nullptr, spin);
    ring->own_threads_ = threads;
  }
  ring->threads_ = threads.get();
  threads->Add(ring.get());
  return ring;
}

RingServer::RingServer(RequestHandler* handler, std::string session_id,
                       RingGrant grant, ShmSegment segment, uint32_t slots,
                       uint32_t slot_bytes)
    : handler_(handler),
      session_id_(std::move(session_id)),
      grant_(std::move(grant)),
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
  threads_->AwaitReleased(this);  // Start handed it to threads_
}

absl::StatusOr<ScopedFd> RingServer::ClientFd() const {
  return segment_.ReopenFd(ShmSegment::Access::kReadWrite);
}

void RingServer::Stop() {
  stop_.store(true, std::memory_order_release);
  {
    absl::MutexLock lock(&mu_);
    if (thread_ != nullptr) RingThreads::Poke(thread_);
  }
  // A thread serving this ring alone sleeps on its doorbell.
  header()->doorbell.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeShared(&header()->doorbell);
}

void RingServer::Attach(RingThreads::Thread* thread) {
  absl::MutexLock lock(&mu_);
  thread_ = thread;
}

void RingServer::Release() {
  {
    absl::MutexLock lock(&mu_);
    thread_ = nullptr;
  }
  threads_->MarkReleased(this);  // the last the thread touches of it
}

bool RingServer::Submitted(uint32_t i) const {
  return RingSlotAt(segment_.data(), slot_bytes_, i)
             ->state.load(std::memory_order_acquire) == kSlotSubmitted;
}

void RingServer::SetDaemonIdle(bool idle) const {
  header()->daemon_idle.store(idle ? 1 : 0, std::memory_order_seq_cst);
}

void RingServer::Serve(uint32_t i) {
  RingSlot* slot = RingSlotAt(segment_.data(), slot_bytes_, i);
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
