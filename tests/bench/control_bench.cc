// Section 1: the control path through the real hostkvd, on a Unix socket and
// on TCP loopback. Every hostkv call goes through hostkv::Client (its
// per-call ClientContext with a deadline is part of what users pay); the
// baseline is grpc.health.v1.Health/Check, a bare unary call over the same
// connection, measured interleaved with it.
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hostkv/v1/hostkv.grpc.pb.h"
#include "tests/bench/daemon_util.h"
#include "tests/bench/sections.h"

namespace hostkv::bench {
namespace {

constexpr char kSection[] = "control";
constexpr uint32_t kCtlPageSize = 16;
constexpr uint64_t kMaxLoadPages = 1000;

struct Sizes {
  int warmup, rounds, per_round;
};

// The control-path pool: MLA, 1 layer, kv dim 8, fp8, page_first (8 bytes
// per token, a page's rows contiguous). Its copies are tiny (a 1,000-page
// load moves 128 KiB in 1,000 memcpys), so the copy a Load starts does not
// compete for the CPU with the RPC being timed; section 3b shows what a
// large copy does to the control path.
v1::PoolSpec CtlSpec() {
  return MlaSpec("ctl", 1, 4, 4, v1::DTYPE_FP8_E4M3, kCtlPageSize,
                 v1::LAYOUT_PAGE_FIRST, 8192 * kCtlPageSize);
}

const Target kAllocFreeTarget = Target::AtMost(1.3, "<= 1.3x");
const Target kLoadTarget = Target::AtMost(2.0, "<= 2x (1,000-page load)");

// The transfers of section 1: N host pages, each its own run (every other
// page of an allocation, as a fragmented pool hands them out), to N device
// slot runs with gaps between them.
struct ScatteredPages {
  std::vector<PageRange> host;     // kMaxLoadPages runs of 1 page
  std::vector<SlotRange> device;   // kMaxLoadPages runs of kCtlPageSize slots
  std::vector<PageRange> contiguous_host;  // 1 run of kMaxLoadPages pages
};

ScatteredPages AllocateScattered(Client& client, const std::string& pool) {
  ScatteredPages s;
  // The contiguous run first: the allocator hands out the lowest free pages,
  // which after the frees below would be the holes.
  absl::StatusOr<std::vector<PageRange>> contiguous =
      client.Alloc(pool, kMaxLoadPages * kCtlPageSize);
  CheckOk(contiguous, "alloc contiguous");
  if (contiguous->size() != 1) Die("expected one contiguous run");
  s.contiguous_host = *contiguous;
  absl::StatusOr<std::vector<PageRange>> all =
      client.Alloc(pool, 2 * kMaxLoadPages * kCtlPageSize);
  CheckOk(all, "alloc for loads");
  if (all->size() != 1) Die("expected one run from a fresh pool");
  const uint64_t first = (*all)[0].first_page;
  std::vector<PageRange> odd;
  for (uint64_t i = 0; i < kMaxLoadPages; ++i) {
    s.host.push_back({first + 2 * i, 1});
    odd.push_back({first + 2 * i + 1, 1});
    s.device.push_back({2 * i * kCtlPageSize, kCtlPageSize});
  }
  CheckOk(client.Free(pool, odd), "free odd pages");
  return s;
}

void RunLatency(const std::string& transport, const std::string& target,
                const Options& options, Client& client, HealthCaller& health,
                Report& report) {
  const Sizes fast = options.quick ? Sizes{20, 4, 50} : Sizes{100, 10, 100};
  const Sizes slow = options.quick ? Sizes{10, 4, 25} : Sizes{50, 10, 60};
  const std::string pool = "ctl";
  const TimedOp base = Timed([&] { health.Check(); });
  const TimedOp base2 = Timed([&] {
    health.Check();
    health.Check();
  });

  // The client library's own overhead beside the bare call: the same health
  // check with the 60 s deadline hostkv::Client sets on every call.
  {
    Samples op, b;
    Interleave(fast.warmup, fast.rounds, fast.per_round,
               Timed([&] { health.CheckWithDeadline(); }), base, &op, &b);
    AddLatencyRows(report, kSection, "Health/Check with a 60 s deadline",
                   transport, op, b, "health check", Target::None(),
                   Target::None(), "what the deadline alone costs");
  }

  // Where the time goes: hostkv.v1 calls through a bare generated stub (no
  // client library, no deadline) on the same connection. RenewSession is a
  // no-op handler (a session lookup): the daemon's synchronous gRPC path
  // alone.
  {
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        target, grpc::InsecureChannelCredentials(), ClientChannelArgs());
    std::unique_ptr<v1::HostKV::Stub> stub = v1::HostKV::NewStub(channel);
    v1::RenewSessionRequest renew;
    renew.set_session_id(client.session_id());
    Samples op, b;
    Interleave(fast.warmup, fast.rounds, fast.per_round, Timed([&] {
      grpc::ClientContext context;
      v1::RenewSessionResponse response;
      if (!stub->RenewSession(&context, renew, &response).ok()) Die("renew");
    }), base, &op, &b);
    AddLatencyRows(report, kSection, "RenewSession via a bare stub", transport,
                   op, b, "health check", Target::None(), Target::None(),
                   "no-op handler: the daemon's sync gRPC path");
    v1::AllocRequest alloc;
    alloc.set_session_id(client.session_id());
    alloc.set_pool(pool);
    alloc.set_num_tokens(kCtlPageSize);
    Samples op2, b2;
    Interleave(fast.warmup, fast.rounds, fast.per_round, [&] {
      grpc::ClientContext context;
      v1::AllocResponse response;
      const Clock::time_point t0 = Clock::now();
      const grpc::Status s = stub->Alloc(&context, alloc, &response);
      const double ns = NanosBetween(t0, Clock::now());
      if (!s.ok()) Die("raw alloc: " + s.error_message());
      CheckOk(client.Free(pool, {{response.pages(0).first_page(), 1}}), "free");
      return ns;
    }, base, &op2, &b2);
    AddLatencyRows(report, kSection, "Alloc (1 page) via a bare stub",
                   transport, op2, b2, "health check", Target::None(),
                   Target::None(), "no client library, no deadline");
  }

  // Alloc and Free of one page, each timed alone, and the pair.
  {
    Samples op, b;
    Interleave(fast.warmup, fast.rounds, fast.per_round, [&] {
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<std::vector<PageRange>> pages = client.Alloc(pool, kCtlPageSize);
      const double ns = NanosBetween(t0, Clock::now());
      CheckOk(pages, "alloc");
      CheckOk(client.Free(pool, *pages), "free");
      return ns;
    }, base, &op, &b);
    AddLatencyRows(report, kSection, "Alloc (1 page)", transport, op, b,
                   "health check", kAllocFreeTarget, kAllocFreeTarget);
  }
  {
    Samples op, b;
    Interleave(fast.warmup, fast.rounds, fast.per_round, [&] {
      absl::StatusOr<std::vector<PageRange>> pages = client.Alloc(pool, kCtlPageSize);
      CheckOk(pages, "alloc");
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<uint64_t> freed = client.Free(pool, *pages);
      const double ns = NanosBetween(t0, Clock::now());
      CheckOk(freed, "free");
      return ns;
    }, base, &op, &b);
    AddLatencyRows(report, kSection, "Free (1 page)", transport, op, b,
                   "health check", kAllocFreeTarget, kAllocFreeTarget);
  }
  {
    Samples op, b;
    Interleave(fast.warmup, fast.rounds, fast.per_round, Timed([&] {
      absl::StatusOr<std::vector<PageRange>> pages = client.Alloc(pool, kCtlPageSize);
      CheckOk(pages, "alloc");
      CheckOk(client.Free(pool, *pages), "free");
    }), base2, &op, &b);
    AddLatencyRows(report, kSection, "Alloc+Free (1 page)", transport, op, b,
                   "2 health checks", kAllocFreeTarget, kAllocFreeTarget);
  }

  // RegisterDeviceBuffers (32 layers x K/V = 64 buffers in one shm segment,
  // Llama-8B's geometry) and UnregisterDeviceBuffers.
  {
    absl::StatusOr<v1::Pool> reg_pool = client.CreatePool(
        MhaSpec("reg", 32, 8, 128, v1::DTYPE_BF16, 64, v1::LAYOUT_LAYER_FIRST, 64));
    CheckOk(reg_pool, "create pool reg");
    DeviceBuffers dev = MakeDeviceBuffers(*reg_pool, 128);
    Samples reg, unreg, pair, b1, b2, b3;
    auto reg_op = [&] {
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<uint64_t> id =
          client.RegisterDeviceBuffers("reg", dev.token_slots, dev.k, dev.v);
      const double ns = NanosBetween(t0, Clock::now());
      CheckOk(id, "register");
      CheckOk(client.UnregisterDeviceBuffers(*id), "unregister");
      return ns;
    };
    auto unreg_op = [&] {
      absl::StatusOr<uint64_t> id =
          client.RegisterDeviceBuffers("reg", dev.token_slots, dev.k, dev.v);
      CheckOk(id, "register");
      const Clock::time_point t0 = Clock::now();
      absl::Status s = client.UnregisterDeviceBuffers(*id);
      const double ns = NanosBetween(t0, Clock::now());
      CheckOk(s, "unregister");
      return ns;
    };
    auto pair_op = Timed([&] {
      absl::StatusOr<uint64_t> id =
          client.RegisterDeviceBuffers("reg", dev.token_slots, dev.k, dev.v);
      CheckOk(id, "register");
      CheckOk(client.UnregisterDeviceBuffers(*id), "unregister");
    });
    Interleave(slow.warmup, slow.rounds, slow.per_round, reg_op, base, &reg, &b1);
    Interleave(slow.warmup, slow.rounds, slow.per_round, unreg_op, base, &unreg, &b2);
    Interleave(slow.warmup, slow.rounds, slow.per_round, pair_op, base2, &pair, &b3);
    AddLatencyRows(report, kSection, "RegisterDeviceBuffers (64 buffers)",
                   transport, reg, b1, "health check", Target::None(),
                   Target::None());
    AddLatencyRows(report, kSection, "UnregisterDeviceBuffers", transport,
                   unreg, b2, "health check", Target::None(), Target::None());
    AddLatencyRows(report, kSection, "Register+Unregister", transport, pair,
                   b3, "2 health checks", Target::None(), Target::None());
  }

  // GetPoolStats of every pool (two pools, one session).
  {
    Samples op, b;
    Interleave(fast.warmup, fast.rounds, fast.per_round, Timed([&] {
      CheckOk(client.GetPoolStats(), "stats");
    }), base, &op, &b);
    AddLatencyRows(report, kSection, "GetPoolStats (all pools)", transport, op,
                   b, "health check", Target::None(), Target::None());
  }

  // Load and Backup submission: the RPC is timed; waiting for the copy to
  // finish is not.
  absl::StatusOr<v1::Pool> ctl = client.GetPool(pool);
  CheckOk(ctl, "get pool ctl");
  DeviceBuffers dev = MakeDeviceBuffers(*ctl, 2 * kMaxLoadPages * kCtlPageSize);
  absl::StatusOr<uint64_t> import =
      client.RegisterDeviceBuffers(pool, dev.token_slots, dev.k, dev.v);
  CheckOk(import, "register ctl");
  const ScatteredPages pages = AllocateScattered(client, pool);
  for (const bool load : {true, false}) {
    struct Case {
      uint64_t n;
      bool contiguous;
    };
    std::vector<Case> cases = {{1, false}, {100, false}, {1000, false}};
    if (load) cases.push_back({1000, true});
    for (const Case& c : cases) {
      std::vector<PageRange> host;
      std::vector<SlotRange> device;
      if (c.contiguous) {
        host = pages.contiguous_host;
        device = {{0, c.n * kCtlPageSize}};
      } else {
        host.assign(pages.host.begin(), pages.host.begin() + c.n);
        device.assign(pages.device.begin(), pages.device.begin() + c.n);
      }
      Samples op, b;
      const Sizes& sz = c.n >= 100 ? slow : fast;
      Interleave(sz.warmup, sz.rounds, sz.per_round, [&] {
        const Clock::time_point t0 = Clock::now();
        absl::StatusOr<Operation> o =
            load ? client.Load(pool, *import, host, device)
                 : client.Backup(pool, *import, host, device);
        const double ns = NanosBetween(t0, Clock::now());
        CheckOk(o, load ? "load" : "backup");
        CheckOk(client.Wait(*o), "wait");
        return ns;
      }, base, &op, &b);
      const std::string name = absl::StrCat(
          load ? "Load" : "Backup", " submit, ", c.n, c.n == 1 ? " page" : " pages",
          c.contiguous ? " (1 run)" : c.n == 1 ? "" : " (1 run each)");
      const Target t = load && c.n == 1000 ? kLoadTarget : Target::None();
      AddLatencyRows(report, kSection, name, transport, op, b, "health check", t,
                     t, "enqueue only");
    }
  }
  CheckOk(client.Free(pool, pages.host), "free loads");
  CheckOk(client.Free(pool, pages.contiguous_host), "free contiguous");
  CheckOk(client.UnregisterDeviceBuffers(*import), "unregister ctl");
}

// Calls per second of `threads` threads, each running `call` in a loop, for
// `seconds`; every call counts `calls_per_iteration`.
double Throughput(int threads, double seconds, int calls_per_iteration,
                  const std::function<void(int)>& call) {
  std::atomic<bool> go{false}, stop{false};
  std::vector<uint64_t> counts(threads * 8, 0);  // padded against sharing
  std::vector<std::thread> workers;
  std::atomic<int> ready{0};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        call(t);
        ++n;
      }
      counts[t * 8] = n;
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const Clock::time_point t0 = Clock::now();
  go.store(true);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (std::thread& w : workers) w.join();
  const double elapsed = SecondsSince(t0);
  uint64_t total = 0;
  for (int t = 0; t < threads; ++t) total += counts[t * 8];
  return total * calls_per_iteration / elapsed;
}

void RunThroughput(const std::string& transport, const std::string& target,
                   const Options& options, Report& report) {
  const int rounds = options.quick ? 1 : 2;
  const double seconds = options.quick ? 0.3 : options.throughput_seconds;
  for (int threads : {1, 2, 4, 8}) {
    std::vector<std::unique_ptr<Client>> clients;
    std::vector<std::unique_ptr<HealthCaller>> healths;
    for (int t = 0; t < threads; ++t) {
      absl::StatusOr<std::unique_ptr<Client>> c =
          Client::Connect(target, absl::StrCat("bench-tp-", t));
      CheckOk(c, "connect");
      clients.push_back(std::move(*c));
      healths.push_back(std::make_unique<HealthCaller>(target));
    }
    double hostkv_rate = 0, health_rate = 0;
    for (int r = 0; r < rounds; ++r) {
      health_rate += Throughput(threads, seconds, 1, [&](int t) {
        healths[t]->Check();
      });
      hostkv_rate += Throughput(threads, seconds, 2, [&](int t) {
        absl::StatusOr<std::vector<PageRange>> pages =
            clients[t]->Alloc("ctl", kCtlPageSize);
        CheckOk(pages, "alloc");
        CheckOk(clients[t]->Free("ctl", *pages), "free");
      });
    }
    Row row;
    row.section = "throughput";
    row.name = "Alloc+Free, calls/s (each call counts)";
    row.config = absl::StrCat(transport, ", ", threads,
                              threads == 1 ? " client" : " clients");
    row.metric = "throughput";
    row.unit = "calls/s";
    row.value = hostkv_rate / rounds;
    row.baseline = "health checks/s, same concurrency";
    row.baseline_value = health_rate / rounds;
    row.note = "a thread and a Client (or channel) each";
    report.Add(row);
  }
}

}  // namespace

void RunControl(const Options& options, Report& report) {
  for (const bool tcp : {false, true}) {
    const std::string transport = tcp ? "tcp loopback" : "unix socket";
    std::fprintf(stderr, "control path over %s\n", transport.c_str());
    DaemonHandle daemon = StartDaemon(tcp);
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(daemon->target(), "bench-control");
    CheckOk(client, "connect");
    CheckOk((*client)->CreatePool(CtlSpec()), "create pool ctl");
    HealthCaller health(daemon->target());
    RunLatency(transport, daemon->target(), options, **client, health, report);
    RunThroughput(transport, daemon->target(), options, report);
  }
}

int RunProfileLoop(const std::string& what, bool tcp, double seconds) {
  DaemonHandle daemon = StartDaemon(tcp);
  absl::StatusOr<std::unique_ptr<Client>> c =
      Client::Connect(daemon->target(), "bench-profile");
  CheckOk(c, "connect");
  Client& client = **c;
  CheckOk(client.CreatePool(CtlSpec()), "create pool");
  HealthCaller health(daemon->target());
  absl::StatusOr<v1::Pool> ctl = client.GetPool("ctl");
  CheckOk(ctl, "get pool");
  DeviceBuffers dev = MakeDeviceBuffers(*ctl, 2 * kMaxLoadPages * kCtlPageSize);
  absl::StatusOr<uint64_t> import =
      client.RegisterDeviceBuffers("ctl", dev.token_slots, dev.k, dev.v);
  CheckOk(import, "register");
  const ScatteredPages pages = AllocateScattered(client, "ctl");
  std::function<void()> body;
  if (what == "health") {
    body = [&] { health.Check(); };
  } else if (what == "alloc_free") {
    body = [&] {
      absl::StatusOr<std::vector<PageRange>> p = client.Alloc("ctl", kCtlPageSize);
      CheckOk(p, "alloc");
      CheckOk(client.Free("ctl", *p), "free");
    };
  } else if (what == "stats") {
    body = [&] { CheckOk(client.GetPoolStats(), "stats"); };
  } else if (what == "register") {
    body = [&] {
      absl::StatusOr<uint64_t> id =
          client.RegisterDeviceBuffers("ctl", dev.token_slots, dev.k, dev.v);
      CheckOk(id, "register");
      CheckOk(client.UnregisterDeviceBuffers(*id), "unregister");
    };
  } else if (what == "load1000") {
    body = [&] {
      absl::StatusOr<Operation> o =
          client.Load("ctl", *import, pages.host, pages.device);
      CheckOk(o, "load");
      CheckOk(client.Wait(*o), "wait");
    };
  } else {
    Die("unknown --profile workload " + what);
  }
  std::printf("daemon_pid %d\n", daemon->pid());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // time to attach
  uint64_t n = 0;
  const Clock::time_point t0 = Clock::now();
  while (SecondsSince(t0) < seconds) {
    body();
    ++n;
  }
  std::printf("%s: %llu iterations, %.2f us each\n", what.c_str(),
              static_cast<unsigned long long>(n), SecondsSince(t0) * 1e6 / n);
  return 0;
}

}  // namespace hostkv::bench
