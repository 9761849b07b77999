// Section 2c: what zeroing costs an Alloc through the daemon. Pages of
// SGLang's size (Llama-8B: 32 layers, 8 KV heads x 128, bf16, page size 64:
// 8 MiB a page) in a pool with no other free pages, so that every Alloc
// takes pages freed or evicted just before: back from the same session (no
// zeroing: its own bytes), evicting pages it published (no zeroing), and
// after another session's frees (zeroed inline: the trust model's price).
// The baseline is the same sequence of calls on a pool of 512-byte pages,
// whose zeroing costs nothing, interleaved with it.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/bench/daemon_util.h"
#include "tests/bench/sections.h"

namespace hostkv::bench {
namespace {

constexpr char kSection[] = "alloc_zeroing";
constexpr uint32_t kPageTokens = 64;

v1::PoolSpec BigPages(const std::string& name, uint64_t pages) {
  return MhaSpec(name, 32, 8, 128, v1::DTYPE_BF16, kPageTokens, v1::LAYOUT_PAGE_FIRST,
                 (pages - 1) * kPageTokens);
}

// 512 bytes a page: MLA, 1 layer, 8 fp8 elements per token.
v1::PoolSpec SmallPages(const std::string& name, uint64_t pages) {
  return MlaSpec(name, 1, 4, 4, v1::DTYPE_FP8_E4M3, kPageTokens, v1::LAYOUT_PAGE_FIRST,
                 (pages - 1) * kPageTokens);
}

// Alloc of every page of `pool`, timed; then what `after` does with them.
TimedOp AllocThen(Client& client, const std::string& pool, uint64_t pages,
                  std::function<void(const std::vector<PageRange>&)> after) {
  return [&client, pool, pages, after] {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<std::vector<PageRange>> got = client.Alloc(pool, pages * kPageTokens);
    const double ns = NanosBetween(t0, Clock::now());
    CheckOk(got, "alloc " + pool);
    after(*got);
    return ns;
  };
}

}  // namespace

void RunAllocZeroing(const Options& options, Report& report) {
  std::fprintf(stderr, "alloc and zeroing through the daemon\n");
  DaemonHandle daemon = StartDaemon(false);
  absl::StatusOr<std::unique_ptr<Client>> a = Client::Connect(daemon->target(), "bench-a");
  absl::StatusOr<std::unique_ptr<Client>> b = Client::Connect(daemon->target(), "bench-b");
  CheckOk(a, "connect a");
  CheckOk(b, "connect b");
  Client& alice = **a;
  Client& bob = **b;
  const std::vector<uint64_t> sizes =
      options.quick ? std::vector<uint64_t>{16} : std::vector<uint64_t>{16, 256};
  uint64_t round = 0;
  for (uint64_t n : sizes) {
    const std::string big = absl::StrCat("zero-big-", n);
    const std::string small = absl::StrCat("zero-small-", n);
    CheckOk(alice.CreatePool(BigPages(big, n)), "create " + big);
    CheckOk(alice.CreatePool(SmallPages(small, n)), "create " + small);
    const int warmup = n > 16 ? 2 : 5;
    const int rounds = options.quick ? 2 : (n > 16 ? 3 : 5);
    const int per_round = n > 16 ? 3 : 8;
    const std::string config = absl::StrCat(n, " pages of 8 MiB, no other free pages");

    auto free_by = [](Client& c, const std::string& pool) {
      return [&c, pool](const std::vector<PageRange>& pages) {
        CheckOk(c.Free(pool, pages), "free");
      };
    };
    // Publishes every page under keys of its own round: they are cached,
    // and the next Alloc evicts them.
    auto publish = [&alice, &round](const std::string& pool) {
      return [&alice, &round, pool](const std::vector<PageRange>& pages) {
        std::vector<CacheItem> items;
        std::string parent;
        for (const PageRange& r : pages) {
          for (uint64_t p = r.first_page; p < r.first_page + r.num_pages; ++p) {
            std::string key = absl::StrCat("r", round, "-p", p);
            items.push_back({key, parent, p});
            parent = std::move(key);
          }
        }
        ++round;
        CheckOk(alice.Publish(pool, "bench-zeroing", items), "publish");
      };
    };
    // Bob takes and frees the pool's pages first: Alice's Alloc then finds
    // only pages holding Bob's bytes.
    auto after_bob = [&](const std::string& pool) {
      TimedOp inner = AllocThen(alice, pool, n, free_by(alice, pool));
      return TimedOp([&bob, pool, n, inner] {
        absl::StatusOr<std::vector<PageRange>> got = bob.Alloc(pool, n * kPageTokens);
        CheckOk(got, "bob alloc");
        CheckOk(bob.Free(pool, *got), "bob free");
        return inner();
      });
    };
    struct Case {
      std::string name;
      TimedOp op, base;
    };
    std::vector<Case> cases;
    cases.push_back({"Alloc right after the same session freed the pages",
                     AllocThen(alice, big, n, free_by(alice, big)),
                     AllocThen(alice, small, n, free_by(alice, small))});
    cases.push_back({"Alloc evicting pages the same session published",
                     AllocThen(alice, big, n, publish(big)),
                     AllocThen(alice, small, n, publish(small))});
    cases.push_back({"Alloc right after another session freed the pages (zeroed)",
                     after_bob(big), after_bob(small)});
    for (const Case& c : cases) {
      Samples op, base;
      Interleave(warmup, rounds, per_round, c.op, c.base, &op, &base);
      AddLatencyRows(report, kSection, c.name, config, op, base,
                     "same calls, 512-byte pages", Target::AtMost(2.0, "<= 2x"),
                     Target::None());
    }
    // Nothing cached is left to evict in the next size's pools.
    CheckOk(alice.DeletePool(big), "delete " + big);
    CheckOk(alice.DeletePool(small), "delete " + small);
  }
}

}  // namespace hostkv::bench
