// Section 2: the page allocator (server/pool/slot_allocator.h) in-process for
// pools of 10^3 .. 10^7 pages, fresh and fragmented, beside its own cost at
// 10^3 pages (flatness) and beside a bare free list of page numbers (what
// SGLang's in-process HostKVCache allocator does); then through the daemon
// for 10^3 and 10^6 pages.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/pool/slot_allocator.h"
#include "tests/bench/daemon_util.h"
#include "tests/bench/sections.h"

namespace hostkv::bench {
namespace {

const Target kFlatTarget =
    Target::AtMost(2.0, "flat: <= 2x of 10^3 pages (amortized O(1))");

std::string PoolLabel(uint64_t pages) {
  const int exp = static_cast<int>(std::lround(std::log10(pages)));
  return absl::StrCat("10^", exp, " pages");
}

struct AllocCosts {
  // Nanoseconds per page.
  double fresh_alloc = 0, fresh_free = 0, frag_alloc = 0, frag_free = 0;
  // Nanoseconds per FreeAllOwnedBy call of an owner holding one page.
  double free_all_owned = 0;
  // The free-list baseline, nanoseconds per page.
  double list_alloc = 0, list_free = 0;
};

constexpr uint64_t kFreshRequest = 16;  // pages per Allocate, fresh pool
constexpr uint64_t kFragRequest = 64;   // pages per Allocate, fragmented pool

std::vector<PageRun> MustAllocate(SlotAllocator& a, uint64_t pages,
                                  OwnerTag owner) {
  absl::StatusOr<std::vector<PageRun>> runs = a.Allocate(pages, owner);
  CheckOk(runs, "Allocate");
  return std::move(*runs);
}

AllocCosts MeasureAllocator(uint64_t num_pages, int reps, std::mt19937_64& rng) {
  double fresh_alloc = 0, fresh_free = 0, frag_alloc = 0, frag_free = 0;
  double free_all = 0, list_alloc = 0, list_free = 0;
  uint64_t fresh_pages = 0, frag_pages = 0;
  for (int rep = 0; rep < reps; ++rep) {
    SlotAllocator a(num_pages);
    // Fresh: fill the pool with 16-page requests, then free them all in a
    // random order (which fragments and re-coalesces the free extents).
    std::vector<std::vector<PageRun>> allocs;
    allocs.reserve(num_pages / kFreshRequest + 1);
    Clock::time_point t0 = Clock::now();
    for (uint64_t left = num_pages; left > 0;) {
      const uint64_t n = std::min(left, kFreshRequest);
      allocs.push_back(MustAllocate(a, n, 1));
      left -= n;
    }
    Clock::time_point t1 = Clock::now();
    fresh_alloc += NanosBetween(t0, t1);
    std::vector<size_t> order(allocs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    t0 = Clock::now();
    for (size_t i : order) {
      if (!a.Free(allocs[i], 1).ok()) Die("Free failed");
    }
    t1 = Clock::now();
    fresh_free += NanosBetween(t0, t1);
    fresh_pages += num_pages;

    // Fragmented: fill again, free every other 16-page request (free space
    // is then num_pages/32 holes of 16 pages), and allocate 64-page requests
    // (4 runs each) until full; free those in a random order.
    allocs.clear();
    for (uint64_t left = num_pages; left > 0;) {
      const uint64_t n = std::min(left, kFreshRequest);
      allocs.push_back(MustAllocate(a, n, 1));
      left -= n;
    }
    uint64_t holes = 0;
    for (size_t i = 0; i < allocs.size(); i += 2) {
      if (!a.Free(allocs[i], 1).ok()) Die("Free failed");
      for (const PageRun& r : allocs[i]) holes += r.num_pages;
    }
    std::vector<std::vector<PageRun>> frag;
    frag.reserve(holes / kFragRequest + 1);
    t0 = Clock::now();
    for (uint64_t left = holes; left > 0;) {
      const uint64_t n = std::min(left, kFragRequest);
      frag.push_back(MustAllocate(a, n, 1));
      left -= n;
    }
    t1 = Clock::now();
    frag_alloc += NanosBetween(t0, t1);
    order.resize(frag.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    t0 = Clock::now();
    for (size_t i : order) {
      if (!a.Free(frag[i], 1).ok()) Die("Free failed");
    }
    t1 = Clock::now();
    frag_free += NanosBetween(t0, t1);
    frag_pages += holes;

    // Session end: owner 2 holds one page; FreeAllOwnedBy(2).
    std::vector<PageRun> one = MustAllocate(a, 1, 2);
    t0 = Clock::now();
    if (a.FreeAllOwnedBy(2) != 1) Die("FreeAllOwnedBy");
    free_all += NanosBetween(t0, Clock::now());

    // Baseline: a free list of page numbers (a vector used as a stack), the
    // same 16-page requests, each returned as its own vector.
    std::vector<uint32_t> list(num_pages);
    for (uint64_t i = 0; i < num_pages; ++i) {
      list[i] = static_cast<uint32_t>(num_pages - 1 - i);
    }
    std::vector<std::vector<uint32_t>> taken;
    taken.reserve(num_pages / kFreshRequest + 1);
    t0 = Clock::now();
    while (!list.empty()) {
      const size_t n = std::min<size_t>(list.size(), kFreshRequest);
      taken.emplace_back(list.end() - n, list.end());
      list.resize(list.size() - n);
    }
    t1 = Clock::now();
    list_alloc += NanosBetween(t0, t1);
    order.resize(taken.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    t0 = Clock::now();
    for (size_t i : order) {
      list.insert(list.end(), taken[i].begin(), taken[i].end());
      std::vector<uint32_t>().swap(taken[i]);
    }
    t1 = Clock::now();
    list_free += NanosBetween(t0, t1);
  }
  AllocCosts c;
  c.fresh_alloc = fresh_alloc / fresh_pages;
  c.fresh_free = fresh_free / fresh_pages;
  c.frag_alloc = frag_alloc / frag_pages;
  c.frag_free = frag_free / frag_pages;
  c.free_all_owned = free_all / reps;
  c.list_alloc = list_alloc / fresh_pages;
  c.list_free = list_free / fresh_pages;
  return c;
}

}  // namespace

void RunAllocator(const Options& options, Report& report) {
  std::fprintf(stderr, "allocator in-process\n");
  std::mt19937_64 rng(42);
  const std::vector<uint64_t> sizes = {1000, 10000, 100000, 1000000, 10000000};
  // Each size does at least `work` pages of work (and 3 repetitions), so the
  // small pools are timed over many passes.
  const double work = options.quick ? 2e6 : 2e7;
  std::vector<AllocCosts> costs;
  for (uint64_t p : sizes) {
    const int reps = std::max<int>(options.quick ? 1 : 3,
                                   static_cast<int>(work / p));
    costs.push_back(MeasureAllocator(p, reps, rng));
  }
  struct Metric {
    const char* name;
    double AllocCosts::*field;
    const char* unit;
  };
  const Metric metrics[] = {
      {"Allocate, fresh pool (16-page requests)", &AllocCosts::fresh_alloc,
       "ns/page"},
      {"Free, fresh pool (16-page requests, random order)",
       &AllocCosts::fresh_free, "ns/page"},
      {"Allocate, fragmented pool (64-page requests into 16-page holes)",
       &AllocCosts::frag_alloc, "ns/page"},
      {"Free, fragmented pool (64-page requests, random order)",
       &AllocCosts::frag_free, "ns/page"},
      {"FreeAllOwnedBy (session end) of an owner holding 1 page",
       &AllocCosts::free_all_owned, "ns/page"},
  };
  for (const Metric& m : metrics) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      Row row;
      row.section = "allocator";
      row.name = m.name;
      row.config = PoolLabel(sizes[i]);
      row.metric = "cost per page";
      row.unit = m.unit;
      row.value = costs[i].*m.field;
      row.baseline = "same, 10^3 pages";
      row.baseline_value = costs[0].*m.field;
      row.target = i == 0 ? Target::None() : kFlatTarget;
      report.Add(row);
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (bool alloc : {true, false}) {
      Row row;
      row.section = "allocator";
      row.name = alloc ? "Allocate vs a bare free list (16-page requests)"
                       : "Free vs a bare free list (random order)";
      row.config = PoolLabel(sizes[i]);
      row.metric = "cost per page";
      row.unit = "ns/page";
      row.value = alloc ? costs[i].fresh_alloc : costs[i].fresh_free;
      row.baseline = "vector<uint32_t> free list, same size";
      row.baseline_value = alloc ? costs[i].list_alloc : costs[i].list_free;
      report.Add(row);
    }
  }
}

void RunDaemonAlloc(const Options& options, Report& report) {
  std::fprintf(stderr, "allocator through the daemon\n");
  DaemonHandle daemon = StartDaemon(false);
  absl::StatusOr<std::unique_ptr<Client>> c =
      Client::Connect(daemon->target(), "bench-alloc");
  CheckOk(c, "connect");
  Client& client = **c;
  const std::vector<uint64_t> sizes = {1000, 1000000};
  std::vector<std::string> names;
  // MLA, 1 layer, kv dim 8, fp8, page_size 1: 8 bytes per page.
  for (uint64_t p : sizes) {
    const std::string name = absl::StrCat("alloc-", p);
    absl::StatusOr<v1::Pool> pool = client.CreatePool(
        MlaSpec(name, 1, 4, 4, v1::DTYPE_FP8_E4M3, 1, v1::LAYOUT_LAYER_FIRST, p - 1));
    CheckOk(pool, "create " + name);
    if (pool->num_pages() != p) Die("unexpected page count");
    // Half the pool allocated, the free half in 16-page holes.
    absl::StatusOr<std::vector<PageRange>> all = client.Alloc(name, p);
    CheckOk(all, "fill");
    std::vector<PageRange> holes;
    for (uint64_t first = 0; first + 16 <= p; first += 32) holes.push_back({first, 16});
    CheckOk(client.Free(name, holes), "free holes");
    names.push_back(name);
  }
  const int warmup = options.quick ? 20 : 100;
  const int rounds = options.quick ? 4 : 10;
  const int per_round = options.quick ? 50 : 100;
  auto alloc_op = [&](const std::string& pool) -> TimedOp {
    return [&client, pool] {
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<std::vector<PageRange>> pages = client.Alloc(pool, 64);
      const double ns = NanosBetween(t0, Clock::now());
      CheckOk(pages, "alloc");
      CheckOk(client.Free(pool, *pages), "free");
      return ns;
    };
  };
  auto free_op = [&](const std::string& pool) -> TimedOp {
    return [&client, pool] {
      absl::StatusOr<std::vector<PageRange>> pages = client.Alloc(pool, 64);
      CheckOk(pages, "alloc");
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<uint64_t> freed = client.Free(pool, *pages);
      const double ns = NanosBetween(t0, Clock::now());
      CheckOk(freed, "free");
      return ns;
    };
  };
  // A session holding one page ends (CloseSession).
  const std::string target = daemon->target();
  auto close_op = [&](const std::string& pool) -> TimedOp {
    return [target, pool] {
      absl::StatusOr<std::unique_ptr<Client>> other =
          Client::Connect(target, "bench-close");
      CheckOk(other, "connect");
      CheckOk((*other)->Alloc(pool, 1), "alloc 1");
      const Clock::time_point t0 = Clock::now();
      absl::Status s = (*other)->Close();
      const double ns = NanosBetween(t0, Clock::now());
      CheckOk(s, "close");
      return ns;
    };
  };
  struct Case {
    const char* name;
    std::function<TimedOp(const std::string&)> make;
    int pages;
  };
  const Case cases[] = {
      {"Alloc of 64 pages (4 runs), half-full pool in 16-page holes", alloc_op, 64},
      {"Free of those 64 pages", free_op, 64},
      {"CloseSession of a session holding 1 page", close_op, 1},
  };
  for (const Case& cs : cases) {
    Samples small, large;
    const bool close = cs.pages == 1;
    Interleave(close ? warmup / 10 : warmup, rounds,
               close ? per_round / 5 : per_round, cs.make(names[1]),
               cs.make(names[0]), &large, &small);
    for (int p : {50, 99}) {
      Row row;
      row.section = "daemon_alloc";
      row.name = cs.name;
      row.config = "unix socket, 10^6 pages";
      row.metric = absl::StrCat("p", p, " latency");
      row.unit = "us";
      row.value = large.Percentile(p) / 1e3;
      row.baseline = absl::StrCat("same, 10^3 pages, p", p);
      row.baseline_value = small.Percentile(p) / 1e3;
      row.target = kFlatTarget;
      row.note = absl::StrCat(cs.pages, cs.pages == 1 ? " page" : " pages",
                              " per call; n=", large.size());
      report.Add(row);
    }
  }
}

}  // namespace hostkv::bench
