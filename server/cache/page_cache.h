// The page cache of one host pool: which pages are published under which
// key, who holds references on them, and in which order the unreferenced
// ones are evicted (DESIGN.md, "The page cache").
#ifndef HOSTKV_SERVER_CACHE_PAGE_CACHE_H_
#define HOSTKV_SERVER_CACHE_PAGE_CACHE_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/cache/cache_ledger.h"
#include "server/cache/eviction_log.h"
#include "server/cache/miss_history.h"
#include "server/pool/slot_allocator.h"

namespace hostkv {

// What a client may name: a key is 1..64 opaque bytes (e.g. a SHA-256 page
// hash, raw or hex), inside a namespace of 1..128 bytes.
inline constexpr size_t kMaxCacheKeyBytes = 64;
inline constexpr size_t kMaxCacheNamespaceBytes = 128;
// Namespaces one cache can tell apart (a namespace, once published in, stays
// with its counters for the cache's life).
inline constexpr size_t kMaxCacheNamespaces = 65535;
// The largest pool a PageCache indexes (page numbers are 32-bit inside, one
// value kept for "none").
inline constexpr uint64_t kMaxCachePages = (uint64_t{1} << 32) - 2;

// Counters of one namespace, or of the whole pool.
struct CacheCounters {
  // Pages cached now; of those, the ones at least one session references,
  // and the ones Evict may take (unreferenced, no cached child). The rest,
  // cached - referenced - evictable, are unreferenced parents of cached
  // pages.
  uint64_t cached = 0;
  uint64_t referenced = 0;
  uint64_t evictable = 0;
  // Keys Lookup returned, and keys it was asked for and did not return
  // (the first missing key and every key after it).
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  // Publishes of a key already cached (the first page kept), and of a page
  // already cached (refused).
  uint64_t already_cached = 0;
  uint64_t conflicts = 0;

  bool operator==(const CacheCounters&) const = default;
};

struct NamespaceCounters {
  std::string name;
  CacheCounters counters;
  MissCounters misses;  // lookups, and why those that missed did
};

struct CacheStats {
  // Sums over the namespaces, plus the misses of lookups in namespaces
  // nothing was ever published in.
  CacheCounters total;
  std::vector<NamespaceCounters> namespaces;  // in order of first publish
  MissCounters unknown_namespace;  // lookups in namespaces never published in
};

// A key as `hostkv why` shows it: cached in the namespace now, or why not.
struct KeyExplanation {
  bool cached = false;
  MissExplanation why;
  std::string other_namespace;  // why.reason kOtherNamespace: its name
};

// A recent miss with its namespace's name resolved.
struct ExplainedMiss {
  std::string key;
  absl::Time when;
  MissExplanation why;
  std::string other_namespace;
};

enum class PublishOutcome {
  kCached,         // the page is now the cache's, cached under the key
  kAlreadyCached,  // the key was cached with another page, which is kept;
                   // the caller's page stays the caller's
  kConflict,       // the page is already cached (under any key): nothing
                   // changed; a cached page belongs to no session
};

struct PublishItem {
  absl::string_view key;
  // The key of the page before this one (e.g. the previous page of the same
  // prompt), or empty. A parent is evicted only after its cached children;
  // a parent key that is not cached when the item is published (never
  // published, or evicted) is ignored.
  absl::string_view parent_key;
  uint64_t page = 0;
};

struct PublishResult {
  PublishOutcome outcome = PublishOutcome::kCached;
  // The page cached under the key (the item's page for kCached, the one
  // kept for kAlreadyCached); the item's page for kConflict.
  uint64_t page = 0;
};

// A cached page as a previous daemon's ledger recorded it (PageCache::Adopt).
struct AdoptedEntry {
  uint64_t page = 0;
  std::string name_space;
  std::string key;
  uint64_t parent = UINT64_MAX;  // a page, or UINT64_MAX for none
  uint64_t use = 0;              // larger: used later
  // The page's digest (page_digest.h), if the ledger had it: checked
  // against the page's bytes before it is adopted.
  std::optional<uint32_t> digest;
};

// Pages checked against their digests (server/cache/page_digest.h), in one
// pool.
struct DigestCounters {
  uint64_t computed = 0;    // digests taken after a publish, or carried in
  uint64_t pending = 0;     // cached pages whose digest is not known yet (now)
  uint64_t verified = 0;    // hits checked before their load, and matching
  uint64_t unverified = 0;  // hits picked for a check while their digest was pending
  uint64_t mismatched = 0;  // hits that did not match: dropped, served as misses
  uint64_t adoption_dropped = 0;  // pages a restart did not adopt: no match
  uint64_t tier_refused = 0;      // tier values not brought in: damaged or foreign

  bool operator==(const DigestCounters&) const = default;
};

struct LookupResult {
  // How many keys, from the first, are cached.
  uint64_t hits = 0;
  // Their pages, one per hit, in key order.
  std::vector<uint64_t> pages;
};

// InvalidArgument unless the namespace is 1..kMaxCacheNamespaceBytes bytes.
absl::Status CheckCacheNamespace(absl::string_view name_space);
// InvalidArgument unless `key` (item `index`'s key, or its parent key, which
// may be empty) is within kMaxCacheKeyBytes.
absl::Status CheckCacheKey(absl::string_view key, size_t index, bool parent);

// Pages in the given order as runs of consecutive page numbers (a run
// breaks wherever the next page is not the previous one plus one).
std::vector<PageRun> ToPageRuns(absl::Span<const uint64_t> pages);

// The cached pages of one pool of num_pages pages: a key per page (within a
// namespace), a reference count per page (per session, and in all), the
// parent/child links given at publish, and a least-recently-used order of
// the evictable pages. It holds no page bytes and frees nothing: a page
// that Evict returns is no longer cached, and the caller (the allocator)
// frees it. It trusts its caller on page ownership: Publish does not check
// that the publisher owns the pages (the allocator does).
//
// Eviction order: evictable pages (unreferenced, without cached children)
// are kept in one intrusive doubly linked list, coldest first. A page moves
// to the hot end when it is published, found by Lookup, or released by its
// last reference; within one call, earlier keys end up hotter than later
// ones, so a prefix is evicted from its end even when no parent keys are
// given. A parent whose last cached child is evicted joins the list at the
// cold end if it was last used no later than the coldest page there (the
// usual case: a lookup that finds a child also finds its parent), else at
// the hot end.
//
// Cost: O(1) per key, page or reference, whatever the number of pages
// cached; the index slots of a call's keys are prefetched a few keys ahead,
// and Evict prefetches the next victim's entry. Memory: at construction, a
// key index sized for every page at once (5 bytes a slot, 1.3-2.6 slots a
// page: 6-12 bytes per page of the pool; it never grows or rehashes while
// the lock is held); then 104 bytes per page (its entry, key and digest inline),
// allocated 65,536 pages (6.5 MiB) at a time when the first page of such a
// range is published, and not given back; plus ~16 bytes per (session,
// page) reference. Arrays of 2 MiB and more ask for transparent huge pages
// (madvise): the accesses are random, and at millions of pages 4 KiB pages
// add a TLB miss to most of them.
//
// Thread-safe; every method takes one mutex once.
class PageCache {
 public:
  // InvalidArgument if num_pages is 0 or above kMaxCachePages.
  static absl::StatusOr<std::unique_ptr<PageCache>> Create(uint64_t num_pages);

  PageCache(const PageCache&) = delete;
  PageCache& operator=(const PageCache&) = delete;
  ~PageCache();

  // Publishes items in order (an item may name an earlier one as parent),
  // one result per item. With acquire, `session` also gets a reference on
  // the page cached under each item's key (kCached and kAlreadyCached; none
  // for kConflict). All or nothing: InvalidArgument, changing nothing, for a
  // namespace outside 1..128 bytes, a key outside 1..64, a parent key above
  // 64, a page outside the pool, or acquire with kNoOwner;
  // ResourceExhausted if the namespace is new and kMaxCacheNamespaces are
  // taken, or with acquire when the cache could come to hold more than
  // 2^32 - 1 references in all (checked against items.size()).
  absl::StatusOr<std::vector<PublishResult>> Publish(
      absl::string_view name_space, absl::Span<const PublishItem> items,
      bool acquire, OwnerTag session) ABSL_LOCKS_EXCLUDED(mu_);
  // One item, without a reference.
  absl::StatusOr<PublishResult> Publish(absl::string_view name_space,
                                        absl::string_view key,
                                        absl::string_view parent_key,
                                        uint64_t page) ABSL_LOCKS_EXCLUDED(mu_);

  // The page cached under (name_space, key), or kNotCached. Touches and
  // counts nothing.
  uint64_t PageOf(absl::string_view name_space, absl::string_view key) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Which items are cached already exactly as they say (the item's key on
  // the item's page in `name_space`): a Publish sent again after a daemon
  // restart cut its first try. With acquire, `session` gets a reference on
  // each such page. Touches and counts nothing. ResourceExhausted with
  // acquire past the cache's reference limit. REQUIRES: items checked as
  // Publish checks them.
  absl::StatusOr<std::vector<bool>> Republished(
      absl::string_view name_space, absl::Span<const PublishItem> items,
      bool acquire, OwnerTag session) ABSL_LOCKS_EXCLUDED(mu_);

  // The longest cached prefix of `keys`: hits and their pages. With
  // acquire, `session` gets one reference on each page returned (a key
  // listed twice, two). Counts hits and misses; touches every hit. All or
  // nothing: InvalidArgument, changing nothing (counters included), for a
  // namespace outside 1..128 bytes, a key outside 1..64 or acquire with
  // kNoOwner; ResourceExhausted with acquire when the cache would hold more
  // than 2^32 - 1 references in all.
  //
  // With count_misses false, the keys not found are not counted as misses
  // (the caller looks them up again, e.g. after bringing pages from a
  // storage tier, and that lookup counts them).
  absl::StatusOr<LookupResult> Lookup(absl::string_view name_space,
                                      absl::Span<const absl::string_view> keys,
                                      bool acquire, OwnerTag session,
                                      bool count_misses = true)
      ABSL_LOCKS_EXCLUDED(mu_);

  // For a reader of cached bytes that is not a client (the storage tier's
  // writer): gives `holder` a reference on the page cached under each key
  // and returns the pages, kNotCached for a key not cached. Unlike Lookup it
  // counts nothing and touches nothing (the LRU order is the clients').
  // InvalidArgument for a bad namespace or key or holder kNoOwner;
  // ResourceExhausted past the cache's reference limit. The holder drops
  // them with Release.
  static constexpr uint64_t kNotCached = UINT64_MAX;
  absl::StatusOr<std::vector<uint64_t>> ReferenceKeys(
      absl::string_view name_space, absl::Span<const absl::string_view> keys,
      OwnerTag holder) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops one of `session`'s references per page listed (a page listed
  // twice, two). All or nothing: InvalidArgument for an empty run or one
  // outside the pool; FailedPrecondition, changing nothing, for a page the
  // session holds no (or too few) references on. Returns how many were
  // dropped.
  absl::StatusOr<uint64_t> Release(OwnerTag session,
                                   const std::vector<PageRun>& runs)
      ABSL_LOCKS_EXCLUDED(mu_);

  // OK if `session` holds a reference on every page of `runs` (a load or a
  // copy may read them); FailedPrecondition naming the first it does not
  // hold, InvalidArgument for a run outside the pool. Takes the cache's
  // lock: callers may hold the allocator's (the lock order).
  absl::Status CheckHeld(OwnerTag session, const std::vector<PageRun>& runs) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops every reference `session` holds (its end); returns how many.
  // The pages stay cached.
  uint64_t ReleaseAll(OwnerTag session) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes up to max_pages evictable pages from the cache, coldest first,
  // and returns them; the caller frees them. Fewer (or none) when fewer are
  // evictable; a parent freed by its last child's eviction may be taken by
  // the same call.
  std::vector<uint64_t> Evict(uint64_t max_pages) ABSL_LOCKS_EXCLUDED(mu_);
  // For an allocation short of `needed` pages: Evict(needed) if the
  // unreferenced cached pages make up the shortfall, else nothing (an
  // allocation bound to fail evicts no page). One lock for both.
  // `for_session`: the number of the session whose allocation it is (miss
  // explanations name it; 0: none).
  std::vector<uint64_t> EvictForAllocation(uint64_t needed, uint32_t for_session = 0)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The keys of `name_space` evicted after eviction number `after`
  // (EvictionLog::Read); none for a namespace nothing was published in.
  // Counts nothing, touches nothing.
  EvictionList ListEvictions(absl::string_view name_space, uint64_t after,
                             uint32_t max_keys) const ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t num_pages() const { return num_pages_; }
  uint64_t cached_pages() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t referenced_pages() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t evictable_pages() const ABSL_LOCKS_EXCLUDED(mu_);

  // False for a page outside the pool.
  bool IsCached(uint64_t page) const ABSL_LOCKS_EXCLUDED(mu_);
  // References on the page, by all sessions (0 if not cached).
  uint32_t References(uint64_t page) const ABSL_LOCKS_EXCLUDED(mu_);
  // References `session` holds, on all pages.
  uint64_t ReferencesHeldBy(OwnerTag session) const ABSL_LOCKS_EXCLUDED(mu_);
  // Pages referenced by anyone but `holder` (the pages only `holder`
  // references left out): what keeps a pool from being deleted, the digest
  // thread's short hold (kCacheOwner) aside.
  uint64_t PagesReferencedBeyond(OwnerTag holder) const ABSL_LOCKS_EXCLUDED(mu_);
  // Their sum over `sessions` (one lock).
  uint64_t ReferencesHeldBy(absl::Span<const OwnerTag> sessions) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Where the heap the references take is charged (the daemon's memory
  // budget): `reserve` (bytes; an error refuses the references that needed
  // them) and `release`. Charged kReferenceBytes a reference, in steps of
  // kChargeStep references, given back with one step of slack as they are
  // dropped. Set once, before the cache is shared.
  struct ReferenceCharge {
    std::function<absl::Status(uint64_t bytes)> reserve;
    std::function<void(uint64_t bytes)> release;
  };
  static constexpr uint64_t kReferenceBytes = 24;  // (session, page) map slot
  static constexpr uint64_t kChargeStep = 65536;   // 1.5 MiB
  void set_reference_charge(ReferenceCharge charge) {
    charge_ = std::move(charge);
  }
  // References charged so far (a multiple of kChargeStep).
  uint64_t charged_references() const ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes the cache has allocated: entry chunks, the key index, the
  // sessions' reference maps (their slots; not the namespaces' names).
  // What a memory budget should count for it.
  uint64_t MemoryBytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // MemoryBytes once every page of the pool is cached: the key index and
  // every entry chunk (references excluded: they are bounded per session by
  // the daemon's limits). What the daemon reserves in its memory budget.
  uint64_t MaxMemoryBytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // Every key published or evicted from now on is also written to `ledger`
  // (may be null). Set before the cache is shared.
  void set_ledger(CacheLedger* ledger) { ledger_ = ledger; }

  // Caches `entries` in an empty cache, as a previous daemon left them:
  // oldest use coldest, no references. An entry whose page is out of range
  // or listed twice, whose key or namespace is invalid, or whose key is
  // cached already is skipped; a parent that is not among the adopted pages
  // is dropped (the entry stays). Returns the pages cached.
  // FailedPrecondition if the cache is not empty.
  absl::StatusOr<std::vector<uint64_t>> Adopt(std::vector<AdoptedEntry> entries)
      ABSL_LOCKS_EXCLUDED(mu_);

  // For `hostkv why`: per key, whether it is cached in `name_space` now,
  // else why not (as a lookup missing it would count it). Counts and
  // touches nothing. REQUIRES: namespace and keys checked.
  std::vector<KeyExplanation> ExplainKeys(absl::string_view name_space,
                                          absl::Span<const absl::string_view> keys) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A lookup (of `first_key` first) its caller refused (a reference limit):
  // the engine recomputes, so it counts as a miss, for reason kRefused.
  void CountRefusedLookup(absl::string_view name_space, absl::string_view first_key)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The latest misses of lookups in `name_space` (the pool remembers
  // MissHistory::kRecent of all namespaces), newest first, at most `max`.
  std::vector<ExplainedMiss> RecentMisses(absl::string_view name_space, size_t max) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Page digests (server/cache/page_digest.h): computed and checked by
  // the daemon outside the cache's lock; kept here with the key.
  //
  // Sets the digest of `page` if it is cached (not detached) under `key`
  // and has none yet; writes it to the ledger. False if not set (evicted,
  // republished under another key, or set already).
  bool SetDigest(uint64_t page, absl::string_view key, uint32_t digest)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The cached pages whose digest is not known (e.g. adopted from a ledger
  // written before it was taken), with their namespaces and keys.
  struct Undigested {
    std::string name_space;
    std::vector<uint64_t> pages;
    std::vector<std::string> keys;
  };
  std::vector<Undigested> ListUndigested() const ABSL_LOCKS_EXCLUDED(mu_);
  // Per page: its digest, nullopt while none is known (or not cached).
  std::vector<std::optional<uint32_t>> DigestsOf(absl::Span<const uint64_t> pages) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The hits of a Lookup from `at` on are not served: the page at `at` did
  // not match its digest. Drops the references the lookup gave `session`
  // on them (with acquire), takes them off the hit counts, takes the
  // page's key out of the cache (detached until its other references and
  // cached children are gone; evicted first; its next miss says
  // kDigestMismatch) and truncates `found`. The lookup's misses are
  // counted by CountLookupMisses. REQUIRES: `found` is what
  // Lookup(name_space, ..., acquire, session, false) returned.
  void RejectHits(absl::string_view name_space, LookupResult& found, size_t at, bool acquire,
                  OwnerTag session) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a lookup of `keys` whose first `hits` were served, as Lookup
  // with count_misses does (for a caller that passed count_misses false).
  // REQUIRES: namespace and keys checked, hits <= keys.size().
  void CountLookupMisses(absl::string_view name_space,
                         absl::Span<const absl::string_view> keys, size_t hits)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The page cached under (name_space, key), if it is still `page`, no
  // longer matches its digest (a reader other than Lookup found it, e.g.
  // the tier writer): it leaves the cache as RejectHits takes a page out.
  void DropMismatched(absl::string_view name_space, absl::string_view key, uint64_t page)
      ABSL_LOCKS_EXCLUDED(mu_);
  // (name_space, key) was not brought in for `why` (kTierFailed: the tier
  // failed or refused its value; kDigestMismatch: a restart dropped its
  // page): its next miss says so. Makes the namespace known if it was not.
  void NoteDropped(absl::string_view name_space, absl::string_view key, MissReason why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Hits checked: `matched`, and `unknown` whose digest was still pending.
  void CountVerified(uint64_t matched, uint64_t unknown) ABSL_LOCKS_EXCLUDED(mu_);
  // DigestCounters::adoption_dropped and tier_refused.
  void CountAdoptionDropped(uint64_t pages) ABSL_LOCKS_EXCLUDED(mu_);
  void CountTierRefused(uint64_t values) ABSL_LOCKS_EXCLUDED(mu_);
  DigestCounters digest_counters() const ABSL_LOCKS_EXCLUDED(mu_);

  CacheStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // One namespace's counters (zeros if nothing was ever published in it).
  CacheCounters CountersOf(absl::string_view name_space) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Walks every structure and checks that they agree (the LRU list, the
  // key index, the entries, child counts, references, every counter).
  // O(pages of the pool + references). For tests; Internal naming the first
  // disagreement.
  absl::Status CheckConsistency() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry;
  struct Namespace;
  // Key index: page numbers (an entry's index is its page), hashed and
  // compared by (namespace id, key) read from the entry itself, so a key is
  // stored once. A KeyRef carries its hash, computed once per call.
  struct KeyRef {
    uint16_t ns;
    absl::string_view key;
    size_t hash;
  };
  struct KeyHash {
    using is_transparent = void;
    const PageCache* cache;
    size_t operator()(uint32_t page) const;
    size_t operator()(const KeyRef& key) const { return key.hash; }
  };
  struct KeyEq {
    using is_transparent = void;
    const PageCache* cache;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(uint32_t page, const KeyRef& key) const;
    bool operator()(const KeyRef& key, uint32_t page) const {
      return (*this)(page, key);
    }
  };
  // For the key index: see AllocateMaybeHuge.
  template <typename T>
  struct HugePageAllocator {
    using value_type = T;
    HugePageAllocator() = default;
    template <typename U>
    HugePageAllocator(const HugePageAllocator<U>&) {}
    T* allocate(size_t n) {
      return static_cast<T*>(AllocateMaybeHuge(n * sizeof(T)));
    }
    void deallocate(T* p, size_t) { std::free(p); }
    bool operator==(const HugePageAllocator&) const { return true; }
  };
  // Zeroed; on huge pages from 2 MiB. Throws std::bad_alloc as new does.
  static void* AllocateMaybeHuge(size_t bytes);
  // What AllocateMaybeHuge allocates for `bytes`.
  static size_t AllocatedSize(size_t bytes);
  using KeyIndex = absl::flat_hash_set<uint32_t, KeyHash, KeyEq,
                                       HugePageAllocator<uint32_t>>;
  // A session's references: page -> count (> 0, except inside Release),
  // and their sum.
  struct SessionRefs {
    absl::flat_hash_map<uint32_t, uint32_t> by_page;
    uint64_t total = 0;
  };

  static constexpr uint32_t kNone = UINT32_MAX;
  static constexpr uint32_t kChunkBits = 16;  // 65,536 entries, 6.5 MiB
  static constexpr uint32_t kChunkMask = (1u << kChunkBits) - 1;
  // Keys hashed (and their index slots prefetched) ahead of their probe.
  static constexpr size_t kLookahead = 8;

  explicit PageCache(uint64_t num_pages);

  static size_t HashOf(uint16_t ns, absl::string_view key);
  // The key's hash without its namespace (MissHistory: the key elsewhere).
  static uint64_t KeyOnlyHash(absl::string_view key);

  // The entry of a page. REQUIRES: its chunk exists (the page is cached, or
  // EnsureChunk was called). The hasher and comparator of the key index
  // call AtUnchecked, with mu_ held where the analysis cannot see it.
  Entry& At(uint32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Entry& At(uint32_t page) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  const Entry& AtUnchecked(uint32_t page) const ABSL_NO_THREAD_SAFETY_ANALYSIS;
  bool CachedLocked(uint64_t page) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void EnsureChunk(uint32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Prefetch(uint32_t page) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  absl::Status CheckPublish(absl::string_view name_space,
                            absl::Span<const PublishItem> items, bool acquire,
                            OwnerTag session) const;
  // The namespace's id, made if new; ResourceExhausted when none is left.
  absl::StatusOr<uint16_t> InternLocked(absl::string_view name_space)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The page cached under the key, or kNone.
  uint32_t FindLocked(const KeyRef& key) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // One item of Publish: `parent` is the parent's page (kNone: none, or not
  // cached); *page_out the page cached under the key, kNone on conflict.
  PublishResult PublishOneLocked(uint16_t ns, const PublishItem& item,
                                 size_t hash, uint32_t parent,
                                 uint32_t* page_out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evict's body.
  std::vector<uint64_t> EvictLocked(uint64_t max_pages, uint32_t for_session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the coldest evictable entry, whose key hashes to `hash`.
  void EvictColdestLocked(size_t hash, uint32_t for_session, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The LRU list holds exactly the evictable entries.
  static bool Evictable(const Entry& e);
  void LinkHot(uint32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LinkCold(uint32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unlink(uint32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the entry used now (and moves it to the hot end if evictable).
  void Touch(uint32_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Room for `more` references: the cache's limit, then the budget.
  absl::Status ChargeReferences(uint64_t more)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back what the references no longer need, keeping one step.
  void UnchargeReferences() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reference more / count fewer on the entry, and on the session's count
  // (AddRef) or not (DropRefs: the caller's business).
  void AddRef(uint32_t page, SessionRefs& held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropRefs(uint32_t page, uint32_t count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cached children: one more, one fewer.
  void AddChild(uint32_t parent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropChild(uint32_t parent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountRefusedLocked(absl::string_view name_space, absl::string_view first_key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a cached page's key out of the index, the ledger and the
  // eviction log (history: `why`); the entry stays, detached, until its
  // references and cached children are gone.
  void DetachLocked(uint32_t page, MissReason why, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lookup's counts of a lookup in namespace `ns` (kUnknownNamespace: one
  // nothing was published in) whose first `hits` keys were served.
  void CountLookupLocked(uint16_t ns, absl::string_view name_space,
                         absl::Span<const absl::string_view> keys, size_t hits)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kOtherNamespace's namespace name ("" for other reasons).
  std::string OtherNamespaceLocked(const MissExplanation& why) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Adds delta to a counter of namespace ns and of the total.
  void Count(uint16_t ns, uint64_t CacheCounters::*field, int64_t delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status CheckRuns(const std::vector<PageRun>& runs) const;
  // REQUIRES: CheckRuns passed (each run within the pool).
  static uint64_t PagesIn(const std::vector<PageRun>& runs);
  // Release's steps: take the session's count down for each page listed,
  // stopping at one it holds no reference left on (returned in *refused);
  // returns how many were taken. Undo the first `taken`. Drop the entries'
  // references for all (after all were taken).
  uint64_t TakeHeldLocked(SessionRefs& held, const std::vector<PageRun>& runs,
                          uint64_t* refused) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UndoTakeLocked(SessionRefs& held, const std::vector<PageRun>& runs,
                      uint64_t taken) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropTakenLocked(SessionRefs& held, const std::vector<PageRun>& runs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckConsistencyLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Const after construction.
  const uint64_t num_pages_;

  mutable absl::Mutex mu_;
  // Entries by page, 4096 a chunk, each chunk made when one of its pages is
  // first published (null before).
  struct FreeChunk {
    void operator()(Entry* p) const { std::free(p); }
  };
  using Chunk = std::unique_ptr<Entry[], FreeChunk>;
  std::vector<Chunk> chunks_ ABSL_GUARDED_BY(mu_);
  uint64_t chunk_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // allocated, in all
  KeyIndex keys_ ABSL_GUARDED_BY(mu_);
  // Evictable entries: coldest and hottest ends (kNone when empty).
  uint32_t coldest_ ABSL_GUARDED_BY(mu_) = kNone;
  uint32_t hottest_ ABSL_GUARDED_BY(mu_) = kNone;
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;  // ticks once per use
  std::vector<Namespace> namespaces_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint16_t> namespace_ids_
      ABSL_GUARDED_BY(mu_);
  CacheCounters total_ ABSL_GUARDED_BY(mu_);
  // Part of total_.misses: lookups in namespaces never published in.
  uint64_t unknown_namespace_misses_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t total_refs_ ABSL_GUARDED_BY(mu_) = 0;  // all sessions, all pages
  CacheLedger* ledger_ = nullptr;
  EvictionLog evictions_ ABSL_GUARDED_BY(mu_);
  // Why lookups missed: what was published and evicted, counters by reason.
  MissHistory history_ ABSL_GUARDED_BY(mu_);
  DigestCounters digests_ ABSL_GUARDED_BY(mu_);  // pending: see digests_known_
  uint64_t digests_known_ ABSL_GUARDED_BY(mu_) = 0;  // cached, not detached
  uint64_t detached_ ABSL_GUARDED_BY(mu_) = 0;       // cached, detached
  // ReferenceCharge: references paid for in the budget.
  ReferenceCharge charge_;
  uint64_t charged_refs_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<OwnerTag, SessionRefs> refs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CACHE_PAGE_CACHE_H_
