// Section 3: the CPU data path. In-process: CpuCopyEngine over every layout
// x page size x mechanism, beside std::memcpy of the same bytes as one
// contiguous block on the same WorkerPool. Through the daemon: the time from
// the Load call until the client sees the first and the last layer done
// (Client::WaitLayer), beside the same copy in-process.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/copy_plan.h"
#include "kernels/cpu_copy_engine.h"
#include "kernels/pool_geometry.h"
#include "kernels/worker_pool.h"
#include "tests/bench/daemon_util.h"
#include "tests/bench/sections.h"

namespace hostkv::bench {
namespace {

constexpr uint32_t kLayers = 32;
constexpr uint64_t kTokens = 2048;        // moved per transfer
constexpr uint64_t kHostTokens = 8192;    // pool capacity (plus one page)
constexpr uint64_t kDeviceSlots = 4096;   // device buffer rows

const Target kCopyTarget =
    Target::AtLeast(0.8, ">= 0.8x memcpy (page_size >= 16)");

// Anonymous memory, faulted in.
class Buffer {
 public:
  explicit Buffer(uint64_t bytes, bool huge = false) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Die(absl::StrCat("mmap of ", bytes, " bytes failed"));
    if (huge && madvise(p, bytes, MADV_HUGEPAGE) != 0) Die("MADV_HUGEPAGE");
    data_ = static_cast<uint8_t*>(p);
    Touch(data_, bytes_, 7);
  }
  ~Buffer() { munmap(data_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_;
  uint64_t bytes_;
};

struct Config {
  bool mla;
  HostLayout layout;
  uint32_t page_size;
  CopyMechanism mechanism;
};

std::string ConfigName(const Config& c) {
  return absl::StrCat(c.mla ? "MLA " : "MHA ", HostLayoutName(c.layout), " ps",
                      c.page_size, " ",
                      c.mechanism == CopyMechanism::kDirect ? "direct" : "kernel");
}

PoolGeometry Geometry(const Config& c, uint64_t token_slots) {
  PoolGeometry g;
  g.attention = c.mla ? Attention::kMla : Attention::kMha;
  g.layout = c.layout;
  g.num_layers = kLayers;
  g.num_heads = c.mla ? 1 : 8;
  g.head_bytes = c.mla ? (512 + 64) * 2 : 128 * 2;  // bf16
  g.page_size = c.page_size;
  g.token_slots = token_slots;
  return g;
}

uint64_t HostSlots(uint32_t page_size) {
  return (kHostTokens / page_size + 1) * page_size;  // as SGLang sizes it
}

// `count` distinct pages out of `total`, in random order.
std::vector<uint64_t> RandomPages(uint64_t total, uint64_t count,
                                  std::mt19937_64& rng) {
  std::vector<uint64_t> all(total);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  return all;
}

// The transfer: kTokens tokens in page-aligned runs of one page, scattered
// over the host pool and the device buffers.
struct Scatter {
  std::vector<uint64_t> host_pages;
  std::vector<uint64_t> device_pages;
};

Scatter MakeScatter(uint32_t page_size, std::mt19937_64& rng) {
  Scatter s;
  const uint64_t pages = kTokens / page_size;
  s.host_pages = RandomPages(HostSlots(page_size) / page_size, pages, rng);
  s.device_pages = RandomPages(kDeviceSlots / page_size, pages, rng);
  return s;
}

std::vector<TokenRun> Runs(const Scatter& s, uint32_t page_size) {
  std::vector<SlotSpan> host, device;
  for (uint64_t p : s.host_pages) host.push_back({p * page_size, page_size});
  for (uint64_t p : s.device_pages) device.push_back({p * page_size, page_size});
  return ZipRuns(host, device);
}

// Per-layer device buffers inside one allocation, [layer][plane].
std::vector<LayerBuffers> DeviceLayers(uint8_t* base, const PoolGeometry& g) {
  std::vector<LayerBuffers> layers(g.num_layers);
  const uint64_t bytes = kDeviceSlots * g.token_stride();
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      layers[l].plane[kv] =
          kv < g.kv_planes() ? base + (uint64_t{l} * g.kv_planes() + kv) * bytes
                             : nullptr;
    }
  }
  return layers;
}

// std::memcpy of `bytes` from `src` to `dst`, one slice per thread.
void ParallelMemcpy(WorkerPool& workers, uint8_t* dst, const uint8_t* src,
                    uint64_t bytes) {
  const size_t shards = workers.num_threads();
  workers.ParallelFor(shards, [&](size_t shard) {
    const uint64_t begin = bytes * shard / shards / 64 * 64;
    const uint64_t end =
        shard + 1 == shards ? bytes : bytes * (shard + 1) / shards / 64 * 64;
    std::memcpy(dst + begin, src + begin, end - begin);
  });
}

struct CopyFigures {
  Samples load_layer, backup_all, base_layer, base_all;  // GB/s per repetition
};

// One configuration's transfer, built once; Measure() adds one repetition.
class ConfigBench {
 public:
  ConfigBench(const Config& c, uint8_t* host, uint8_t* device,
              std::mt19937_64& rng)
      : host_(host), device_(device) {
    const PoolGeometry g = Geometry(c, HostSlots(c.page_size));
    layers_ = DeviceLayers(device, g);
    load_.geometry = g;
    load_.host_base = host;
    load_.layers = layers_.data();
    load_.runs = Runs(MakeScatter(c.page_size, rng), c.page_size);
    load_.IndexRuns();
    load_.direction = CopyDirection::kHostToDevice;
    load_.mechanism = c.mechanism;
    backup_ = load_;
    backup_.direction = CopyDirection::kDeviceToHost;
    layer_bytes_ = kTokens * g.kv_planes() * g.token_stride();
  }

  void Measure(WorkerPool& workers, CopyFigures* out) const {
    const CpuCopyEngine engine(&workers);
    const uint64_t all_bytes = layer_bytes_ * kLayers;
    double load_ns = 0;
    for (uint32_t l = 0; l < kLayers; ++l) {
      const Clock::time_point t0 = Clock::now();
      engine.CopyLayer(load_, l);
      load_ns += NanosBetween(t0, Clock::now());
    }
    out->load_layer.Add(static_cast<double>(all_bytes) / load_ns);
    double base_ns = 0;
    for (uint32_t l = 0; l < kLayers; ++l) {
      const Clock::time_point t0 = Clock::now();
      ParallelMemcpy(workers, device_ + l * layer_bytes_,
                     host_ + l * layer_bytes_, layer_bytes_);
      base_ns += NanosBetween(t0, Clock::now());
    }
    out->base_layer.Add(static_cast<double>(all_bytes) / base_ns);
    // All layers in one pass, as the daemon's TransferEngine runs them.
    Clock::time_point t0 = Clock::now();
    engine.CopyLayers(backup_, 0, kLayers, [] { return true; }, [](uint32_t) {})
        .IgnoreError();  // host memory: cannot fault
    out->backup_all.Add(static_cast<double>(all_bytes) /
                        NanosBetween(t0, Clock::now()));
    t0 = Clock::now();
    ParallelMemcpy(workers, host_, device_, all_bytes);
    out->base_all.Add(static_cast<double>(all_bytes) /
                      NanosBetween(t0, Clock::now()));
  }

 private:
  uint8_t* host_;
  uint8_t* device_;
  std::vector<LayerBuffers> layers_;
  CopyTask load_, backup_;
  uint64_t layer_bytes_ = 0;
};

// Minor page faults of process `pid` so far (field 10 of /proc/PID/stat).
uint64_t MinorFaults(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 10 && rest >> field; ++i) {
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

unsigned Threads(const Options& options) {
  return options.copy_threads > 0
             ? options.copy_threads
             : std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

void RunCopy(const Options& options, Report& report) {
  const unsigned threads = Threads(options);
  std::fprintf(stderr, "copy engine in-process, %u threads\n", threads);
  WorkerPool workers(threads);
  std::mt19937_64 rng(7);
  // The largest pool (MHA, page size 64) and device buffers, shared by all.
  Buffer host(Geometry({false, HostLayout::kLayerFirst, 64, CopyMechanism::kDirect},
                       HostSlots(64)).total_bytes(),
              options.copy_hugepages);
  Buffer device(uint64_t{kLayers} * 2 * kDeviceSlots * 8 * 128 * 2,
                options.copy_hugepages);
  const int reps = options.quick ? 1 : 5;
  const HostLayout mha_layouts[] = {HostLayout::kLayerFirst, HostLayout::kPageFirst,
                                    HostLayout::kPageFirstDirect,
                                    HostLayout::kPageHead};
  const HostLayout mla_layouts[] = {HostLayout::kLayerFirst, HostLayout::kPageFirst,
                                    HostLayout::kPageFirstDirect};
  std::vector<Config> configs;
  for (bool mla : {false, true}) {
    for (HostLayout layout : mla ? std::vector<HostLayout>(std::begin(mla_layouts),
                                                           std::end(mla_layouts))
                                 : std::vector<HostLayout>(std::begin(mha_layouts),
                                                           std::end(mha_layouts))) {
      for (uint32_t ps : {1u, 16u, 64u}) {
        for (CopyMechanism m : {CopyMechanism::kKernel, CopyMechanism::kDirect}) {
          configs.push_back({mla, layout, ps, m});
        }
      }
    }
  }
  // Repetitions are the outer loop, so that a burst of outside load hits one
  // repetition of many configurations rather than every repetition of one.
  std::vector<ConfigBench> benches;
  for (const Config& c : configs) {
    benches.emplace_back(c, host.data(), device.data(), rng);
  }
  std::vector<CopyFigures> figures(configs.size());
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < configs.size(); ++i) {
      benches[i].Measure(workers, &figures[i]);
    }
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    const CopyFigures& f = figures[i];
    const Target target = c.page_size >= 16 ? kCopyTarget : Target::None();
    for (bool load : {true, false}) {
      Row row;
      row.section = "copy";
      row.name = load ? "Load, per layer (host->device)"
                      : "Backup, all layers (device->host)";
      row.config = ConfigName(c);
      row.metric = "GB/s";
      row.unit = "GB/s";
      row.value = (load ? f.load_layer : f.backup_all).Median();
      row.baseline = absl::StrCat("memcpy of one contiguous block, ", threads,
                                  " threads");
      row.baseline_value = (load ? f.base_layer : f.base_all).Median();
      row.target = target;
      row.note = absl::StrCat(kTokens, " tokens, ",
                              load ? "one layer per call" : "32 layers",
                              "; median of ", reps);
      report.Add(row);
    }
  }
}

void RunDaemonCopy(const Options& options, Report& report) {
  std::fprintf(stderr, "copy through the daemon\n");
  DaemonHandle daemon = StartDaemon(false);
  absl::StatusOr<std::unique_ptr<Client>> c =
      Client::Connect(daemon->target(), "bench-copy");
  CheckOk(c, "connect");
  Client& client = **c;
  // The daemon copies with one thread per core; so does the baseline.
  WorkerPool workers(std::max(1u, std::thread::hardware_concurrency()));
  HealthCaller health(daemon->target());
  std::mt19937_64 rng(11);
  const int reps = options.quick ? 2 : 7;
  struct DaemonConfig {
    Config config;
    v1::Layout layout;
    v1::CopyMechanism mechanism;
  };
  const DaemonConfig configs[] = {
      {{false, HostLayout::kLayerFirst, 16, CopyMechanism::kDirect},
       v1::LAYOUT_LAYER_FIRST, v1::MECHANISM_DIRECT},
      {{false, HostLayout::kPageFirst, 64, CopyMechanism::kKernel},
       v1::LAYOUT_PAGE_FIRST, v1::MECHANISM_KERNEL},
      {{false, HostLayout::kPageFirstDirect, 64, CopyMechanism::kDirect},
       v1::LAYOUT_PAGE_FIRST_DIRECT, v1::MECHANISM_DIRECT},
      {{true, HostLayout::kPageFirstDirect, 64, CopyMechanism::kDirect},
       v1::LAYOUT_PAGE_FIRST_DIRECT, v1::MECHANISM_DIRECT},
  };
  int index = 0;
  for (const DaemonConfig& dc : configs) {
    const Config& cfg = dc.config;
    const std::string name = absl::StrCat("copy-", index++);
    const v1::PoolSpec spec =
        cfg.mla ? MlaSpec(name, kLayers, 512, 64, v1::DTYPE_BF16, cfg.page_size,
                          dc.layout, kHostTokens)
                : MhaSpec(name, kLayers, 8, 128, v1::DTYPE_BF16, cfg.page_size,
                          dc.layout, kHostTokens);
    absl::StatusOr<v1::Pool> pool = client.CreatePool(spec);
    CheckOk(pool, "create " + name);
    const PoolGeometry g = Geometry(cfg, pool->token_slots());
    if (g.total_bytes() != pool->total_bytes()) Die("geometry mismatch");
    DeviceBuffers dev = MakeDeviceBuffers(*pool, kDeviceSlots);
    absl::StatusOr<uint64_t> import =
        client.RegisterDeviceBuffers(name, dev.token_slots, dev.k, dev.v);
    CheckOk(import, "register");
    // Own every page, then give back all but the scattered ones.
    const uint64_t pages = pool->num_pages();
    CheckOk(client.Alloc(name, pages * cfg.page_size), "alloc all");
    const Scatter scatter = MakeScatter(cfg.page_size, rng);
    std::vector<bool> keep(pages, false);
    for (uint64_t p : scatter.host_pages) keep[p] = true;
    std::vector<PageRange> give_back;
    for (uint64_t p = 0; p < pages;) {
      if (keep[p]) {
        ++p;
        continue;
      }
      const uint64_t first = p;
      while (p < pages && !keep[p]) ++p;
      give_back.push_back({first, p - first});
    }
    CheckOk(client.Free(name, give_back), "free the rest");
    std::vector<PageRange> host_pages;
    std::vector<SlotRange> device_slots;
    for (uint64_t p : scatter.host_pages) host_pages.push_back({p, 1});
    for (uint64_t p : scatter.device_pages) {
      device_slots.push_back({p * cfg.page_size, cfg.page_size});
    }
    TransferOptions topt;
    topt.mechanism = dc.mechanism;

    // The same copy in-process.
    Buffer host(g.total_bytes());
    Buffer device(uint64_t{kLayers} * g.kv_planes() * kDeviceSlots * g.token_stride());
    const std::vector<LayerBuffers> layers = DeviceLayers(device.data(), g);
    CopyTask load;
    load.geometry = g;
    load.host_base = host.data();
    load.layers = layers.data();
    load.runs = Runs(scatter, cfg.page_size);
    load.IndexRuns();
    load.direction = CopyDirection::kHostToDevice;
    load.mechanism = cfg.mechanism;
    CopyTask backup = load;
    backup.direction = CopyDirection::kDeviceToHost;
    const CpuCopyEngine engine(&workers);

    Samples rpc, first, last, back, base_first, base_last, base_back, idle_rpc;
    Samples faults;  // the daemon's minor page faults per load + backup
    for (int rep = -1; rep < reps; ++rep) {  // rep -1 warms up
      const uint64_t faults0 = MinorFaults(daemon->pid());
      Clock::time_point t0 = Clock::now();
      absl::StatusOr<Operation> op =
          client.Load(name, *import, host_pages, device_slots, topt);
      const double rpc_ns = NanosBetween(t0, Clock::now());
      CheckOk(op, "load");
      CheckOk(client.WaitLayer(*op, 0), "wait layer 0");
      const double first_ns = NanosBetween(t0, Clock::now());
      CheckOk(client.WaitLayer(*op, kLayers - 1), "wait last layer");
      const double last_ns = NanosBetween(t0, Clock::now());
      t0 = Clock::now();
      op = client.Backup(name, *import, host_pages, device_slots, topt);
      CheckOk(op, "backup");
      CheckOk(client.Wait(*op), "wait backup");
      const double back_ns = NanosBetween(t0, Clock::now());
      const uint64_t op_faults = MinorFaults(daemon->pid()) - faults0;

      t0 = Clock::now();
      engine.CopyLayer(load, 0);
      const double base_first_ns = NanosBetween(t0, Clock::now());
      for (uint32_t l = 1; l < kLayers; ++l) engine.CopyLayer(load, l);
      const double base_last_ns = NanosBetween(t0, Clock::now());
      t0 = Clock::now();
      engine.CopyLayers(backup, 0, kLayers, [] { return true; }, [](uint32_t) {})
          .IgnoreError();  // host memory: cannot fault
      const double base_back_ns = NanosBetween(t0, Clock::now());
      // The same daemon's round trip while no copy runs.
      for (int i = 0; i < 10; ++i) {
        const Clock::time_point h0 = Clock::now();
        health.Check();
        if (rep >= 0) idle_rpc.Add(NanosBetween(h0, Clock::now()));
      }
      if (rep < 0) continue;
      faults.Add(static_cast<double>(op_faults));
      rpc.Add(rpc_ns);
      first.Add(first_ns);
      last.Add(last_ns);
      back.Add(back_ns);
      base_first.Add(base_first_ns);
      base_last.Add(base_last_ns);
      base_back.Add(base_back_ns);
    }
    struct Out {
      const char* name;
      const Samples* value;
      const Samples* base;
      const char* baseline;
    };
    const Out outs[] = {
        {"Load call returned, its copy already running", &rpc, &idle_rpc,
         "health check, no copy running"},
        {"Load -> first layer seen (WaitLayer(0))", &first, &base_first,
         "in-process CopyLayer(0)"},
        {"Load -> last layer seen (WaitLayer(31))", &last, &base_last,
         "in-process CopyLayer x32"},
        {"Backup -> all layers seen (Wait)", &back, &base_back,
         "in-process CopyLayer x32"},
    };
    const uint64_t bytes = kTokens * g.bytes_per_token();
    for (const Out& o : outs) {
      Row row;
      row.section = "daemon_copy";
      row.name = o.name;
      row.config = ConfigName(cfg);
      row.metric = "median latency";
      row.unit = "ms";
      row.value = o.value->Median() / 1e6;
      row.baseline = o.value == &rpc ? std::string(o.baseline)
                                     : absl::StrCat(o.baseline, ", same threads");
      row.baseline_value = o.base->Median() / 1e6;
      row.note = absl::StrCat(bytes >> 20, " MiB in all, n=", o.value->size(),
                              "; daemon page faults per load+backup: ",
                              Num(faults.Median()));
      report.Add(row);
    }
    CheckOk(client.Free(name, host_pages), "free");
    CheckOk(client.UnregisterDeviceBuffers(*import), "unregister");
    CheckOk(client.DeletePool(name), "delete pool");
  }
}

}  // namespace hostkv::bench
