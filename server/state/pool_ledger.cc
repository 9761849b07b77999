#include "server/state/pool_ledger.h"

#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"
#include "server/state/ledger_format.h"

namespace hostkv {
namespace {

constexpr char kPoolMagic[8] = {'H', 'K', 'V', 'P', 'O', 'O', 'L', '1'};
constexpr uint64_t kOsPage = 4096;

uint64_t AlignUp(uint64_t n) { return (n + kOsPage - 1) / kOsPage * kOsPage; }

}  // namespace

struct PoolLedger::Header {
  LedgerHeaderStart start;
  uint64_t num_pages;
  uint64_t salt;
  uint32_t spec_bytes;   // serialized v1::PoolSpec
  uint32_t owner_bytes;  // serialized v1::PoolOwner, after the spec
  uint64_t checksum;     // of the header with this field 0
  uint8_t blob[kLedgerHeaderBytes - sizeof(LedgerHeaderStart) - 32];
};

struct PoolLedger::CacheRecord {
  std::atomic<uint64_t> checksum;  // 0: empty
  uint64_t use;
  uint64_t parent;
  uint8_t ns_size;
  uint8_t key_size;
  // The page's digest (server/cache/page_digest.h) when digest_known is 1.
  // Format 1 ledgers written before digests kept these bytes zero (and
  // readers ignored them): such a record reads as "no digest", and a
  // daemon of then reads this one's as it always did.
  uint8_t digest_known;
  uint8_t reserved;
  uint32_t digest;
  char ns[kMaxCacheNamespaceBytes];
  char key[kMaxCacheKeyBytes];
};

uint64_t PoolLedger::Layout() {
  static_assert(sizeof(PoolLedger::Header) == kLedgerHeaderBytes);
  static_assert(sizeof(PoolLedger::CacheRecord) == 224);
  return LedgerMix(sizeof(Header) ^ (sizeof(CacheRecord) << 16) ^
                   (kMaxCacheKeyBytes << 32) ^ (kMaxCacheNamespaceBytes << 40));
}

uint64_t PoolLedger::BytesFor(uint64_t num_pages) {
  return AlignUp(kLedgerHeaderBytes + 8 * num_pages) +
         AlignUp(sizeof(CacheRecord) * num_pages);
}

PoolLedger::PoolLedger(ShmSegment segment, v1::PoolSpec spec,
                       v1::PoolOwner owner, uint64_t num_pages, uint64_t salt)
    : segment_(std::move(segment)),
      spec_(std::move(spec)),
      owner_(std::move(owner)),
      num_pages_(num_pages),
      salt_(salt) {}

uint64_t* PoolLedger::Words() const {
  return reinterpret_cast<uint64_t*>(segment_.data() + kLedgerHeaderBytes);
}

PoolLedger::CacheRecord* PoolLedger::Records() const {
  return reinterpret_cast<CacheRecord*>(
      segment_.data() + AlignUp(kLedgerHeaderBytes + 8 * num_pages_));
}

uint64_t PoolLedger::WordOf(uint64_t page, OwnerTag owner, bool publishing) const {
  const uint64_t check = LedgerMix(salt_ ^ (page * 0x9e3779b97f4a7c15ULL) ^
                                   (uint64_t{owner} << 1) ^
                                   (publishing ? 1 : 0)) >>
                         32;
  // A zero word would read as "free, check 0": never valid, so a segment of
  // zeros proves nothing.
  return uint64_t{owner} | (check << 32) | (check == 0 ? (1ULL << 63) : 0);
}

absl::StatusOr<std::unique_ptr<PoolLedger>> PoolLedger::Create(
    const v1::PoolSpec& spec, const v1::PoolOwner& owner, uint64_t num_pages) {
  const std::string spec_bytes = spec.SerializeAsString();
  const std::string owner_bytes = owner.SerializeAsString();
  if (spec_bytes.size() + owner_bytes.size() > sizeof(Header::blob)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool '", spec.name(), "': its spec is too large for the ledger"));
  }
  ASSIGN_OR_RETURN(ShmSegment segment,
                   ShmSegment::CreateSealed(
                       absl::StrCat("hostkv.ledger.pool.", spec.name()),
                       BytesFor(num_pages)));
  auto* header = reinterpret_cast<Header*>(segment.data());
  FillLedgerStart(header->start, kPoolMagic, Layout());
  header->num_pages = num_pages;
  header->salt = LedgerSalt();
  header->spec_bytes = static_cast<uint32_t>(spec_bytes.size());
  header->owner_bytes = static_cast<uint32_t>(owner_bytes.size());
  std::memcpy(header->blob, spec_bytes.data(), spec_bytes.size());
  std::memcpy(header->blob + spec_bytes.size(), owner_bytes.data(),
              owner_bytes.size());
  header->checksum = 0;
  header->checksum = LedgerChecksum(header, sizeof(Header), 0);
  auto ledger = std::unique_ptr<PoolLedger>(
      new PoolLedger(std::move(segment), spec, owner, num_pages, header->salt));
  ledger->RecordOwner(0, num_pages, kNoOwner);
  return ledger;
}

absl::StatusOr<std::unique_ptr<PoolLedger>> PoolLedger::Open(
    ScopedFd fd, const std::string& what) {
  ASSIGN_OR_RETURN(ShmSegment segment,
                   ShmSegment::AdoptSealed(std::move(fd), what, 1));
  auto* header = reinterpret_cast<Header*>(segment.data());
  RETURN_IF_ERROR(CheckLedgerStart(header->start, segment.size(), kPoolMagic,
                                   Layout(), what));
  Header copy;
  std::memcpy(&copy, header, sizeof(Header));
  copy.checksum = 0;
  if (LedgerChecksum(&copy, sizeof(Header), 0) != header->checksum) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": its header fails its checksum"));
  }
  if (header->num_pages == 0 || header->num_pages > kMaxCachePages ||
      BytesFor(header->num_pages) > segment.size() ||
      uint64_t{header->spec_bytes} + header->owner_bytes > sizeof(Header::blob)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", header->num_pages, " pages do not fit its ",
        segment.size(), " bytes"));
  }
  v1::PoolSpec spec;
  v1::PoolOwner owner;
  if (!spec.ParseFromArray(header->blob, static_cast<int>(header->spec_bytes)) ||
      !owner.ParseFromArray(header->blob + header->spec_bytes,
                            static_cast<int>(header->owner_bytes))) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": its pool spec does not parse"));
  }
  const uint64_t num_pages = header->num_pages;
  const uint64_t salt = header->salt;
  return std::unique_ptr<PoolLedger>(new PoolLedger(
      std::move(segment), std::move(spec), std::move(owner), num_pages, salt));
}

void PoolLedger::RecordOwner(uint64_t first_page, uint64_t num_pages,
                             OwnerTag owner) {
  uint64_t* words = Words();
  for (uint64_t p = first_page; p < first_page + num_pages; ++p) {
    __atomic_store_n(&words[p], WordOf(p, owner), __ATOMIC_RELAXED);
  }
}

void PoolLedger::RecordPublishing(uint64_t page, OwnerTag publisher) {
  __atomic_store_n(&Words()[page], WordOf(page, publisher, true),
                   __ATOMIC_RELAXED);
}

void PoolLedger::RecordCached(uint64_t page, absl::string_view name_space,
                              absl::string_view key, uint64_t parent,
                              uint64_t use) {
  CacheRecord& r = Records()[page];
  r.checksum.store(0, std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  r.use = use;
  r.parent = parent;
  r.ns_size = static_cast<uint8_t>(name_space.size());
  r.key_size = static_cast<uint8_t>(key.size());
  r.digest_known = 0;
  r.reserved = 0;
  r.digest = 0;
  std::memset(r.ns, 0, sizeof(r.ns));
  std::memset(r.key, 0, sizeof(r.key));
  std::memcpy(r.ns, name_space.data(), name_space.size());
  std::memcpy(r.key, key.data(), key.size());
  const uint64_t sum = LedgerChecksum(reinterpret_cast<const uint8_t*>(&r) + 8,
                                      sizeof(CacheRecord) - 8, salt_ ^ page);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  r.checksum.store(sum, std::memory_order_release);
}

void PoolLedger::RecordDigest(uint64_t page, uint32_t digest) {
  CacheRecord& r = Records()[page];
  if (r.checksum.load(std::memory_order_relaxed) == 0) return;  // not recorded
  r.checksum.store(0, std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  r.digest = digest;
  r.digest_known = 1;
  const uint64_t sum = LedgerChecksum(reinterpret_cast<const uint8_t*>(&r) + 8,
                                      sizeof(CacheRecord) - 8, salt_ ^ page);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  r.checksum.store(sum, std::memory_order_release);
}

void PoolLedger::RecordEvicted(uint64_t page) {
  Records()[page].checksum.store(0, std::memory_order_release);
}

PoolLedger::Contents PoolLedger::Read() const {
  Contents contents;
  contents.owners.resize(num_pages_);
  const uint64_t* words = Words();
  for (uint64_t p = 0; p < num_pages_; ++p) {
    const uint64_t word = __atomic_load_n(&words[p], __ATOMIC_RELAXED);
    const auto owner = static_cast<OwnerTag>(word & 0xffffffffu);
    if (word == WordOf(p, owner)) {
      contents.owners[p] = owner;
    } else if (word == WordOf(p, owner, true)) {
      contents.owners[p] = owner;
      contents.publishing.push_back(p);
    } else {
      contents.owners[p] = kUnscrubbedMark;
      ++contents.unproven_pages;
    }
  }
  const CacheRecord* records = Records();
  for (uint64_t p = 0; p < num_pages_; ++p) {
    const CacheRecord& r = records[p];
    const uint64_t sum = r.checksum.load(std::memory_order_acquire);
    if (sum == 0) continue;
    if (sum != LedgerChecksum(reinterpret_cast<const uint8_t*>(&r) + 8,
                              sizeof(CacheRecord) - 8, salt_ ^ p) ||
        r.ns_size == 0 || r.ns_size > kMaxCacheNamespaceBytes ||
        r.key_size == 0 || r.key_size > kMaxCacheKeyBytes) {
      ++contents.unproven_entries;
      continue;
    }
    AdoptedEntry e;
    e.page = p;
    e.name_space.assign(r.ns, r.ns_size);
    e.key.assign(r.key, r.key_size);
    e.parent = r.parent == CacheLedger::kNoParent ? UINT64_MAX : r.parent;
    e.use = r.use;
    if (r.digest_known == 1) e.digest = r.digest;
    contents.entries.push_back(std::move(e));
  }
  return contents;
}

}  // namespace hostkv
