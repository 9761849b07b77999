// Why a lookup missed (issue "Trust every hit and explain every miss"): a
// bounded memory of the keys published and evicted in one pool's page
// cache, the misses counted per namespace by reason, and the latest misses.
// Owned by PageCache and called under its lock; not thread-safe itself.
//
// Memory: two direct-mapped tables of kSlots entries (24 and 16 bytes), so
// the history remembers about the last kSlots keys published in the pool
// (a later key whose slot it takes makes an older one "never published");
// per namespace 64 bytes of counters; a ring of kRecent misses.
#ifndef HOSTKV_SERVER_CACHE_MISS_HISTORY_H_
#define HOSTKV_SERVER_CACHE_MISS_HISTORY_H_

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace hostkv {

enum class MissReason : uint8_t {
  kNeverPublished = 0,  // no publish of the key in this namespace remembered
  kEvicted = 1,         // published here, evicted since
  kOtherNamespace = 2,  // not here; published in another namespace of the pool
  kRefused = 3,         // the lookup was refused (a reference limit)
  // Published here, then dropped: its bytes no longer matched the digest
  // taken when it was published (page_digest.h), found on a hit or when a
  // restarted daemon adopted it.
  kDigestMismatch = 4,
  // The storage tier was asked for it and its value could not be read or
  // was refused (damaged, another geometry or digest).
  kTierFailed = 5,
};
inline constexpr int kMissReasons = 6;
// "never_published", "evicted", "other_namespace", "refused",
// "digest_mismatch", "tier_failed".
const char* MissReasonName(MissReason reason);

struct MissExplanation {
  MissReason reason = MissReason::kNeverPublished;
  // kEvicted: when, and the session whose allocation evicted it (0: an
  // eviction no allocation of a session asked for). kDigestMismatch,
  // kTierFailed: when the page was dropped or the tier failed.
  absl::Time evicted_at;
  uint32_t evicted_for_session = 0;
  // kOtherNamespace: the namespace's id in the cache.
  uint16_t other_ns = 0;
};

// Per namespace: lookups, those whose first key was ever published there
// (hit or not: the hit rate that namespace could have had), the lookups
// that missed by the reason of their first missing key.
struct MissCounters {
  uint64_t lookups = 0;
  uint64_t reusable_lookups = 0;
  std::array<uint64_t, kMissReasons> missed_by_reason{};

  uint64_t missed() const;
  bool operator==(const MissCounters&) const = default;
};

struct RecentMiss {
  std::string name_space;
  std::string key;
  absl::Time when;
  MissExplanation why;
};

class MissHistory {
 public:
  static constexpr size_t kSlots = size_t{1} << 18;
  static constexpr size_t kRecent = 1024;

  // `slots`: a power of two (tests use small ones).
  explicit MissHistory(size_t slots = kSlots);

  // ns_key: the (namespace, key) hash; key: the key's own hash.
  void Published(uint16_t ns, uint64_t ns_key, uint64_t key);
  void Evicted(uint16_t ns, uint64_t ns_key, uint32_t for_session, absl::Time now);
  // (ns, key) was dropped, or not brought in, for `why` (kDigestMismatch or
  // kTierFailed): later misses of it say so until it is published again.
  void Dropped(uint16_t ns, uint64_t ns_key, MissReason why, absl::Time now);

  // Why (ns, key) is not cached (the caller knows it is not).
  MissExplanation Explain(uint16_t ns, uint64_t ns_key, uint64_t key) const;
  // Whether (ns, key) was ever published (as far as remembered).
  bool EverPublished(uint64_t ns_key) const;

  // A lookup in namespace ns: `reusable` when its first key was ever
  // published there; `miss` (and the first missing key) when it missed.
  void CountLookup(uint16_t ns, bool reusable);
  void CountMiss(uint16_t ns, absl::string_view name_space, absl::string_view key,
                 const MissExplanation& why, absl::Time now);

  // kUnknownNamespace: lookups in namespaces nothing was published in.
  static constexpr uint16_t kUnknownNamespace = UINT16_MAX;
  const MissCounters& CountersOf(uint16_t ns) const;
  const std::deque<RecentMiss>& recent() const { return recent_; }
  size_t MemoryBytes() const;
  // With the ring of recent misses full (the counters grow with namespaces).
  size_t MaxMemoryBytes() const;

  // The table size for a pool of `pages`: 8 per page, 4,096 to kSlots.
  static size_t SlotsFor(uint64_t pages);

 private:
  struct Slot {  // (namespace, key): published, or evicted when and for whom
    uint64_t tag = 0;  // the hash; 0: empty
    int64_t evicted_at_s = 0;  // 0: cached (or published, never evicted)
    uint32_t for_session = 0;
    uint16_t ns = 0;
    MissReason why = MissReason::kEvicted;  // with evicted_at_s: how it went
  };
  struct KeySlot {  // key: the last namespace it was published in
    uint64_t tag = 0;
    uint16_t ns = 0;
  };
  static uint64_t Tag(uint64_t hash) { return hash == 0 ? 1 : hash; }

  const size_t mask_;
  std::vector<Slot> by_ns_key_;
  std::vector<KeySlot> by_key_;
  MissCounters& At(uint16_t ns);

  std::vector<MissCounters> counters_;  // by namespace id
  MissCounters unknown_;                // kUnknownNamespace
  std::deque<RecentMiss> recent_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CACHE_MISS_HISTORY_H_
