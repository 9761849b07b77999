// libFuzzer target over what a daemon adopts after a restart: a valid pool
// ledger (pages of live and dead sessions, cached keys with parents) with
// the input's edits applied (byte flips anywhere, header included, and a
// truncation), adopted by a fresh PoolRegistry. It must never crash, and
// what it adopts must be consistent: the allocator's counts add up, the page
// cache's structures agree, only cache-owned pages are cached, and every
// page it hands out again is zero. Also the daemon ledger, edited the same
// way, read back. tests/fuzz/run_fuzzer.sh runs it after request_fuzzer.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "server/cache/page_digest.h"
#include "server/pool/pool_registry.h"
#include "server/pool/pool_spec.h"
#include "server/state/daemon_ledger.h"
#include "server/state/pool_ledger.h"
#include "server/tier/crc32c.h"

namespace hostkv {
namespace {

constexpr uint32_t kPageSize = 2;
constexpr uint64_t kCapacityPages = 15;  // + the padding page: 16
constexpr uint64_t kFirstFreePage = 12;   // pages 12..15 are free

#define FUZZ_CHECK(cond)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "invariant violated: %s (%s:%d)\n", #cond, \
                   __FILE__, __LINE__);                               \
      std::abort();                                                   \
    }                                                                 \
  } while (0)

v1::PoolSpec Spec() {
  v1::PoolSpec spec;
  spec.set_name("fuzz");
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  spec.set_page_size(kPageSize);
  spec.set_capacity_tokens(kCapacityPages * kPageSize);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  spec.mutable_geometry()->mutable_mla()->set_num_layers(1);
  spec.mutable_geometry()->mutable_mla()->set_kv_lora_rank(4);
  spec.mutable_geometry()->mutable_mla()->set_qk_rope_head_dim(4);
  return spec;
}

std::vector<uint8_t> ReadAll(int fd) {
  const off_t size = lseek(fd, 0, SEEK_END);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (pread(fd, bytes.data(), bytes.size(), 0) != size) std::abort();
  return bytes;
}

ScopedFd Sealed(const uint8_t* data, size_t size) {
  ScopedFd fd(memfd_create("fuzz-ledger", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (size > 0 && write(fd.get(), data, size) != static_cast<ssize_t>(size)) std::abort();
  fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

// The input's edits: pairs of (offset: 3 bytes, value: 1 byte) xored into
// `bytes`; a first byte >= 0xf0 also truncates to a length from the next two.
void Apply(const uint8_t* data, size_t size, std::vector<uint8_t>& bytes) {
  size_t i = 0;
  if (size >= 3 && data[0] >= 0xf0) {
    const size_t keep = (size_t{data[1]} << 8 | data[2]) * 7;
    if (keep < bytes.size()) bytes.resize(std::max<size_t>(keep, 1));
    i = 3;
  }
  for (; i + 4 <= size; i += 4) {
    const size_t offset =
        (size_t{data[i]} << 16 | size_t{data[i + 1]} << 8 | data[i + 2]) %
        bytes.size();
    bytes[offset] ^= data[i + 3];
  }
}

const std::vector<uint8_t>& PoolLedgerBytes() {
  static const std::vector<uint8_t>* bytes = [] {
    auto ledger = PoolLedger::Create(Spec(), v1::PoolOwner(), kCapacityPages + 1);
    if (!ledger.ok()) std::abort();
    (*ledger)->RecordOwner(0, 3, 5);               // a live session
    (*ledger)->RecordOwner(3, 2, 6);               // a dead one
    (*ledger)->RecordOwner(5, 4, kCacheOwner);     // cached, a chain
    (*ledger)->RecordOwner(9, 1, kTierOwner);      // the tier's fill
    (*ledger)->RecordOwner(10, 2, kUnscrubbedMark);
    (*ledger)->RecordCached(5, "ns", "a", CacheLedger::kNoParent, 1);
    (*ledger)->RecordCached(6, "ns", "b", 5, 2);
    (*ledger)->RecordCached(7, "ns", "c", 6, 3);
    (*ledger)->RecordCached(8, "other", "a", CacheLedger::kNoParent, 4);
    (*ledger)->RecordCached(3, "ns", "d", CacheLedger::kNoParent, 5);  // not cached
    // Digests: pages 5 and 6 their bytes' (number + 1 each), page 7 one its
    // bytes do not match (a page changed after its digest: never adopted),
    // page 8 none (adopted unchecked).
    const uint64_t page_bytes = ResolvePoolSpec(Spec())->page_bytes();
    for (uint64_t page : {5, 6}) {
      const std::string bytes(page_bytes, static_cast<char>(page + 1));
      (*ledger)->RecordDigest(page, Crc32c(bytes.data(), bytes.size()));
    }
    (*ledger)->RecordDigest(7, 0x7777);
    return new std::vector<uint8_t>(ReadAll((*ledger)->fd()));
  }();
  return *bytes;
}

void FuzzPoolLedger(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes = PoolLedgerBytes();
  Apply(data, size, bytes);
  auto ledger = PoolLedger::Open(Sealed(bytes.data(), bytes.size()), "fuzz");
  if (!ledger.ok()) return;
  absl::StatusOr<PoolGeometry> geometry = ResolvePoolSpec((*ledger)->spec());
  if (!geometry.ok() || geometry->total_bytes() > (64u << 20)) return;
  // The segment as the daemon left it: a page the ledger wrote as free
  // (12..15) is zero (it is recorded free only once zeroed); every other
  // page's bytes are its number + 1.
  std::vector<uint8_t> pool_bytes(geometry->total_bytes());
  const uint64_t page_bytes = geometry->page_bytes();
  for (uint64_t i = 0; i < pool_bytes.size(); ++i) {
    const uint64_t page = i / page_bytes;
    pool_bytes[i] = page >= kFirstFreePage ? 0 : static_cast<uint8_t>(page + 1);
  }
  MemoryBudget budget(0, 0, [] { return uint64_t{1} << 40; });
  PoolRegistry registry(&budget, "/hostkv-fuzz-ledger.", PoolFillOptions{1});
  registry.namespaces().Adopt("ns", NamespaceOwner{true, 0});
  const absl::flat_hash_set<OwnerTag> live = {5};
  PoolAdoption report;
  auto pool = registry.Adopt(*std::move(ledger),
                             Sealed(pool_bytes.data(), pool_bytes.size()), live,
                             &report);
  if (!pool.ok()) return;
  HostPool& p = **pool;
  const uint64_t pages = p.allocator().num_pages();
  const SlotAllocator::Occupancy o = p.allocator().Snapshot();
  uint64_t owned = 0;
  for (const auto& [tag, n] : o.usage) {
    FUZZ_CHECK(tag == 5);  // only live sessions keep pages
    owned += n;
  }
  FUZZ_CHECK(o.free_pages + owned + o.cached_pages == pages);
  FUZZ_CHECK(p.cache().CheckConsistency().ok());
  FUZZ_CHECK(p.cache().cached_pages() == o.cached_pages);
  PageDigester digester(p.geometry(), p.base());
  for (uint64_t page = 0; page < pages; ++page) {
    if (!p.cache().IsCached(page)) continue;
    // A cached page matches the digest it was adopted with, if any.
    const std::optional<uint32_t> digest = p.cache().DigestsOf({page})[0];
    FUZZ_CHECK(!digest.has_value() || *digest == digester.Digest(page));
    // A cached page kept its bytes.
    const uint8_t* b = p.base() + page * page_bytes;
    for (uint64_t i = 0; i < page_bytes; ++i) {
      FUZZ_CHECK(b[i] == static_cast<uint8_t>(page + 1));
    }
  }
  if (o.free_pages > 0) {
    auto runs = p.allocator().Allocate(o.free_pages, 9);
    FUZZ_CHECK(runs.ok());
    for (const PageRun& r : *runs) {
      for (uint64_t page = r.first_page; page < r.first_page + r.num_pages; ++page) {
        const uint8_t* b = p.base() + page * page_bytes;
        for (uint64_t i = 0; i < page_bytes; ++i) FUZZ_CHECK(b[i] == 0);
      }
    }
  }
}

const std::vector<uint8_t>& DaemonLedgerBytes() {
  static const std::vector<uint8_t>* bytes = [] {
    auto ledger = DaemonLedger::Create(4, 4, 1);
    if (!ledger.ok()) std::abort();
    SessionRecord r;
    r.tag = 5;
    r.secret_sha256 = std::string(32, 's');
    r.client_name = "engine";
    (*ledger)->RecordSession(r);
    (*ledger)->RecordNamespace({"ns", NamespaceOwner{false, 1000}});
    return new std::vector<uint8_t>(ReadAll((*ledger)->fd()));
  }();
  return *bytes;
}

void FuzzDaemonLedger(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes = DaemonLedgerBytes();
  Apply(data, size, bytes);
  auto ledger = DaemonLedger::Open(Sealed(bytes.data(), bytes.size()));
  if (!ledger.ok()) return;
  const DaemonLedger::Contents c = (*ledger)->Read();
  for (const SessionRecord& s : c.sessions) {
    FUZZ_CHECK(s.secret_sha256.size() == 32 && s.client_name.size() <= 200);
  }
  for (const NamespaceRecord& n : c.namespaces) {
    FUZZ_CHECK(!n.name.empty() && n.name.size() <= kMaxCacheNamespaceBytes);
  }
}

}  // namespace
}  // namespace hostkv

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] & 1) {
    hostkv::FuzzDaemonLedger(data + 1, size - 1);
  } else {
    hostkv::FuzzPoolLedger(data + 1, size - 1);
  }
  return 0;
}
