// Section 5b (cache_rpc): the page cache through the real hostkvd on a Unix
// socket, with hostkv::Client. (a) Lookup of 1,000 keys, all cached, without
// and with acquire (and the Release of those references); (b) Publish of a
// 1,000-page chain; each beside the bare unary gRPC call (Health/Check over
// the same connection, as section 1), interleaved. (c) A warm restart:
// session A writes pages from its device buffers, publishes them and ends;
// session B looks the keys up with acquire and loads them into its own device
// buffers: the time until layer 0 is signalled, beside A's own load of the
// same pages into the same geometry before it published them.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hostkv/v1/hostkv.grpc.pb.h"
#include "tests/bench/daemon_util.h"
#include "tests/bench/sections.h"

namespace hostkv::bench {
namespace {

constexpr char kSection[] = "cache_rpc";
constexpr char kNamespace[] = "bench/llama-like/tp0";
constexpr uint64_t kKeys = 1000;
constexpr uint32_t kCtlPageSize = 16;

// A 32-byte key (the size of SGLang's SHA-256 page hash) for page `i` of
// chain `chain`.
std::string Key(uint64_t chain, uint64_t i) {
  std::string key(32, '\0');
  std::memcpy(key.data(), &chain, sizeof(chain));
  std::memcpy(key.data() + 8, &i, sizeof(i));
  for (size_t b = 16; b < key.size(); ++b) {
    key[b] = static_cast<char>(chain * 131 + i * 7 + b);
  }
  return key;
}

std::vector<std::string> ChainKeys(uint64_t chain, uint64_t n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  for (uint64_t i = 0; i < n; ++i) keys.push_back(Key(chain, i));
  return keys;
}

// One item per page of `pages` (in order), keys of `chain`, each the parent
// of the next.
std::vector<CacheItem> ChainItems(uint64_t chain,
                                  const std::vector<PageRange>& pages) {
  std::vector<CacheItem> items;
  uint64_t i = 0;
  for (const PageRange& run : pages) {
    for (uint64_t p = 0; p < run.num_pages; ++p, ++i) {
      items.push_back(
          {Key(chain, i), i == 0 ? "" : Key(chain, i - 1), run.first_page + p});
    }
  }
  return items;
}

struct Sizes {
  int warmup, rounds, per_round;
};

// (a) and (b): the pool of section 1 (MLA, 1 layer, kv dim 8, fp8,
// page_first, 8 bytes per token): its pages cost nothing to hold, so the
// calls' own cost shows.
void RunCalls(const Options& options, const std::string& target, Client& client,
              HealthCaller& health, Report& report) {
  const Sizes sz = options.quick ? Sizes{5, 3, 10} : Sizes{30, 10, 40};
  const std::string pool = "cache_ctl";
  CheckOk(client.CreatePool(MlaSpec(pool, 1, 4, 4, v1::DTYPE_FP8_E4M3,
                                    kCtlPageSize, v1::LAYOUT_PAGE_FIRST,
                                    8 * kKeys * kCtlPageSize)),
          "create pool " + pool);
  const TimedOp base = Timed([&] { health.Check(); });
  const std::string config = "unix, 1,000 keys of 32 bytes, one chain";

  // Chain 0: 1,000 pages cached, looked up whole.
  absl::StatusOr<std::vector<PageRange>> pages =
      client.Alloc(pool, kKeys * kCtlPageSize);
  CheckOk(pages, "alloc 1,000 pages");
  absl::StatusOr<PublishOutcomes> published =
      client.Publish(pool, kNamespace, ChainItems(0, *pages));
  CheckOk(published, "publish chain 0");
  if (published->cached != kKeys) Die("chain 0: not every page was cached");
  const std::vector<std::string> keys = ChainKeys(0, kKeys);
  auto lookup = [&](bool acquire) {
    absl::StatusOr<LookupResult> r =
        client.Lookup(pool, kNamespace, keys, acquire);
    CheckOk(r, "lookup");
    if (r->hits != kKeys) Die(absl::StrCat("lookup: ", r->hits, " hits"));
    return r->pages;
  };
  {
    Samples op, b;
    Interleave(sz.warmup, sz.rounds, sz.per_round,
               Timed([&] { lookup(false); }), base, &op, &b);
    AddLatencyRows(report, kSection, "Lookup, all hit", config, op, b,
                   "health check", Target::None(), Target::None());
  }
  // Where the time goes: the same Lookup request, built once, through a
  // bare generated stub on the same connection (no client library, no
  // deadline): the daemon's handler plus gRPC and protobuf for 32 KB of keys.
  {
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        target, grpc::InsecureChannelCredentials(), ClientChannelArgs());
    std::unique_ptr<v1::HostKV::Stub> stub = v1::HostKV::NewStub(channel);
    v1::LookupRequest request;
    request.set_session_id(client.session_id());
    request.set_pool(pool);
    request.set_namespace_(kNamespace);
    for (const std::string& key : keys) request.add_keys(key);
    Samples op, b;
    Interleave(sz.warmup, sz.rounds, sz.per_round, Timed([&] {
                 grpc::ClientContext context;
                 v1::LookupResponse response;
                 if (!stub->Lookup(&context, request, &response).ok() ||
                     response.hits() != kKeys) {
                   Die("bare lookup");
                 }
               }),
               base, &op, &b);
    AddLatencyRows(report, kSection, "Lookup, all hit, via a bare stub", config,
                   op, b, "health check", Target::None(), Target::None(),
                   "request built once; no client library, no deadline");
  }
  {
    Samples op, b, rel, b2;
    Interleave(
        sz.warmup, sz.rounds, sz.per_round,
        [&] {
          const Clock::time_point t0 = Clock::now();
          const std::vector<PageRange> found = lookup(true);
          const double ns = NanosBetween(t0, Clock::now());
          CheckOk(client.Release(pool, found), "release");
          return ns;
        },
        base, &op, &b);
    AddLatencyRows(report, kSection, "Lookup with acquire, all hit", config, op,
                   b, "health check", Target::None(), Target::None(),
                   "Release of the references untimed");
    Interleave(
        sz.warmup, sz.rounds, sz.per_round,
        [&] {
          const std::vector<PageRange> found = lookup(true);
          const Clock::time_point t0 = Clock::now();
          absl::StatusOr<uint64_t> released = client.Release(pool, found);
          const double ns = NanosBetween(t0, Clock::now());
          CheckOk(released, "release");
          if (*released != kKeys) Die("release: not every reference dropped");
          return ns;
        },
        base, &rel, &b2);
    AddLatencyRows(report, kSection, "Release of 1,000 references", config, rel,
                   b2, "health check", Target::None(), Target::None(),
                   "right after the Lookup that took them (untimed)");
  }

  // A fresh chain per call: the Alloc before it is untimed, and evicts the
  // chains published before once the pool is full (chain 0 stays: after
  // the ones published later in LRU order, and looked up).
  {
    uint64_t chain = 1;
    Samples op, b;
    Interleave(
        sz.warmup, sz.rounds, sz.per_round,
        [&] {
          absl::StatusOr<std::vector<PageRange>> fresh =
              client.Alloc(pool, kKeys * kCtlPageSize);
          CheckOk(fresh, "alloc for publish");
          const std::vector<CacheItem> items = ChainItems(chain++, *fresh);
          const Clock::time_point t0 = Clock::now();
          absl::StatusOr<PublishOutcomes> r =
              client.Publish(pool, kNamespace, items);
          const double ns = NanosBetween(t0, Clock::now());
          CheckOk(r, "publish");
          if (r->cached != kKeys) Die("publish: not every page was cached");
          return ns;
        },
        base, &op, &b);
    AddLatencyRows(
        report, kSection, "Publish of 1,000 pages (new chain)", config, op, b,
        "health check", Target::None(), Target::None(),
        "the Alloc before each call untimed (it evicts older chains)");
  }
  CheckOk(client.DeletePool(pool), "delete pool " + pool);
}

// (c) Geometry of a small Llama-like model: MHA, 32 layers, 8 KV heads x
// 128, bf16, page 16, layer_first; a prompt of 2,048 tokens (256 MiB).
struct Restart {
  uint32_t layers = 32;
  uint64_t tokens = 2048;
};

// Fills the first `tokens` rows of every buffer with words that differ per
// buffer, per position and per `seed`, so that a page loaded in the wrong
// place or from another restart shows.
void Fill(DeviceBuffers& d, uint64_t tokens, uint64_t seed) {
  const uint64_t words = d.buffer_bytes / d.token_slots * tokens / 8;
  for (uint64_t b = 0; b < d.k.size() + d.v.size(); ++b) {
    uint64_t* p =
        reinterpret_cast<uint64_t*>(d.shm->data() + b * d.buffer_bytes);
    for (uint64_t w = 0; w < words; ++w) p[w] = (seed << 48) ^ (b << 32) ^ w;
  }
}

// Whether B's layer-major buffers hold what A's did (first `tokens` rows).
bool SameRows(const DeviceBuffers& a, const DeviceBuffers& b, uint64_t tokens) {
  const uint64_t bytes = a.buffer_bytes / a.token_slots * tokens;
  for (uint64_t i = 0; i < a.k.size() + a.v.size(); ++i) {
    if (std::memcmp(a.shm->data() + i * a.buffer_bytes,
                    b.shm->data() + i * b.buffer_bytes, bytes) != 0) {
      return false;
    }
  }
  return true;
}

void RunWarmRestart(const Options& options, const std::string& target,
                    Client& b_client, Report& report) {
  Restart r;
  if (options.quick) r.tokens = 256;
  const int reps = options.quick ? 3 : 30;
  const std::string pool = "cache_restart";
  const uint64_t num_pages = r.tokens / kCtlPageSize;
  absl::StatusOr<v1::Pool> created = b_client.CreatePool(
      MhaSpec(pool, r.layers, 8, 128, v1::DTYPE_BF16, kCtlPageSize,
              v1::LAYOUT_LAYER_FIRST, 3 * r.tokens));
  CheckOk(created, "create pool " + pool);
  DeviceBuffers a_dev = MakeDeviceBuffers(*created, r.tokens);
  DeviceBuffers b_dev = MakeDeviceBuffers(*created, r.tokens);
  absl::StatusOr<uint64_t> b_import =
      b_client.RegisterDeviceBuffers(pool, b_dev.token_slots, b_dev.k, b_dev.v);
  CheckOk(b_import, "register B's buffers");
  const std::vector<SlotRange> slots = {{0, r.tokens}};

  Samples own_first, own_last, warm_first, warm_last, warm_lookup, warm_again,
      b_own_copy;
  for (int rep = -1; rep < reps; ++rep) {  // rep -1 warms up
    const uint64_t chain = 1000 + static_cast<uint64_t>(rep + 1);
    {
      // Session A: writes, loads what it wrote (the baseline), publishes,
      // ends.
      absl::StatusOr<std::unique_ptr<Client>> a =
          Client::Connect(target, "bench-restart-a");
      CheckOk(a, "connect A");
      absl::StatusOr<uint64_t> a_import = (*a)->RegisterDeviceBuffers(
          pool, a_dev.token_slots, a_dev.k, a_dev.v);
      CheckOk(a_import, "register A's buffers");
      absl::StatusOr<std::vector<PageRange>> pages =
          (*a)->Alloc(pool, r.tokens);
      CheckOk(pages, "A: alloc");
      Fill(a_dev, r.tokens, chain);
      absl::StatusOr<Operation> backup =
          (*a)->Backup(pool, *a_import, *pages, slots);
      CheckOk(backup, "A: backup");
      CheckOk((*a)->Wait(*backup), "A: wait backup");
      // A's buffers keep the pattern: the load writes the same bytes back.
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<Operation> load =
          (*a)->Load(pool, *a_import, *pages, slots);
      CheckOk(load, "A: load");
      CheckOk((*a)->WaitLayer(*load, 0), "A: wait layer 0");
      const double first_ns = NanosBetween(t0, Clock::now());
      CheckOk((*a)->Wait(*load), "A: wait load");
      const double last_ns = NanosBetween(t0, Clock::now());
      absl::StatusOr<PublishOutcomes> published =
          (*a)->Publish(pool, kNamespace, ChainItems(chain, *pages));
      CheckOk(published, "A: publish");
      if (published->cached != num_pages) Die("A: not every page was cached");
      CheckOk((*a)->Close(), "A: close");
      if (rep >= 0) {
        own_first.Add(first_ns);
        own_last.Add(last_ns);
      }
    }
    // Session B, after A's end: its buffers start clean.
    std::memset(b_dev.shm->data(), 0, b_dev.shm->size());
    const std::vector<std::string> keys = ChainKeys(chain, num_pages);
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<LookupResult> found =
        b_client.Lookup(pool, kNamespace, keys, /*acquire=*/true);
    const double lookup_ns = NanosBetween(t0, Clock::now());
    CheckOk(found, "B: lookup");
    if (found->hits != num_pages) Die("B: the restart found a partial prefix");
    absl::StatusOr<Operation> load =
        b_client.Load(pool, *b_import, found->pages, slots);
    CheckOk(load, "B: load");
    CheckOk(b_client.WaitLayer(*load, 0), "B: wait layer 0");
    const double first_ns = NanosBetween(t0, Clock::now());
    CheckOk(b_client.Wait(*load), "B: wait load");
    const double last_ns = NanosBetween(t0, Clock::now());
    if (!SameRows(a_dev, b_dev, r.tokens)) {
      Die("B: the loaded bytes differ from what A published");
    }
    // The same referenced pages loaded again by B: what a second load of
    // cached pages costs, with the restart behind it.
    const Clock::time_point t1 = Clock::now();
    absl::StatusOr<Operation> again =
        b_client.Load(pool, *b_import, found->pages, slots);
    CheckOk(again, "B: load again");
    CheckOk(b_client.WaitLayer(*again, 0), "B: wait layer 0 again");
    const double again_ns = NanosBetween(t1, Clock::now());
    CheckOk(b_client.Wait(*again), "B: wait load again");
    // B's own copy of the same bytes (CopyPages into pages it owns), loaded:
    // the same load of pages that are not cached, by the same session.
    absl::StatusOr<std::vector<PageRange>> own = b_client.Alloc(pool, r.tokens);
    CheckOk(own, "B: alloc for a copy");
    CheckOk(b_client.CopyPages(pool, found->pages, *own), "B: copy pages");
    CheckOk(b_client.Release(pool, found->pages), "B: release");
    const Clock::time_point t2 = Clock::now();
    absl::StatusOr<Operation> own_load =
        b_client.Load(pool, *b_import, *own, slots);
    CheckOk(own_load, "B: load its copy");
    CheckOk(b_client.WaitLayer(*own_load, 0), "B: wait layer 0 of its copy");
    const double own_copy_ns = NanosBetween(t2, Clock::now());
    CheckOk(b_client.Wait(*own_load), "B: wait load of its copy");
    if (!SameRows(a_dev, b_dev, r.tokens)) {
      Die("B: its copy of the pages loads other bytes than A published");
    }
    CheckOk(b_client.Free(pool, *own), "B: free its copy");
    if (rep < 0) continue;
    warm_again.Add(again_ns);
    b_own_copy.Add(own_copy_ns);
    warm_lookup.Add(lookup_ns);
    warm_first.Add(first_ns);
    warm_last.Add(last_ns);
  }
  const std::string config =
      absl::StrCat("unix, MHA ", r.layers,
                   "x8x128 bf16, page 16, layer_first, ", r.tokens, " tokens");
  struct Out {
    const char* name;
    const Samples* value;
    const Samples* base;
    const char* baseline;
  };
  const Out outs[] = {
      {"Warm restart: Lookup(acquire) + Load -> layer 0 signalled", &warm_first,
       &own_first, "the writer's own Load -> layer 0, same pages"},
      {"Warm restart: Lookup(acquire) + Load -> last layer signalled",
       &warm_last, &own_last,
       "the writer's own Load -> last layer, same pages"},
      {"Warm restart: a second Load of the same cached pages -> layer 0",
       &warm_again, &own_first, "the writer's own Load -> layer 0, same pages"},
      {"Warm restart: B's Load of its own CopyPages copy -> layer 0",
       &b_own_copy, &own_first, "the writer's own Load -> layer 0, same pages"},
      {"Warm restart: its Lookup(acquire) alone", &warm_lookup, &own_first,
       "the writer's own Load -> layer 0, same pages"},
  };
  const uint64_t bytes = created->page_bytes() * num_pages;
  for (const Out& o : outs) {
    Row row;
    row.section = kSection;
    row.name = o.name;
    row.config = config;
    row.metric = "median latency";
    row.unit = "ms";
    row.value = o.value->Median() / 1e6;
    row.baseline = o.baseline;
    row.baseline_value = o.base->Median() / 1e6;
    row.note = absl::StrCat(bytes >> 20, " MiB, ", num_pages,
                            " pages, n=", o.value->size(),
                            "; bytes checked equal after each restart");
    report.Add(row);
  }
  CheckOk(b_client.UnregisterDeviceBuffers(*b_import), "unregister B");
  CheckOk(b_client.DeletePool(pool), "delete pool " + pool);
}

}  // namespace

void RunCacheRpc(const Options& options, Report& report) {
  std::fprintf(stderr, "page cache through the daemon (unix)\n");
  DaemonHandle daemon = StartDaemon(false);
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(daemon->target(), "bench-cache");
  CheckOk(client, "connect");
  HealthCaller health(daemon->target());
  RunCalls(options, daemon->target(), **client, health, report);
  RunWarmRestart(options, daemon->target(), **client, report);
  CheckOk((*client)->Close(), "close");
}

}  // namespace hostkv::bench
