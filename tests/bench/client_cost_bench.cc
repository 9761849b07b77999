// client_cost_bench: the C++ half of tests/bench/python_client_bench.py.
// Connects to a running hostkvd (it starts none), opens one hostkv::Client
// session and times, on one thread, the operations the Python half times
// with hostkv.Client:
//
//   health_check     grpc.health.v1.Health/Check through a generated stub,
//                    no deadline: the bare unary call (the baseline)
//   alloc_bare_stub  hostkv.v1.HostKV/Alloc of one page through a generated
//                    stub, no client library (the page is freed untimed)
//   alloc, free      Client::Alloc of one page (page_size tokens), then
//                    Client::Free of it, each timed alone
//   load_submit      Client::Load of one page into a sealed-memfd device
//                    buffer, until the call returns (the copy is enqueued)
//   load_wait        the same load until Client::Wait returns (all layers
//                    copied)
//   backup_submit    Client::Backup of the same page(s) out of the device
//                    buffer, until the call returns (the wait is untimed)
//
// With --pages=N every operation but the bare ones moves N pages (one run
// each side). The hot calls go through the session's command ring unless
// HOSTKV_COMMAND_RING=0 is set.
//
// and prints, at the end, one JSON object on stdout: per operation n, p50
// and p99 in microseconds, ops/s of one caller (1 / mean), and the p50 of
// every round. With --stdin_rounds it runs one round per line read from
// stdin and answers "done" on stdout after each, so that the driver can
// alternate C++ and Python rounds against the same daemon.
//
//   client_cost_bench --target=unix:/tmp/x/hostkvd.sock --pool=cost
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hostkv/v1/hostkv.grpc.pb.h"
#include "tests/bench/daemon_util.h"

ABSL_FLAG(std::string, target, "",
          "the daemon, e.g. unix:/run/hostkv/hostkvd.sock");
ABSL_FLAG(std::string, pool, "",
          "an existing MHA or MLA pool to allocate from and load out of");
ABSL_FLAG(int, pages, 1, "pages per alloc, free, load and backup");
ABSL_FLAG(int, rounds, 10, "rounds to run (ignored with --stdin_rounds)");
ABSL_FLAG(int, per_round, 200, "calls of each operation per round");
ABSL_FLAG(int, warmup, 100, "untimed calls of each operation before round 1");
ABSL_FLAG(bool, stdin_rounds, false,
          "run one round per line read from stdin, answering \"done\" after "
          "each, until EOF (how python_client_bench.py interleaves)");

namespace hostkv::bench {
namespace {

// Samples of one operation: all of them, and the current round's.
struct OpSamples {
  Samples all;
  Samples round;
  std::vector<double> round_p50_ns;

  void Add(double ns) {
    all.Add(ns);
    round.Add(ns);
  }
  void EndRound() {
    if (round.empty()) return;
    round_p50_ns.push_back(round.Median());
    round = Samples();
  }
};

// One session with the daemon and what the timed operations need: a
// registered device buffer and one allocated page to load from.
// Single-threaded.
class ClientCostBench {
 public:
  ClientCostBench(const std::string& target, const std::string& pool,
                  uint32_t num_pages)
      : pool_(pool), pages_(num_pages), health_(target) {
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(target, "client-cost-bench-cpp");
    CheckOk(client, "connect");
    client_ = std::move(*client);
    // A second channel with the client library's arguments shares its
    // connection (gRPC's global subchannel pool), as HealthCaller's does.
    stub_ = v1::HostKV::NewStub(grpc::CreateCustomChannel(
        target, grpc::InsecureChannelCredentials(), ClientChannelArgs()));
    absl::StatusOr<v1::Pool> info = client_->GetPool(pool_);
    CheckOk(info, "get pool " + pool_);
    page_size_ = info->spec().page_size();
    tokens_ = uint64_t{pages_} * page_size_;
    RegisterDeviceBuffer(*info);
    absl::StatusOr<std::vector<PageRange>> to_load =
        client_->Alloc(pool_, tokens_);
    CheckOk(to_load, "alloc the pages to load");
    load_pages_ = *to_load;
    alloc_request_.set_session_id(client_->session_id());
    alloc_request_.set_pool(pool_);
    alloc_request_.set_num_tokens(tokens_);
  }

  // `n` untimed calls of every operation.
  void Warmup(int n) {
    for (int i = 0; i < n; ++i) {
      health_.Check();
      FreeOrDie(AllocBareStub());
      FreeOrDie(AllocOrDie());
      LoadOnce();
      BackupOnce();
    }
  }

  // `per_round` timed calls of each operation, one operation after another.
  void Round(int per_round) {
    for (int i = 0; i < per_round; ++i) {
      const Clock::time_point t0 = Clock::now();
      health_.Check();
      ops_["health_check"].Add(NanosBetween(t0, Clock::now()));
    }
    for (int i = 0; i < per_round; ++i) {
      const Clock::time_point t0 = Clock::now();
      std::vector<PageRange> pages = AllocBareStub();
      ops_["alloc_bare_stub"].Add(NanosBetween(t0, Clock::now()));
      FreeOrDie(pages);
    }
    for (int i = 0; i < per_round; ++i) {
      const Clock::time_point t0 = Clock::now();
      std::vector<PageRange> pages = AllocOrDie();
      const Clock::time_point t1 = Clock::now();
      FreeOrDie(pages);
      const Clock::time_point t2 = Clock::now();
      ops_["alloc"].Add(NanosBetween(t0, t1));
      ops_["free"].Add(NanosBetween(t1, t2));
    }
    for (int i = 0; i < per_round; ++i) {
      const auto [submit_ns, total_ns] = LoadOnce();
      ops_["load_submit"].Add(submit_ns);
      ops_["load_wait"].Add(total_ns);
    }
    for (int i = 0; i < per_round; ++i) {
      ops_["backup_submit"].Add(BackupOnce());
    }
    for (auto& [name, op] : ops_) op.EndRound();
  }

  std::string Json() const {
    std::vector<std::string> ops;
    for (const auto& [name, op] : ops_) {
      std::vector<std::string> rounds;
      for (double ns : op.round_p50_ns)
        rounds.push_back(absl::StrCat(ns / 1e3));
      const double mean_ns = op.all.Mean();
      ops.push_back(absl::StrCat(
          "\"", name, "\": {\"n\": ", op.all.size(),
          ", \"p50_us\": ", op.all.Percentile(50) / 1e3,
          ", \"p99_us\": ", op.all.Percentile(99) / 1e3,
          ", \"ops_per_s\": ", mean_ns > 0 ? 1e9 / mean_ns : 0,
          ", \"round_p50_us\": [", absl::StrJoin(rounds, ", "), "]}"));
    }
    return absl::StrCat("{\"language\": \"C++\", \"build\": \"",
                        HOSTKV_BENCH_BUILD_TYPE, ", ", HOSTKV_BENCH_COMPILER,
                        "\", \"page_size\": ", page_size_,
                        ", \"pages\": ", pages_, ", \"command_ring\": ",
                        client_->CommandRingCalls() >= 0 ? "true" : "false",
                        ", \"ops\": {",
                        absl::StrJoin(ops, ", "), "}}\n");
  }

 private:
  // The device side: one sealed memfd holding every layer's K and V (or
  // latent) buffer of 4 pages of slots, passed over the session socket.
  void RegisterDeviceBuffer(const v1::Pool& info) {
    const bool mla = info.spec().geometry().has_mla();
    const uint32_t layers = mla ? info.spec().geometry().mla().num_layers()
                                : info.spec().geometry().mha().num_layers();
    const uint32_t planes = mla ? 1 : 2;
    const uint64_t slots = std::max<uint64_t>(4, pages_) * page_size_;
    const uint64_t bytes = slots * info.token_stride();
    absl::StatusOr<ShmDeviceBuffer> shm =
        ShmDeviceBuffer::CreateSealed(bytes * layers * planes);
    CheckOk(shm, "create the device buffer");
    device_ = std::make_unique<ShmDeviceBuffer>(std::move(*shm));
    absl::StatusOr<uint64_t> handle = client_->PassDescriptor(device_->fd());
    CheckOk(handle, "pass the device buffer");
    std::vector<v1::DeviceBuffer> k, v;
    for (uint32_t l = 0; l < layers; ++l) {
      for (uint32_t p = 0; p < planes; ++p) {
        (p == 0 ? k : v)
            .push_back(ShmDeviceBuffer::DescribePassed(
                *handle, (uint64_t{p} * layers + l) * bytes, bytes));
      }
    }
    absl::StatusOr<uint64_t> id =
        client_->RegisterDeviceBuffers(pool_, slots, k, v);
    CheckOk(id, "register the device buffer");
    import_id_ = *id;
  }

  std::vector<PageRange> AllocOrDie() {
    absl::StatusOr<std::vector<PageRange>> pages =
        client_->Alloc(pool_, tokens_);
    CheckOk(pages, "alloc");
    return *pages;
  }

  void FreeOrDie(const std::vector<PageRange>& pages) {
    CheckOk(client_->Free(pool_, pages), "free");
  }

  std::vector<PageRange> AllocBareStub() {
    grpc::ClientContext context;
    v1::AllocResponse response;
    const grpc::Status status =
        stub_->Alloc(&context, alloc_request_, &response);
    if (!status.ok()) Die("bare-stub alloc: " + status.error_message());
    std::vector<PageRange> pages;
    for (const v1::PageRun& run : response.pages()) {
      pages.push_back({run.first_page(), run.num_pages()});
    }
    return pages;
  }

  // Loads the page into slots [0, page_size); returns the nanoseconds to
  // the call's return and to the end of the wait.
  std::pair<double, double> LoadOnce() {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<Operation> op =
        client_->Load(pool_, import_id_, load_pages_, {{0, tokens_}});
    const Clock::time_point t1 = Clock::now();
    CheckOk(op, "load");
    CheckOk(client_->Wait(*op), "wait");
    const Clock::time_point t2 = Clock::now();
    return {NanosBetween(t0, t1), NanosBetween(t0, t2)};
  }

  // Backs the pages up out of slots [0, tokens); returns the nanoseconds to
  // the call's return (the wait that follows is untimed).
  double BackupOnce() {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<Operation> op =
        client_->Backup(pool_, import_id_, load_pages_, {{0, tokens_}});
    const Clock::time_point t1 = Clock::now();
    CheckOk(op, "backup");
    CheckOk(client_->Wait(*op), "wait");
    return NanosBetween(t0, t1);
  }

  const std::string pool_;
  const uint32_t pages_;
  uint64_t tokens_ = 0;
  HealthCaller health_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::HostKV::Stub> stub_;
  std::unique_ptr<ShmDeviceBuffer> device_;
  uint32_t page_size_ = 0;
  uint64_t import_id_ = 0;
  std::vector<PageRange> load_pages_;
  v1::AllocRequest alloc_request_;
  std::map<std::string, OpSamples> ops_;
};

}  // namespace
}  // namespace hostkv::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using hostkv::bench::Die;
  const std::string target = absl::GetFlag(FLAGS_target);
  const std::string pool = absl::GetFlag(FLAGS_pool);
  if (target.empty() || pool.empty()) Die("--target and --pool are required");
  const int per_round = absl::GetFlag(FLAGS_per_round);
  if (absl::GetFlag(FLAGS_pages) < 1) Die("--pages must be at least 1");
  hostkv::bench::ClientCostBench bench(target, pool,
                                       static_cast<uint32_t>(absl::GetFlag(FLAGS_pages)));
  bench.Warmup(absl::GetFlag(FLAGS_warmup));
  if (absl::GetFlag(FLAGS_stdin_rounds)) {
    std::printf("ready\n");
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
      bench.Round(per_round);
      std::printf("done\n");
      std::fflush(stdout);
    }
  } else {
    for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r)
      bench.Round(per_round);
  }
  const std::string json = bench.Json();
  std::fwrite(json.data(), 1, json.size(), stdout);
  return 0;
}
