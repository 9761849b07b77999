// Section 5: the page cache (server/cache/page_cache.h) in-process.
//  - Per call, on a pool of 2^20 pages, all cached: Lookup of 1,000 keys
//    (without and with references), Release of those 1,000 references, and
//    Publish of 1,000 new pages (a chain: each page's parent is the one
//    before), beside the same number of finds / inserts in an
//    absl::flat_hash_map of 32-byte keys holding as many keys.
//  - Eviction cost per page with 10^3 .. 10^7 pages cached, in a random LRU
//    order (random lookups after publishing, so the list runs all over
//    memory), without parents and in chains of 16, taken 1,000 pages per
//    Evict call as an Alloc would; beside the cost at 10^3 (flatness) and an
//    erase from an absl::flat_hash_map of as many 32-byte keys, in random
//    order.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/cache/page_cache.h"
#include "tests/bench/sections.h"

namespace hostkv::bench {
namespace {

constexpr char kNamespace[] = "bench";
constexpr size_t kBatch = 1000;
const Target kFlatTarget =
    Target::AtMost(2.0, "flat: <= 2x of 10^3 pages (O(1) per page)");

using Key = std::array<char, 32>;  // a SHA-256 page hash
using BaselineMap = absl::flat_hash_map<Key, uint64_t>;

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Key MakeKey(uint64_t id) {
  Key k;
  for (uint64_t w = 0; w < 4; ++w) {
    const uint64_t v = SplitMix(id * 4 + w);
    std::memcpy(k.data() + 8 * w, &v, 8);
  }
  return k;
}

absl::string_view View(const Key& k) { return {k.data(), k.size()}; }

std::string PoolLabel(uint64_t pages) {
  const int exp = static_cast<int>(std::lround(std::log10(pages)));
  return absl::StrCat("10^", exp, " pages");
}

std::unique_ptr<PageCache> MustCreate(uint64_t pages) {
  absl::StatusOr<std::unique_ptr<PageCache>> cache = PageCache::Create(pages);
  CheckOk(cache, "PageCache::Create");
  return std::move(*cache);
}

// Publishes keys [first_id, first_id + n) on pages [first_page, ...), in
// calls of kBatch; with chain > 0, key i's parent is key i - 1 except at
// every chain-th key.
void PublishRange(PageCache& cache, uint64_t first_id, uint64_t first_page,
                  uint64_t n, uint64_t chain) {
  std::vector<Key> keys(kBatch + 1);
  std::vector<PublishItem> items;
  for (uint64_t done = 0; done < n;) {
    const uint64_t count = std::min<uint64_t>(kBatch, n - done);
    items.clear();
    keys[0] = MakeKey(first_id + done - 1);  // the parent of the first
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t id = first_id + done + i;
      keys[i + 1] = MakeKey(id);
      const bool root = chain == 0 || (id - first_id) % chain == 0;
      items.push_back({View(keys[i + 1]), root ? "" : View(keys[i]),
                       first_page + done + i});
    }
    absl::StatusOr<std::vector<PublishResult>> r =
        cache.Publish(kNamespace, items, false, kNoOwner);
    CheckOk(r, "Publish");
    for (const PublishResult& p : *r) {
      if (p.outcome != PublishOutcome::kCached) Die("publish not cached");
    }
    done += count;
  }
}

// Looks up every key of [0, n) once, in calls of up to kBatch keys; with
// chains, whole chains in a random order, else keys in a random order.
void ShuffleLru(PageCache& cache, uint64_t n, uint64_t chain,
                std::mt19937_64& rng) {
  const uint64_t unit = chain == 0 ? 1 : chain;
  std::vector<uint32_t> order(n / unit);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<Key> keys;
  std::vector<absl::string_view> views;
  auto flush = [&] {
    absl::StatusOr<LookupResult> r =
        cache.Lookup(kNamespace, views, false, kNoOwner);
    CheckOk(r, "Lookup");
    if (r->hits != views.size()) Die("lookup missed");
    keys.clear();
    views.clear();
  };
  keys.reserve(kBatch + unit);
  for (uint32_t u : order) {
    for (uint64_t i = 0; i < unit; ++i) keys.push_back(MakeKey(u * unit + i));
    if (keys.size() >= kBatch || chain > 0) {
      for (const Key& k : keys) views.push_back(View(k));
      flush();
    }
  }
  if (!keys.empty()) {
    for (const Key& k : keys) views.push_back(View(k));
    flush();
  }
}

struct EvictCost {
  double ns_per_page = 0;
  double bytes_per_page = 0;  // PageCache::MemoryBytes() per page, all cached
};

EvictCost MeasureEvict(uint64_t n, uint64_t chain, bool shuffle, int reps,
                       std::mt19937_64& rng) {
  double ns = 0, bytes = 0;
  for (int rep = 0; rep < reps; ++rep) {
    std::unique_ptr<PageCache> cache = MustCreate(n);
    PublishRange(*cache, 0, 0, n, chain);
    if (rep == 0) bytes = static_cast<double>(cache->MemoryBytes()) / n;
    if (shuffle) ShuffleLru(*cache, n, chain, rng);
    const Clock::time_point t0 = Clock::now();
    uint64_t evicted = 0;
    while (evicted < n) {
      const size_t got = cache->Evict(kBatch).size();
      if (got == 0) Die("nothing evictable");
      evicted += got;
    }
    ns += NanosBetween(t0, Clock::now());
  }
  return {ns / (static_cast<double>(n) * reps), bytes};
}

double MeasureMapErase(uint64_t n, int reps, std::mt19937_64& rng) {
  double ns = 0;
  for (int rep = 0; rep < reps; ++rep) {
    BaselineMap map;
    map.reserve(n);
    for (uint64_t i = 0; i < n; ++i) map.emplace(MakeKey(i), i);
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    // Keys made ahead, one batch at a time, outside the timed part.
    std::vector<Key> keys(kBatch);
    for (uint64_t done = 0; done < n; done += kBatch) {
      const uint64_t count = std::min<uint64_t>(kBatch, n - done);
      for (uint64_t i = 0; i < count; ++i) keys[i] = MakeKey(order[done + i]);
      const Clock::time_point t0 = Clock::now();
      for (uint64_t i = 0; i < count; ++i) {
        if (map.erase(keys[i]) != 1) Die("baseline erase");
      }
      ns += NanosBetween(t0, Clock::now());
    }
  }
  return ns / (static_cast<double>(n) * reps);
}

void AddRow(Report& report, const std::string& name, const std::string& config,
            const std::string& metric, const std::string& unit, double value,
            const std::string& baseline, double baseline_value,
            const Target& target, const std::string& note) {
  Row row;
  row.section = "cache";
  row.name = name;
  row.config = config;
  row.metric = metric;
  row.unit = unit;
  row.value = value;
  row.baseline = baseline;
  row.baseline_value = baseline_value;
  row.target = target;
  row.note = note;
  report.Add(row);
}

void RunEviction(const Options& options, Report& report, std::mt19937_64& rng) {
  std::vector<uint64_t> sizes = {1000, 10000, 100000, 1000000, 10000000};
  if (options.quick) sizes.pop_back();
  const double work = options.quick ? 3e5 : 2e6;  // pages per size, at least
  struct Variant {
    uint64_t chain;
    bool shuffle;
    const char* name;
  };
  const Variant variants[] = {
      {0, true, "Evict, no parents, random LRU order"},
      {16, true, "Evict, chains of 16 (leaf first), chains in random order"},
      {0, false, "Evict, no parents, in publish order (no lookups)"},
  };
  for (const Variant& v : variants) {
    std::vector<EvictCost> costs;
    std::vector<double> erase;
    for (uint64_t n : sizes) {
      const int reps = std::max(1, static_cast<int>(work / n));
      costs.push_back(MeasureEvict(n, v.chain, v.shuffle, reps, rng));
      erase.push_back(MeasureMapErase(n, reps, rng));
      std::fprintf(stderr, "  %s, %s: %.1f ns/page, erase %.1f\n", v.name,
                   PoolLabel(n).c_str(), costs.back().ns_per_page,
                   erase.back());
    }
    const std::string what = v.name;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string note = absl::StrCat(
          "1,000 pages per Evict call; PageCache::MemoryBytes() per cached "
          "page: ",
          Num(costs[i].bytes_per_page), " B");
      AddRow(report, what, PoolLabel(sizes[i]), "cost per page", "ns/page",
             costs[i].ns_per_page, "same, 10^3 pages", costs[0].ns_per_page,
             i == 0 ? Target::None() : kFlatTarget, note);
      AddRow(report, what + " vs a hash-map erase", PoolLabel(sizes[i]),
             "cost per page", "ns/page", costs[i].ns_per_page,
             "flat_hash_map<32-byte key, u64> erase, same size, random order",
             erase[i], Target::None(), "");
    }
  }
}

// Per call, 2^20 pages all cached in chains of kBatch (one "prompt" each).
void RunPerCall(const Options& options, Report& report, std::mt19937_64& rng) {
  constexpr uint64_t kPages = uint64_t{1} << 20;
  const uint64_t chains = kPages / kBatch;
  std::unique_ptr<PageCache> cache = MustCreate(kPages);
  PublishRange(*cache, 0, 0, chains * kBatch, kBatch);
  BaselineMap map;
  map.reserve(kPages);
  for (uint64_t i = 0; i < chains * kBatch; ++i) map.emplace(MakeKey(i), i);

  const int calls = options.quick ? 100 : 1000;
  Samples lookup, lookup_acquire, release, publish, find, insert;
  std::vector<Key> keys(kBatch);
  std::vector<absl::string_view> views(kBatch);
  const OwnerTag session = 1;
  // Lookups of random chains (nothing is evicted meanwhile): without
  // references, then with (another chain, so that neither finds the other's
  // entries in the CPU cache), then the release of those references (right
  // after: warm), then the baseline finds of a third chain's keys.
  auto fill = [&](uint64_t chain) {
    for (size_t i = 0; i < kBatch; ++i) {
      keys[i] = MakeKey(chain * kBatch + i);
      views[i] = View(keys[i]);
    }
  };
  for (int call = 0; call < calls; ++call) {
    fill(rng() % chains);
    Clock::time_point t0 = Clock::now();
    absl::StatusOr<LookupResult> r =
        cache->Lookup(kNamespace, views, false, kNoOwner);
    lookup.Add(NanosBetween(t0, Clock::now()));
    CheckOk(r, "Lookup");
    if (r->hits != kBatch) Die("lookup missed");
    fill(rng() % chains);
    t0 = Clock::now();
    r = cache->Lookup(kNamespace, views, true, session);
    lookup_acquire.Add(NanosBetween(t0, Clock::now()));
    CheckOk(r, "Lookup");
    if (r->hits != kBatch) Die("lookup missed");
    const std::vector<PageRun> runs = ToPageRuns(r->pages);
    t0 = Clock::now();
    CheckOk(cache->Release(session, runs), "Release");
    release.Add(NanosBetween(t0, Clock::now()));
    fill(rng() % chains);
    uint64_t found = 0;
    t0 = Clock::now();
    for (const Key& k : keys) {
      auto it = map.find(k);
      if (it != map.end()) found += it->second + 1;
    }
    find.Add(NanosBetween(t0, Clock::now()));
    if (found == 0) Die("baseline find");
  }
  // Publish of a new 1,000-page chain on the pages of the coldest one
  // (evicted untimed, as an Alloc before it would), then the baseline: the
  // map drops as many keys (untimed) and inserts the new ones.
  std::vector<PublishItem> items(kBatch);
  uint64_t next_id = chains * kBatch;
  for (int call = 0; call < calls; ++call) {
    const std::vector<uint64_t> pages = cache->Evict(kBatch);
    if (pages.size() != kBatch) Die("evict for publish");
    for (size_t i = 0; i < kBatch; ++i) {
      keys[i] = MakeKey(next_id + i);
      items[i] = {View(keys[i]), i == 0 ? "" : View(keys[i - 1]), pages[i]};
    }
    Clock::time_point t0 = Clock::now();
    absl::StatusOr<std::vector<PublishResult>> p =
        cache->Publish(kNamespace, items, false, kNoOwner);
    publish.Add(NanosBetween(t0, Clock::now()));
    CheckOk(p, "Publish");
    for (size_t i = 0; i < kBatch; ++i) {
      map.erase(MakeKey(next_id - chains * kBatch + i));
    }
    t0 = Clock::now();
    for (size_t i = 0; i < kBatch; ++i) map.emplace(keys[i], pages[i]);
    insert.Add(NanosBetween(t0, Clock::now()));
    next_id += kBatch;
  }
  const std::string config = "2^20 pages, all cached";
  const std::string note = absl::StrCat("median of ", calls, " calls");
  const std::string find_base =
      "1,000 flat_hash_map finds (32-byte keys, as many)";
  AddRow(report, "Lookup of 1,000 keys (all hit)", config, "median time", "us",
         lookup.Median() / 1e3, find_base, find.Median() / 1e3, Target::None(),
         note);
  AddRow(report, "Lookup of 1,000 keys with acquire", config, "median time",
         "us", lookup_acquire.Median() / 1e3, find_base, find.Median() / 1e3,
         Target::None(), note);
  AddRow(report, "Release of those 1,000 references (right after)", config,
         "median time", "us", release.Median() / 1e3, find_base,
         find.Median() / 1e3, Target::None(), note);
  AddRow(report, "Publish of 1,000 pages (a chain)", config, "median time",
         "us", publish.Median() / 1e3, "1,000 flat_hash_map inserts",
         insert.Median() / 1e3, Target::None(), note);
}

}  // namespace

void RunCache(const Options& options, Report& report) {
  std::fprintf(stderr, "page cache in-process\n");
  std::mt19937_64 rng(42);
  RunPerCall(options, report, rng);
  RunEviction(options, report, rng);
}

}  // namespace hostkv::bench
