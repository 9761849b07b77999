#include "client/command_ring_client.h"

#include <sched.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hostkv {
namespace {

// How long a caller polls its slot before sleeping on it: the call blocks
// the caller anyway, and an answer it sleeps through costs it a wake-up
// (50-100 µs on some VMs). Calls that take longer (a Lookup waiting for
// the storage tier, a Publish waiting for copies) sleep after this.
constexpr auto kSpin = std::chrono::microseconds(1000);
// The first part of it without yielding this CPU: a typical call's answer
// comes in that time, and a copy thread the call woke must not get this
// CPU before the caller sees it.
constexpr auto kSpinAlone = std::chrono::microseconds(20);
constexpr absl::Duration kSlice = absl::Milliseconds(50);

}  // namespace

absl::StatusOr<std::unique_ptr<RingClient>> RingClient::Map(int fd,
                                                            uint64_t size) {
  absl::StatusOr<ShmSegment> segment =
      ShmSegment::MapFd(fd, "command ring", ShmSegment::Access::kReadWrite);
  if (!segment.ok()) return segment.status();
  if (segment->size() < sizeof(RingHeader) || segment->size() < size) {
    return absl::InternalError("the command ring is smaller than announced");
  }
  const auto* h = reinterpret_cast<const RingHeader*>(segment->data());
  const uint32_t slots = h->slots;
  const uint32_t slot_bytes = h->slot_bytes;
  if (h->magic != kRingMagic || h->version != kRingVersion || slots == 0 ||
      slots > 64 || slot_bytes <= sizeof(RingSlot) ||
      slot_bytes % alignof(RingSlot) != 0 ||
      RingSegmentBytes(slots, slot_bytes) > segment->size()) {
    return absl::InternalError(absl::StrCat(
        "the daemon's command ring is not version ", kRingVersion));
  }
  return std::unique_ptr<RingClient>(
      new RingClient(std::move(*segment), slots, slot_bytes));
}

RingClient::RingClient(ShmSegment segment, uint32_t slots, uint32_t slot_bytes)
    : segment_(std::move(segment)),
      slots_(slots),
      slot_bytes_(slot_bytes),
      free_mask_(slots == 64 ? ~uint64_t{0} : (uint64_t{1} << slots) - 1) {}

int RingClient::TakeSlot() {
  uint64_t mask = free_mask_.load();
  while (mask != 0) {
    const int index = __builtin_ctzll(mask);
    if (free_mask_.compare_exchange_weak(mask, mask & ~(uint64_t{1} << index))) {
      return index;
    }
  }
  return -1;
}

void RingClient::ReturnSlot(int index) {
  free_mask_.fetch_or(uint64_t{1} << index);
}

std::optional<absl::StatusOr<std::string>> RingClient::Call(
    RingMethod method, const std::string& request, absl::Duration timeout,
    const std::function<bool()>& hung_up) {
  const uint64_t capacity = slot_bytes_ - sizeof(RingSlot);
  if (request.size() > capacity) return std::nullopt;
  const int index = TakeSlot();
  if (index < 0) return std::nullopt;
  RingSlot* slot = RingSlotAt(segment_.data(), slot_bytes_, index);
  std::memcpy(RingPayload(slot), request.data(), request.size());
  slot->method = static_cast<uint32_t>(method);
  slot->length = static_cast<uint32_t>(request.size());
  slot->timeout_ms = 0;
  slot->state.store(kSlotSubmitted, std::memory_order_seq_cst);
  RingHeader* h = header();
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h->daemon_idle.load(std::memory_order_seq_cst) != 0) {
    FutexWakeShared(&h->doorbell);
  }
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  const auto yield_from = std::chrono::steady_clock::now() + kSpinAlone;
  for (uint32_t n = 1; slot->state.load(std::memory_order_acquire) != kSlotAnswered;
       ++n) {
    if (n % 64 != 0) continue;
    const auto now = std::chrono::steady_clock::now();
    if (now >= spin_until) break;
    // On a busy machine the daemon's thread may wait for this CPU.
    if (now >= yield_from) sched_yield();
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (slot->state.load(std::memory_order_acquire) != kSlotAnswered) {
    FutexWaitShared(&slot->state, kSlotSubmitted, kSlice);
    if (slot->state.load(std::memory_order_acquire) == kSlotAnswered) break;
    if (hung_up()) {
      return absl::UnavailableError(
          "the daemon closed the session socket during a call");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          "the daemon did not answer a command ring call in time");
    }
  }
  const uint32_t code = slot->code;
  const uint32_t length = std::min<uint64_t>(slot->length, capacity);
  std::string answer(reinterpret_cast<const char*>(RingPayload(slot)), length);
  slot->state.store(kSlotFree, std::memory_order_relaxed);
  ReturnSlot(index);
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (code == kRingUseGrpc) return std::nullopt;
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(
        absl::StrCat("the command ring answered code ", code));
  }
  if (code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(code), answer);
  }
  return answer;
}

}  // namespace hostkv
