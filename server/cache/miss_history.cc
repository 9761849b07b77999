#include "server/cache/miss_history.h"

#include <numeric>

namespace hostkv {

const char* MissReasonName(MissReason reason) {
  switch (reason) {
    case MissReason::kNeverPublished:
      return "never_published";
    case MissReason::kEvicted:
      return "evicted";
    case MissReason::kOtherNamespace:
      return "other_namespace";
    case MissReason::kRefused:
      return "refused";
    case MissReason::kDigestMismatch:
      return "digest_mismatch";
    case MissReason::kTierFailed:
      return "tier_failed";
  }
  return "unknown";
}

uint64_t MissCounters::missed() const {
  return std::accumulate(missed_by_reason.begin(), missed_by_reason.end(), uint64_t{0});
}

MissHistory::MissHistory(size_t slots)
    : mask_(slots - 1), by_ns_key_(slots), by_key_(slots) {}

void MissHistory::Published(uint16_t ns, uint64_t ns_key, uint64_t key) {
  by_ns_key_[ns_key & mask_] = Slot{Tag(ns_key), 0, 0, ns};
  by_key_[key & mask_] = KeySlot{Tag(key), ns};
}

void MissHistory::Evicted(uint16_t ns, uint64_t ns_key, uint32_t for_session,
                          absl::Time now) {
  Slot& slot = by_ns_key_[ns_key & mask_];
  slot = Slot{Tag(ns_key), absl::ToUnixSeconds(now), for_session, ns};
}

void MissHistory::Dropped(uint16_t ns, uint64_t ns_key, MissReason why, absl::Time now) {
  Slot& slot = by_ns_key_[ns_key & mask_];
  slot = Slot{Tag(ns_key), absl::ToUnixSeconds(now), 0, ns, why};
}

bool MissHistory::EverPublished(uint64_t ns_key) const {
  return by_ns_key_[ns_key & mask_].tag == Tag(ns_key);
}

MissExplanation MissHistory::Explain(uint16_t ns, uint64_t ns_key, uint64_t key) const {
  MissExplanation why;
  const Slot& slot = by_ns_key_[ns_key & mask_];
  if (ns != kUnknownNamespace && slot.tag == Tag(ns_key) && slot.evicted_at_s != 0) {
    why.reason = slot.why;
    why.evicted_at = absl::FromUnixSeconds(slot.evicted_at_s);
    why.evicted_for_session = slot.for_session;
    return why;
  }
  const KeySlot& other = by_key_[key & mask_];
  if (other.tag == Tag(key) && other.ns != ns) {
    why.reason = MissReason::kOtherNamespace;
    why.other_ns = other.ns;
    return why;
  }
  why.reason = MissReason::kNeverPublished;
  return why;
}

MissCounters& MissHistory::At(uint16_t ns) {
  if (ns == kUnknownNamespace) return unknown_;
  if (counters_.size() <= ns) counters_.resize(size_t{ns} + 1);
  return counters_[ns];
}

void MissHistory::CountLookup(uint16_t ns, bool reusable) {
  MissCounters& c = At(ns);
  ++c.lookups;
  c.reusable_lookups += reusable;
}

void MissHistory::CountMiss(uint16_t ns, absl::string_view name_space, absl::string_view key,
                            const MissExplanation& why, absl::Time now) {
  ++At(ns).missed_by_reason[static_cast<int>(why.reason)];
  if (recent_.size() == kRecent) recent_.pop_front();
  recent_.push_back(RecentMiss{std::string(name_space), std::string(key), now, why});
}

const MissCounters& MissHistory::CountersOf(uint16_t ns) const {
  static const MissCounters kNone;
  if (ns == kUnknownNamespace) return unknown_;
  return ns < counters_.size() ? counters_[ns] : kNone;
}

namespace {
constexpr size_t kRecentBytes = sizeof(RecentMiss) + 192;  // with key and namespace text
}  // namespace

size_t MissHistory::MemoryBytes() const {
  return by_ns_key_.capacity() * sizeof(Slot) + by_key_.capacity() * sizeof(KeySlot) +
         counters_.capacity() * sizeof(MissCounters) + recent_.size() * kRecentBytes;
}

size_t MissHistory::MaxMemoryBytes() const {
  return by_ns_key_.capacity() * sizeof(Slot) + by_key_.capacity() * sizeof(KeySlot) +
         counters_.capacity() * sizeof(MissCounters) + kRecent * kRecentBytes;
}

size_t MissHistory::SlotsFor(uint64_t pages) {
  size_t slots = 4096;
  while (slots < kSlots && slots < pages * 8) slots <<= 1;
  return slots;
}

}  // namespace hostkv
