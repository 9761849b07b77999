#include "server/state/daemon_ledger.h"

#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"
#include "server/cache/page_cache.h"
#include "server/state/ledger_format.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

constexpr char kDaemonMagic[8] = {'H', 'K', 'V', 'S', 'T', 'A', 'T', 'E'};
constexpr uint32_t kMaxSlots = 1u << 20;

}  // namespace

struct DaemonLedger::Header {
  LedgerHeaderStart start;
  uint32_t session_slots;
  uint32_t namespace_slots;
  uint64_t generation;
  uint64_t salt;
  uint64_t checksum;  // of the header with this field 0
  uint8_t reserved[kLedgerHeaderBytes - sizeof(LedgerHeaderStart) - 32];
};

struct DaemonLedger::SessionSlot {
  std::atomic<uint64_t> checksum;  // 0: empty
  uint32_t tag;
  uint32_t uid;
  uint32_t gid;
  uint32_t pid;
  uint8_t verified;
  uint8_t name_size;
  uint8_t reserved[6];
  int64_t opened_unix_ns;
  uint8_t secret_sha256[32];
  char name[200];
};

struct DaemonLedger::NamespaceSlot {
  std::atomic<uint64_t> checksum;  // 0: empty
  uint8_t unverified;
  uint8_t size;
  uint8_t reserved[2];
  uint32_t uid;
  char name[kMaxCacheNamespaceBytes];
};

namespace {

template <typename Slot>
uint64_t SlotSum(const Slot& slot, uint64_t seed) {
  return LedgerChecksum(reinterpret_cast<const uint8_t*>(&slot) + 8,
                        sizeof(Slot) - 8, seed);
}

}  // namespace

uint64_t DaemonLedger::Layout() {
  static_assert(sizeof(DaemonLedger::Header) == kLedgerHeaderBytes);
  static_assert(sizeof(DaemonLedger::SessionSlot) == 272);
  static_assert(sizeof(DaemonLedger::NamespaceSlot) == 144);
  return LedgerMix(sizeof(Header) ^ (sizeof(SessionSlot) << 16) ^
                   (sizeof(NamespaceSlot) << 32));
}

uint64_t DaemonLedger::BytesFor(uint64_t session_slots,
                                uint64_t namespace_slots) {
  return kLedgerHeaderBytes + session_slots * sizeof(SessionSlot) +
         namespace_slots * sizeof(NamespaceSlot);
}

DaemonLedger::DaemonLedger(ShmSegment segment, uint32_t session_slots,
                           uint32_t namespace_slots, uint64_t generation)
    : segment_(std::move(segment)),
      session_slots_(session_slots),
      namespace_slots_(namespace_slots),
      generation_(generation) {
  for (uint32_t s = session_slots; s-- > 0;) free_slots_.push_back(s);
}

DaemonLedger::SessionSlot* DaemonLedger::Sessions() const {
  return reinterpret_cast<SessionSlot*>(segment_.data() + kLedgerHeaderBytes);
}

DaemonLedger::NamespaceSlot* DaemonLedger::Namespaces() const {
  return reinterpret_cast<NamespaceSlot*>(
      segment_.data() + kLedgerHeaderBytes +
      uint64_t{session_slots_} * sizeof(SessionSlot));
}

absl::StatusOr<std::unique_ptr<DaemonLedger>> DaemonLedger::Create(
    uint32_t session_slots, uint32_t namespace_slots, uint64_t generation) {
  if (session_slots == 0 || session_slots > kMaxSlots || namespace_slots == 0 ||
      namespace_slots > kMaxSlots) {
    return absl::InvalidArgumentError("daemon ledger: bad slot counts");
  }
  ASSIGN_OR_RETURN(ShmSegment segment,
                   ShmSegment::CreateSealed(
                       "hostkv.ledger.daemon",
                       BytesFor(session_slots, namespace_slots)));
  auto* header = reinterpret_cast<Header*>(segment.data());
  FillLedgerStart(header->start, kDaemonMagic, Layout());
  header->session_slots = session_slots;
  header->namespace_slots = namespace_slots;
  header->generation = generation;
  header->salt = LedgerSalt();
  header->checksum = 0;
  header->checksum = LedgerChecksum(header, sizeof(Header), 0);
  return std::unique_ptr<DaemonLedger>(new DaemonLedger(
      std::move(segment), session_slots, namespace_slots, generation));
}

absl::StatusOr<std::unique_ptr<DaemonLedger>> DaemonLedger::Open(ScopedFd fd) {
  const std::string what = "the daemon ledger";
  ASSIGN_OR_RETURN(ShmSegment segment,
                   ShmSegment::AdoptSealed(std::move(fd), "hostkv.ledger.daemon", 1));
  auto* header = reinterpret_cast<Header*>(segment.data());
  RETURN_IF_ERROR(CheckLedgerStart(header->start, segment.size(), kDaemonMagic,
                                   Layout(), what));
  Header copy;
  std::memcpy(&copy, header, sizeof(Header));
  copy.checksum = 0;
  if (LedgerChecksum(&copy, sizeof(Header), 0) != header->checksum) {
    return absl::FailedPreconditionError(what + ": its header fails its checksum");
  }
  if (header->session_slots == 0 || header->session_slots > kMaxSlots ||
      header->namespace_slots == 0 || header->namespace_slots > kMaxSlots ||
      BytesFor(header->session_slots, header->namespace_slots) > segment.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": its slots do not fit its ", segment.size(), " bytes (truncated?)"));
  }
  const uint32_t sessions = header->session_slots;
  const uint32_t namespaces = header->namespace_slots;
  const uint64_t generation = header->generation;
  auto ledger = std::unique_ptr<DaemonLedger>(
      new DaemonLedger(std::move(segment), sessions, namespaces, generation));
  return ledger;
}

DaemonLedger::Contents DaemonLedger::Read() const {
  Contents contents;
  const uint64_t salt = reinterpret_cast<const Header*>(segment_.data())->salt;
  const SessionSlot* sessions = Sessions();
  for (uint32_t s = 0; s < session_slots_; ++s) {
    const SessionSlot& slot = sessions[s];
    const uint64_t sum = slot.checksum.load(std::memory_order_acquire);
    if (sum == 0) continue;
    if (sum != SlotSum(slot, salt ^ s) || slot.name_size > sizeof(slot.name) ||
        slot.tag == kNoOwner || slot.tag >= kUnscrubbedMark) {
      ++contents.unproven;
      continue;
    }
    SessionRecord r;
    r.tag = slot.tag;
    r.verified = slot.verified != 0;
    r.uid = slot.uid;
    r.gid = slot.gid;
    r.pid = slot.pid;
    r.opened_unix_ns = slot.opened_unix_ns;
    r.secret_sha256.assign(reinterpret_cast<const char*>(slot.secret_sha256), 32);
    r.client_name.assign(slot.name, slot.name_size);
    contents.sessions.push_back(std::move(r));
  }
  const NamespaceSlot* namespaces = Namespaces();
  for (uint32_t s = 0; s < namespace_slots_; ++s) {
    const NamespaceSlot& slot = namespaces[s];
    const uint64_t sum = slot.checksum.load(std::memory_order_acquire);
    if (sum == 0) continue;
    if (sum != SlotSum(slot, salt ^ (uint64_t{s} << 32)) || slot.size == 0 ||
        slot.size > sizeof(slot.name)) {
      ++contents.unproven;
      continue;
    }
    NamespaceRecord r;
    r.name.assign(slot.name, slot.size);
    r.owner.unverified = slot.unverified != 0;
    r.owner.uid = slot.uid;
    contents.namespaces.push_back(std::move(r));
  }
  return contents;
}

bool DaemonLedger::RecordSession(const SessionRecord& record) {
  const uint64_t salt = reinterpret_cast<const Header*>(segment_.data())->salt;
  uint32_t s;
  {
    absl::MutexLock lock(&mu_);
    auto it = slot_of_.find(record.tag);
    if (it != slot_of_.end()) {
      s = it->second;
    } else if (free_slots_.empty()) {
      if (!warned_) {
        spdlog::warn("daemon ledger: all {} session slots are taken; sessions "
                     "opened now will not survive a restart",
                     session_slots_);
        warned_ = true;
      }
      return false;
    } else {
      s = free_slots_.back();
      free_slots_.pop_back();
      slot_of_[record.tag] = s;
    }
    SessionSlot& slot = Sessions()[s];
    slot.checksum.store(0, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    slot.tag = record.tag;
    slot.uid = record.uid;
    slot.gid = record.gid;
    slot.pid = record.pid;
    slot.verified = record.verified ? 1 : 0;
    slot.name_size = static_cast<uint8_t>(
        std::min(record.client_name.size(), sizeof(slot.name)));
    std::memset(slot.reserved, 0, sizeof(slot.reserved));
    slot.opened_unix_ns = record.opened_unix_ns;
    std::memset(slot.secret_sha256, 0, sizeof(slot.secret_sha256));
    std::memcpy(slot.secret_sha256, record.secret_sha256.data(),
                std::min<size_t>(32, record.secret_sha256.size()));
    std::memset(slot.name, 0, sizeof(slot.name));
    std::memcpy(slot.name, record.client_name.data(), slot.name_size);
    const uint64_t sum = SlotSum(slot, salt ^ s);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    slot.checksum.store(sum, std::memory_order_release);
  }
  return true;
}

void DaemonLedger::EraseSession(OwnerTag tag) {
  absl::MutexLock lock(&mu_);
  auto it = slot_of_.find(tag);
  if (it == slot_of_.end()) return;
  Sessions()[it->second].checksum.store(0, std::memory_order_release);
  free_slots_.push_back(it->second);
  slot_of_.erase(it);
}

bool DaemonLedger::RecordNamespace(const NamespaceRecord& record) {
  if (record.name.empty() || record.name.size() > kMaxCacheNamespaceBytes) {
    return false;
  }
  const uint64_t salt = reinterpret_cast<const Header*>(segment_.data())->salt;
  absl::MutexLock lock(&mu_);
  uint32_t s;
  if (auto it = namespace_slot_of_.find(record.name);
      it != namespace_slot_of_.end()) {
    s = it->second;
  } else if (!free_namespace_slots_.empty()) {
    s = free_namespace_slots_.back();
    free_namespace_slots_.pop_back();
  } else if (namespaces_used_ < namespace_slots_) {
    s = namespaces_used_++;
  } else {
    spdlog::warn("daemon ledger: all {} namespace slots are taken; the owner "
                 "of namespace '{}' (and its cached keys) will not survive a "
                 "restart",
                 namespace_slots_, record.name);
    return false;
  }
  namespace_slot_of_[record.name] = s;
  NamespaceSlot& slot = Namespaces()[s];
  slot.checksum.store(0, std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  slot.unverified = record.owner.unverified ? 1 : 0;
  slot.size = static_cast<uint8_t>(record.name.size());
  std::memset(slot.reserved, 0, sizeof(slot.reserved));
  slot.uid = record.owner.uid;
  std::memset(slot.name, 0, sizeof(slot.name));
  std::memcpy(slot.name, record.name.data(), record.name.size());
  const uint64_t sum = SlotSum(slot, salt ^ (uint64_t{s} << 32));
  std::atomic_signal_fence(std::memory_order_seq_cst);
  slot.checksum.store(sum, std::memory_order_release);
  return true;
}

void DaemonLedger::EraseNamespace(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = namespace_slot_of_.find(name);
  if (it == namespace_slot_of_.end()) return;
  Namespaces()[it->second].checksum.store(0, std::memory_order_release);
  free_namespace_slots_.push_back(it->second);
  namespace_slot_of_.erase(it);
}

uint32_t DaemonLedger::namespaces_recorded() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(namespace_slot_of_.size());
}

}  // namespace hostkv
