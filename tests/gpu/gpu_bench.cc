// hostkv_gpu_bench: the CUDA data path through a real hostkvd, timed on the
// GPU. Per-layer loads and all-layer backups for both mechanisms and every
// layout, each beside the copy-engine limit measured in the same run (one
// contiguous cudaMemcpyAsync of the same bytes, pinned host memory); and the
// cost of the Load call beside a bare RPC (GetPool) to the same daemon.
// Writes DIR/gpu_bench.json and DIR/gpu_bench.md and prints the table.
//
//   hostkv_gpu_bench --out=DIR [--target=unix:PATH] [--tokens=16384]
//                    [--reps=5] [--quick] [--daemon_flags=--kernel_blocks=32]
//                    [--kernel_blocks=8,16,32] [--overlap_sweep=false]
//
// Without --target it starts hostkvd --cuda=on itself. Exits with status 2
// and says why when there is no GPU.
#include <cuda_runtime_api.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "hostkv/client.h"
#include "hostkv/cuda_buffers.h"
#include "tests/bench/bench_util.h"
#include "tests/gpu/gpu_bench_baselines.h"
#include "tests/gpu/gpu_bench_common.h"
#include "tests/gpu/gpu_bench_output.h"
#include "tests/gpu/gpu_bench_report.h"
#include "tests/gpu/gpu_engine.h"
#include "tests/gpu/scatter_baseline.h"
#include "tests/gpu/spin_kernel.h"

ABSL_FLAG(std::string, out, "",
          "directory for gpu_bench.json and gpu_bench.md");
ABSL_FLAG(std::string, target, "",
          "a running hostkvd with its CUDA backend (default: start one)");
ABSL_FLAG(uint64_t, tokens, 16384,
          "tokens per transfer (a multiple of 64); lowered to fit /dev/shm");
ABSL_FLAG(int, reps, 5, "measured repetitions per figure, after one warm-up");
ABSL_FLAG(double, case_seconds, 5,
          "stop repeating a figure after this long (at least 2 repetitions)");
ABSL_FLAG(double, max_seconds, 75,
          "skip the remaining transfer cases after this long");
ABSL_FLAG(bool, quick, false, "4096 tokens, 3 repetitions (a smoke run)");
ABSL_FLAG(bool, mla, true, "also measure an MLA (DeepSeek latent) model");
ABSL_FLAG(std::string, daemon_flags, "",
          "comma-separated extra flags for the hostkvd started here");
ABSL_FLAG(std::string, kernel_blocks, "8,16,32,64,128",
          "copy-kernel block counts to sweep (MHA page_first, KERNEL), each "
          "with a hostkvd of its own --kernel_blocks; empty: no sweep. The "
          "best of them is the default to choose (now 16)");
ABSL_FLAG(bool, overlap_sweep, true,
          "also measure DIRECT with --dma_prefer_overlap=false beside the "
          "default (cudaMemcpyFlagPreferOverlapWithCompute on)");

namespace hostkv::gpu_bench {
namespace {

using bench::Clock;
using bench::Num;
using bench::Samples;
using bench::SecondsSince;
using gpu_testing::CudaStream;
using gpu_testing::DeviceMemory;
using gpu_testing::EngineKvCache;

std::unique_ptr<testing::DaemonProcess> g_daemon;
// The report so far and where it goes (set by Main), for Fail().
Report* g_report = nullptr;
ReportOutput* g_output = nullptr;

}  // namespace

// Writes the report so far (every figure measured before the failure, and
// the failure as a note), stops the daemon (SIGTERM: it removes its
// segments) and exits at once: a stream left waiting must not be
// synchronized by exit handlers.
[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "hostkv_gpu_bench: %s\n", what.c_str());
  if (g_report != nullptr && g_output != nullptr) {
    g_report->notes.push_back("FAILED: " + what);
    g_output->Write(*g_report);
  }
  if (g_daemon != nullptr) {
    const std::string log = g_daemon->log();
    std::fprintf(stderr, "hostkvd log (end):\n%s\n",
                 log.substr(log.size() > 4000 ? log.size() - 4000 : 0).c_str());
  }
  g_daemon.reset();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

namespace {


v1::PoolSpec Spec(const std::string& name, const Model& m, v1::Layout layout,
                  uint64_t tokens) {
  return gpu_testing::Bf16PoolSpec(name, m.mla, m.layers, m.heads, m.dim,
                                   layout, kPageSize, tokens);
}

// The engine's side of one pool: session, KV cache, GPU signals, import,
// the pages of one transfer and the device slots they go to.
struct Engine {
  std::unique_ptr<EngineKvCache> cache;
  std::unique_ptr<GpuSignals> signals;
  std::unique_ptr<Client> client;
  std::string pool;
  uint64_t import_id = 0;
  std::vector<PageRange> pages;
  std::vector<SlotRange> slots;
  double pin_seconds = 0;
  ~Engine() {
    if (client != nullptr) client->Close().IgnoreError();
  }
};

std::unique_ptr<Engine> StartEngine(const std::string& target, const Model& m,
                                    v1::Layout layout, uint64_t tokens) {
  auto e = std::make_unique<Engine>();
  e->pool = absl::StrCat("gpubench-", m.mla ? "mla-" : "mha-",
                         v1::Layout_Name(layout).substr(7));
  e->client = Check(Client::Connect(target, "gpu-bench"), "connect");
  const v1::Pool pool = Check(
      e->client->CreatePool(Spec(e->pool, m, layout, tokens)), "create pool");
  Check(gpu_testing::AwaitPinned(*e->client, e->pool, absl::Seconds(60)),
        "pinning " + e->pool);
  const v1::GetPoolStatsResponse stats =
      Check(e->client->GetPoolStats(e->pool), "stats");
  e->pin_seconds = stats.pools(0).pin_seconds();
  gpu_testing::KvCacheShape shape;
  shape.layers = m.layers;
  shape.planes = m.planes();
  shape.token_slots = tokens + kPageSize;  // SGLang: device size + a page
  shape.token_stride = pool.token_stride();
  e->cache = Check(EngineKvCache::Create(shape), "KV cache");
  Check(e->cache->Fill(0), "clearing the KV cache");
  e->signals = Check(GpuSignals::Create(m.layers, 0), "GPU signals");
  e->import_id = Check(e->client->RegisterDeviceBuffers(
                           e->pool, shape.token_slots, e->cache->k(),
                           e->cache->v(), &e->signals->buffer()),
                       "register");
  Check(e->signals->AttachKvWord(*e->client, e->import_id), "KV-written page");
  e->pages = Check(e->client->Alloc(e->pool, tokens), "alloc");
  // Device pages in a fixed shuffled order: an engine's KV cache is
  // fragmented at page granularity.
  std::vector<uint64_t> order(tokens / kPageSize);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(42));
  for (uint64_t p : order) e->slots.push_back({p * kPageSize, kPageSize});
  return e;
}

// One transfer timed on the engine's stream: an event before the call, the
// engine's wait for each layer (all of them, or the last one only) and an
// event after each wait. `status` is the call's or the operation's error.
struct Timing {
  absl::Status status;
  double call_us = 0;
  std::vector<double> layer_ms;  // since the first event; one per wait
};

class OpTimer {
 public:
  explicit OpTimer(uint32_t layers)
      : stream_(Check(CudaStream::Create(), "stream")) {
    events_.resize(layers + 1);
    for (cudaEvent_t& ev : events_) {
      CheckCuda(cudaEventCreate(&ev), "cudaEventCreate");
    }
  }
  ~OpTimer() {
    for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
  }

  // A stream that never passes its waits is fatal (Fail): nothing could
  // synchronize the device after it.
  // From now on, each Run first launches a kernel on `stream` that keeps
  // every SM busy for `ms` (the engine's compute beside the copies); null:
  // none.
  void SetBusy(cudaStream_t stream, double ms) {
    busy_stream_ = stream;
    busy_ms_ = ms;
  }

  Timing Run(Engine& e, bool load, v1::CopyMechanism mechanism,
             bool every_layer, uint32_t layer_end = 0) {
    return Run(e, e.pages, e.slots, load, mechanism, every_layer, layer_end);
  }
  // The same for some of the engine's pages and slots.
  Timing Run(Engine& e, const std::vector<PageRange>& pages,
             const std::vector<SlotRange>& slots, bool load,
             v1::CopyMechanism mechanism, bool every_layer,
             uint32_t layer_end = 0) {
    TransferOptions options;
    options.mechanism = mechanism;
    options.layer_end = layer_end;
    if (busy_stream_ != nullptr) {
      CheckCuda(gpu_testing::LaunchBusyKernel(busy_ms_, 0, busy_stream_),
                "the compute kernel beside the copies");
    }
    CheckCuda(cudaEventRecord(events_[0], stream_.get()), "cudaEventRecord");
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<Operation> op =
        load ? e.client->Load(e.pool, e.import_id, pages, slots, options)
             : e.client->Backup(e.pool, e.import_id, pages, slots, options);
    Timing t;
    t.call_us = bench::NanosBetween(t0, Clock::now()) / 1e3;
    t.status = op.status();
    if (!op.ok()) return t;
    const uint32_t end = op->layer_begin + op->num_layers;
    std::vector<uint32_t> waits;
    for (uint32_t l = every_layer ? op->layer_begin : end - 1; l < end; ++l) {
      waits.push_back(l);
    }
    for (size_t i = 0; i < waits.size(); ++i) {
      Check(e.signals->WaitLayer(*op, waits[i], stream_.get()), "WaitLayer");
      CheckCuda(cudaEventRecord(events_[i + 1], stream_.get()),
                "cudaEventRecord");
    }
    Check(gpu_testing::AwaitStream(stream_.get(), absl::Seconds(60)),
          "the engine stream waiting for the daemon's signals");
    // The daemon signals every layer even when a copy failed; the
    // operation's record says whether it did.
    t.status = e.client->Wait(*op, absl::Seconds(60));
    for (size_t i = 0; i < waits.size(); ++i) {
      float ms = 0;
      CheckCuda(cudaEventElapsedTime(&ms, events_[0], events_[i + 1]),
                "cudaEventElapsedTime");
      t.layer_ms.push_back(ms);
    }
    return t;
  }

 private:
  CudaStream stream_;
  std::vector<cudaEvent_t> events_;
  cudaStream_t busy_stream_ = nullptr;
  double busy_ms_ = 0;
};

// Repeats `run` after one warm-up: `reps` times, or fewer (at least 2) once
// `seconds` have passed; stops at the first failure, which *error gets.
template <typename Fn>
std::vector<Timing> Repeat(int reps, double seconds, std::string* error,
                           Fn&& run) {
  std::vector<Timing> timings;
  Timing warm_up = run();
  if (!warm_up.status.ok()) {
    *error = warm_up.status.ToString();
    return timings;
  }
  const Clock::time_point start = Clock::now();
  while (static_cast<int>(timings.size()) < reps &&
         (timings.size() < 2 || SecondsSince(start) < seconds)) {
    Timing t = run();
    if (!t.status.ok()) {
      *error = t.status.ToString();
      break;
    }
    timings.push_back(std::move(t));
  }
  return timings;
}

CaseResult MeasureCase(Engine& e, OpTimer& timer, const Model& m,
                       v1::Layout layout, v1::CopyMechanism mechanism, int reps,
                       double seconds) {
  CaseResult r;
  r.model = m.label;
  r.layout = v1::Layout_Name(layout).substr(7);
  r.mechanism = v1::CopyMechanism_Name(mechanism).substr(10);
  r.bytes = m.op_bytes(CountTokens(e.pages, kPageSize));
  std::fprintf(stderr, "  %s %s %s\n", r.model.c_str(), r.layout.c_str(),
               r.mechanism.c_str());
  const std::vector<Timing> loads = Repeat(reps, seconds, &r.error, [&] {
    return timer.Run(e, true, mechanism, true);
  });
  std::vector<Timing> backups;
  if (r.error.empty()) {
    backups = Repeat(reps, seconds, &r.error,
                     [&] { return timer.Run(e, false, mechanism, false); });
  }
  if (!r.error.empty()) {
    std::fprintf(stderr, "    failed: %s\n", r.error.c_str());
  }
  Samples total, first, load_call, backup_total, backup_call;
  for (const Timing& t : loads) {
    total.Add(t.layer_ms.back());
    first.Add(t.layer_ms.front());
    load_call.Add(t.call_us);
  }
  for (uint32_t l = 0; l < m.layers && !loads.empty(); ++l) {
    Samples layer;
    for (const Timing& t : loads) layer.Add(t.layer_ms[l]);
    r.layer_ms.push_back(layer.Median());
  }
  for (const Timing& t : backups) {
    backup_total.Add(t.layer_ms.back());
    backup_call.Add(t.call_us);
  }
  r.load_reps = static_cast<int>(loads.size());
  r.backup_reps = static_cast<int>(backups.size());
  r.load_gbps = Gbps(r.bytes, total.Median());
  r.first_layer_ms = first.Median();
  r.backup_gbps = Gbps(r.bytes, backup_total.Median());
  r.load_call_us = load_call.Median();
  r.backup_call_us = backup_call.Median();
  return r;
}

// The cost of the call: a one-layer Load of the whole scattered transfer
// (its RPC only; each is waited for before the next) beside GetPool, the
// bare round trip of the same daemon, interleaved so both see the same
// noise. The call's time counts even if the copy behind it failed.
CallCost MeasureCallCost(Engine& e, OpTimer& timer, v1::CopyMechanism mechanism,
                         int rounds) {
  CallCost c;
  c.runs = e.slots.size();
  auto load = [&] {
    const Timing t = timer.Run(e, true, mechanism, false, 1);
    if (t.layer_ms.empty()) Check(t.status, "Load");  // the call itself failed
    return t.call_us;
  };
  auto get_pool = [&] {
    const Clock::time_point t0 = Clock::now();
    Check(e.client->GetPool(e.pool).status(), "GetPool");
    return bench::NanosBetween(t0, Clock::now()) / 1e3;
  };
  for (int i = 0; i < 5; ++i) {
    load();
    get_pool();
  }
  for (int round = 0; round < rounds; ++round) {
    for (int i = 0; i < 10; ++i) c.load_us.Add(load());
    for (int i = 0; i < 10; ++i) c.get_pool_us.Add(get_pool());
  }
  return c;
}

// Loads of 1, 4 and 16 pages (every layer waited for on the engine's
// stream): the call to the first layer usable on the GPU, `reps` times each.
std::vector<SmallLoad> MeasureSmallLoads(Engine& e, OpTimer& timer,
                                         v1::CopyMechanism mechanism, int reps) {
  std::vector<SmallLoad> out;
  std::vector<uint64_t> pages;
  for (const PageRange& r : e.pages) {
    for (uint64_t p = 0; p < r.num_pages; ++p) pages.push_back(r.first_page + p);
  }
  for (uint32_t n : {1u, 4u, 16u}) {
    if (n > pages.size() || n > e.slots.size()) break;
    std::vector<PageRange> host;
    for (uint32_t i = 0; i < n; ++i) host.push_back({pages[i], 1});
    const std::vector<SlotRange> slots(e.slots.begin(), e.slots.begin() + n);
    SmallLoad s;
    s.pages = n;
    for (int i = 0; i < reps + 3; ++i) {
      const Timing t = timer.Run(e, host, slots, true, mechanism, true);
      Check(t.status, absl::StrCat("a load of ", n, " pages"));
      if (i < 3) continue;  // warm-up
      s.first_layer_us.Add(t.layer_ms.front() * 1e3);
      s.call_us.Add(t.call_us);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// ---------------------------------------------------------------------------

// Deletes `pool` after its engine closed. Close returns once the import is
// closed, so this normally succeeds at once; the retry only covers a close
// still in progress.
void DeletePool(const std::string& target, const std::string& pool) {
  std::unique_ptr<Client> admin =
      Check(Client::Connect(target, "gpu-bench-admin"), "connect");
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    const absl::Status deleted = admin->DeletePool(pool);
    if (!absl::IsFailedPrecondition(deleted) || absl::Now() > deadline) {
      Check(deleted, "deleting " + pool);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

uint64_t ShmFreeBytes() {
  struct statvfs s {};
  if (statvfs("/dev/shm", &s) != 0) return 0;
  return static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
}

std::string Today() {
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S %Z",
                std::localtime(&now));
  return date;
}

// Cases measured against a hostkvd started with `flag` (a setting that is
// a daemon flag, so each value needs a daemon of its own), labelled with it.
// With `busy_ms` > 0, each transfer runs beside a kernel that keeps every
// SM busy that long, on another stream of the engine ("under load").
void MeasureWithDaemonFlag(Report& report, const std::string& flag,
                           const Model& m, v1::Layout layout,
                           v1::CopyMechanism mechanism, uint64_t tokens,
                           int reps, double seconds, double busy_ms) {
  std::vector<std::string> args = {
      "--log_level=warning",
      absl::StrCat("--memory_budget=", (m.pool_bytes(tokens) >> 20) + 1024,
                   "MiB"),
      flag};
  std::unique_ptr<testing::DaemonProcess> daemon =
      Check(gpu_testing::StartCudaDaemon(args, absl::Seconds(45)),
            "starting hostkvd " + flag);
  OpTimer timer(m.layers);
  CudaStream compute = Check(CudaStream::Create(), "compute stream");
  if (busy_ms > 0) timer.SetBusy(compute.get(), busy_ms);
  std::unique_ptr<Engine> e = StartEngine(daemon->target(), m, layout, tokens);
  CaseResult r = MeasureCase(*e, timer, m, layout, mechanism, reps, seconds);
  CheckCuda(cudaStreamSynchronize(compute.get()), "the compute stream");
  r.mechanism = absl::StrCat(r.mechanism, " ", flag,
                             busy_ms > 0 ? " under load" : "");
  report.cases.push_back(std::move(r));
  Check(e->client->Close(), "closing the session");
  DeletePool(daemon->target(), e->pool);
  e.reset();
}

// The settings the first GPU run is to decide: the copy kernel's block
// count, and whether DMA batches prefer compute-overlapping copy engines.
// Only with a hostkvd of our own (--target names one whose flags are set).
// Each setting is skipped (and noted) once --max_seconds since `start` has
// passed; the report is written after each.
void SweepDaemonSettings(Report& report, uint64_t tokens, int reps,
                         double seconds, Clock::time_point start,
                         double max_seconds, double busy_ms) {
  std::vector<std::pair<std::string, v1::CopyMechanism>> settings;
  for (absl::string_view blocks : absl::StrSplit(
           absl::GetFlag(FLAGS_kernel_blocks), ',', absl::SkipEmpty())) {
    settings.push_back({absl::StrCat("--kernel_blocks=", blocks),
                        v1::MECHANISM_KERNEL});
  }
  if (absl::GetFlag(FLAGS_overlap_sweep)) {
    for (const char* flag :
         {"--dma_prefer_overlap=true", "--dma_prefer_overlap=false"}) {
      settings.push_back({flag, v1::MECHANISM_DIRECT});
    }
  }
  // Each setting on an idle GPU, then beside the engine's compute (the
  // question the sweeps exist for: what copies cost a running model).
  for (const double busy : {0.0, busy_ms}) {
    for (const auto& [flag, mechanism] : settings) {
      const char* load = busy > 0 ? " under load" : "";
      if (SecondsSince(start) > max_seconds) {
        report.notes.push_back(absl::StrCat("skipped the sweep's ", flag, load,
                                            ": --max_seconds reached"));
        continue;
      }
      std::fprintf(stderr, "sweep %s%s\n", flag.c_str(), load);
      MeasureWithDaemonFlag(report, flag, kMha, v1::LAYOUT_PAGE_FIRST,
                            mechanism, tokens, reps, seconds, busy);
      g_output->Write(report);
    }
  }
}

int Main() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "hostkv_gpu_bench: --out=DIR is required\n");
    return 2;
  }
  std::string why;
  if (!gpu_testing::CudaDevicePresent(&why)) {
    std::fprintf(stderr,
                 "hostkv_gpu_bench: no CUDA device (%s); this benchmark needs "
                 "a GPU\n",
                 why.c_str());
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  ReportOutput output(out);
  output.WatchSignals();  // before CUDA or the daemon start threads
  CheckCuda(cudaSetDevice(0), "cudaSetDevice");
  CheckCuda(cudaFree(nullptr), "initializing CUDA");
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int reps = quick ? 3 : std::max(1, absl::GetFlag(FLAGS_reps));
  const uint64_t requested = std::max<uint64_t>(
      kPageSize,
      (quick ? 4096 : absl::GetFlag(FLAGS_tokens)) / kPageSize * kPageSize);
  uint64_t tokens = requested;

  Report report;
  g_report = &report;
  g_output = &output;
  // One pool at a time lives in /dev/shm: lower the size until it fits.
  const uint64_t shm_free = ShmFreeBytes();
  while (tokens > 1024 && kMha.pool_bytes(tokens) > shm_free / 10 * 8)
    tokens /= 2;
  if (tokens != requested) {
    report.notes.push_back(absl::StrCat("tokens per transfer lowered to ",
                                        tokens, " to fit /dev/shm (",
                                        shm_free >> 20, " MiB free)"));
  }
  std::vector<const Model*> models = {&kMha};
  if (absl::GetFlag(FLAGS_mla)) models.push_back(&kMla);
  uint64_t largest_pool = 0;
  for (const Model* m : models)
    largest_pool = std::max(largest_pool, m->pool_bytes(tokens));

  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) {
    std::vector<std::string> args = {
        "--log_level=info",
        absl::StrCat("--memory_budget=", (largest_pool >> 20) + 1024, "MiB")};
    for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_daemon_flags),
                                              ',', absl::SkipEmpty())) {
      args.emplace_back(f);
    }
    g_daemon = Check(gpu_testing::StartCudaDaemon(args, absl::Seconds(45)),
                     "starting hostkvd");
    target = g_daemon->target();
    report.meta.push_back({"hostkvd", absl::StrCat(testing::DaemonProcess::Binary(), " ",
                                                   absl::StrJoin(args, " "))});
  } else {
    report.meta.push_back({"hostkvd", target});
  }
  cudaDeviceProp prop{};
  CheckCuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  report.meta.insert(
      report.meta.begin(),
      {{"date", Today()},
       {"gpu",
        absl::StrCat(prop.name, ", ", prop.totalGlobalMem >> 30,
                     " GiB, CUDA driver ", driver, ", runtime ", runtime)},
       {"transfer", absl::StrCat(tokens, " tokens, page size ", kPageSize,
                                 "; host pages "
                                 "contiguous, device pages in a "
                                 "shuffled order")}});

  const Clock::time_point start = Clock::now();
  std::fprintf(stderr, "baselines\n");
  for (const Model* m : models) {
    report.baselines.push_back(MeasureBaseline(*m, tokens, reps));
  }
  output.Write(report);
  const double case_seconds = absl::GetFlag(FLAGS_case_seconds);
  const double max_seconds = absl::GetFlag(FLAGS_max_seconds);
  bool call_measured = false;
  for (const Model* m : models) {
    OpTimer timer(m->layers);
    std::vector<v1::Layout> layouts = {v1::LAYOUT_PAGE_FIRST,
                                       v1::LAYOUT_PAGE_FIRST_DIRECT,
                                       v1::LAYOUT_LAYER_FIRST};
    if (!m->mla) layouts.push_back(v1::LAYOUT_PAGE_HEAD);
    for (v1::Layout layout : layouts) {
      if (SecondsSince(start) > max_seconds) {
        report.notes.push_back(absl::StrCat("skipped ", m->label, " ",
                                            v1::Layout_Name(layout),
                                            ": --max_seconds reached"));
        continue;
      }
      std::unique_ptr<Engine> e = StartEngine(target, *m, layout, tokens);
      report.meta.push_back(
          {absl::StrCat("pin ", e->pool),
           absl::StrCat(Num(e->pin_seconds), " s for ",
                        m->pool_bytes(tokens) >> 20, " MiB")});
      for (v1::CopyMechanism mechanism :
           {v1::MECHANISM_KERNEL, v1::MECHANISM_DIRECT}) {
        // Head-by-head pieces: the copy engine path is not meant for them.
        if (layout == v1::LAYOUT_PAGE_HEAD && mechanism == v1::MECHANISM_DIRECT)
          continue;
        report.cases.push_back(
            MeasureCase(*e, timer, *m, layout, mechanism, reps, case_seconds));
        output.Write(report);
      }
      // Measured where the copies behind the calls are quick (whole pages).
      if (!call_measured && layout == v1::LAYOUT_PAGE_FIRST_DIRECT) {
        std::fprintf(stderr, "  cost of the call\n");
        report.call =
            MeasureCallCost(*e, timer, v1::MECHANISM_DIRECT, quick ? 3 : 10);
        call_measured = true;
        output.Write(report);
        std::fprintf(stderr, "  small loads\n");
        report.small_loads =
            MeasureSmallLoads(*e, timer, v1::MECHANISM_DIRECT, quick ? 10 : 50);
        output.Write(report);
      }
      // The daemon must let go of the KV cache before it is freed.
      Check(e->client->Close(), "closing the session");
      DeletePool(target, e->pool);
      e.reset();
    }
  }
  if (absl::GetFlag(FLAGS_target).empty()) {
    if (SecondsSince(start) > max_seconds) {
      report.notes.push_back("skipped the kernel-block and overlap sweeps: "
                             "--max_seconds reached");
    } else {
      // The compute kernel spans a whole transfer: twice the contiguous
      // memcpy of the same bytes, plus 5 ms.
      const Baseline& mha = report.BaselineFor(kMha.label);
      const double busy_ms =
          mha.h2d_gbps > 0 ? 2e3 * mha.bytes / (mha.h2d_gbps * 1e9) + 5 : 50;
      SweepDaemonSettings(report, tokens, reps, case_seconds, start,
                          max_seconds, busy_ms);
    }
  }
  report.meta.push_back(
      {"duration", absl::StrCat(Num(SecondsSince(start)), " s")});

  if (!output.Write(report)) Fail("cannot write the report into " + out);
  const std::string md = output.markdown();
  if (g_daemon != nullptr) {
    std::ofstream(out + "/gpu_bench.hostkvd.log") << g_daemon->log();
  }
  std::fwrite(md.data(), 1, md.size(), stdout);
  std::fprintf(stderr, "\nwrote %s/gpu_bench.json and %s/gpu_bench.md\n",
               out.c_str(), out.c_str());
  g_daemon.reset();
  return 0;
}

}  // namespace
}  // namespace hostkv::gpu_bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hostkv::gpu_bench::Main();
}
