// Section 4: creating a pool of several GiB through the daemon: CreatePool
// returns at once and fills the segment in the background (PoolFill:
// MADV_POPULATE_WRITE in chunks on one thread per CPU); timed until its
// first page is served and until it is all resident, beside what the kernel
// offers on the same threads (posix_fallocate + MADV_POPULATE_WRITE), the
// user-space touch the daemon used before, and a restarted daemon's first
// allocation from the adopted pool.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/pool/resident_range.h"
#include "tests/bench/daemon_util.h"
#include "tests/bench/sections.h"

namespace hostkv::bench {
namespace {

uint64_t MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

// malloc + memset of fresh memory with `threads` threads; nanoseconds.
double MallocMemset(uint64_t bytes, unsigned threads) {
  const Clock::time_point t0 = Clock::now();
  uint8_t* p = static_cast<uint8_t*>(std::malloc(bytes));
  if (p == nullptr) Die("malloc failed");
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([p, bytes, t, threads] {
      const uint64_t begin = bytes * t / threads / 4096 * 4096;
      const uint64_t end =
          t + 1 == threads ? bytes : bytes * (t + 1) / threads / 4096 * 4096;
      std::memset(p + begin, 0x5a, end - begin);
    });
  }
  for (std::thread& w : workers) w.join();
  asm volatile("" : : "r"(p) : "memory");  // the stores are not dead
  const double ns = NanosBetween(t0, Clock::now());
  std::free(p);
  return ns;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

unsigned UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
    return static_cast<unsigned>(CPU_COUNT(&set));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

// A memfd of `bytes` with its memory reserved (posix_fallocate), mapped.
struct Segment {
  int fd = -1;
  uint8_t* p = nullptr;
  uint64_t bytes = 0;
  ~Segment() {
    if (p != nullptr) munmap(p, bytes);
    if (fd >= 0) close(fd);
  }
};
void MakeSegment(uint64_t bytes, bool fallocate_first, Segment* s) {
  s->bytes = bytes;
  s->fd = memfd_create("hostkv-bench-start", MFD_CLOEXEC);
  if (s->fd < 0) Die("memfd_create");
  if (fallocate_first) {
    if (posix_fallocate(s->fd, 0, static_cast<off_t>(bytes)) != 0) Die("posix_fallocate");
  } else if (ftruncate(s->fd, static_cast<off_t>(bytes)) != 0) {
    Die("ftruncate");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (p == MAP_FAILED) Die("mmap");
  s->p = static_cast<uint8_t*>(p);
}

// `threads` threads, each one slice of [0, bytes): f(begin, end).
template <typename F>
void OnSlices(uint64_t bytes, unsigned threads, F f) {
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const uint64_t begin = bytes * t / threads / 4096 * 4096;
      const uint64_t end =
          t + 1 == threads ? bytes : bytes * (t + 1) / threads / 4096 * 4096;
      f(begin, end);
    });
  }
  for (std::thread& w : workers) w.join();
}

// The baseline: the threads populate their slices with MADV_POPULATE_WRITE
// after posix_fallocate (or after ftruncate alone). Nanoseconds, or -1 if
// the kernel lacks MADV_POPULATE_WRITE.
double CreateWithPopulate(uint64_t bytes, unsigned threads, bool fallocate_first) {
  const Clock::time_point t0 = Clock::now();
  Segment s;
  MakeSegment(bytes, fallocate_first, &s);
  std::atomic<bool> ok{true};
  OnSlices(bytes, threads, [&](uint64_t begin, uint64_t end) {
    if (madvise(s.p + begin, end - begin, MADV_POPULATE_WRITE) != 0) ok = false;
  });
  const double ns = NanosBetween(t0, Clock::now());
  return ok ? ns : -1;
}

// What the daemon did before: posix_fallocate, then a write fault per OS
// page from user space (TouchResident) on `threads` threads. Nanoseconds.
double CreateWithTouch(uint64_t bytes, unsigned threads) {
  const Clock::time_point t0 = Clock::now();
  Segment s;
  MakeSegment(bytes, true, &s);
  OnSlices(bytes, threads, [&](uint64_t begin, uint64_t end) {
    TouchResident(s.p + begin, end - begin);
  });
  return NanosBetween(t0, Clock::now());
}

// The pool's fill state, asked every 2 ms until it is no longer filling.
v1::PoolStats WaitResident(Client& c, const std::string& pool) {
  for (;;) {
    absl::StatusOr<v1::GetPoolStatsResponse> stats = c.GetPoolStats(pool);
    CheckOk(stats, "pool stats");
    if (stats->pools_size() != 1) Die("pool stats: no pool " + pool);
    if (stats->pools(0).fill_state() != v1::FILL_FILLING) return stats->pools(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// One CreatePool through the daemon: nanoseconds until the call returned,
// until one page was allocated (default wait) and until fully resident.
struct DaemonStart {
  double create = 0, first_alloc = 0, resident = 0;
};
DaemonStart CreateThroughDaemon(Client& c, const v1::PoolSpec& spec) {
  DaemonStart d;
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<v1::Pool> pool = c.CreatePool(spec, false);
  d.create = NanosBetween(t0, Clock::now());
  CheckOk(pool, "create pool");
  absl::StatusOr<std::vector<PageRange>> pages =
      c.Alloc(spec.name(), spec.page_size());
  d.first_alloc = NanosBetween(t0, Clock::now());
  CheckOk(pages, "first alloc");
  const v1::PoolStats stats = WaitResident(c, spec.name());
  d.resident = NanosBetween(t0, Clock::now());
  if (stats.fill_state() != v1::FILL_READY) Die("fill failed: " + stats.fill_error());
  CheckOk(c.Free(spec.name(), *pages), "free");
  return d;
}

}  // namespace

void RunPoolStart(const Options& options, Report& report) {
  const uint64_t gib = 1ull << 30;
  uint64_t want = static_cast<uint64_t>(
      (options.quick ? std::min(options.pool_start_gib, 1.0) : options.pool_start_gib) *
      gib);
  // The pool and the baseline segment never exist together; keep a third
  // of the available memory free.
  const uint64_t limit = MemAvailableBytes() / 3 * 2;
  uint64_t bytes = std::min(want, limit) / (256ull << 20) * (256ull << 20);
  if (bytes == 0) Die("not enough free memory for the pool start benchmark");
  std::fprintf(stderr, "pool start: %.2f GiB (asked %.2f)\n",
               static_cast<double>(bytes) / gib, static_cast<double>(want) / gib);
  DaemonHandle daemon = StartDaemon(false);
  // The daemon fills with one thread per CPU it may use (its default); the
  // baselines get as many.
  const unsigned threads = UsableCpus();
  v1::PoolSpec spec = MhaSpec("start", 32, 8, 128, v1::DTYPE_BF16, 64,
                              v1::LAYOUT_LAYER_FIRST, 1);
  spec.set_capacity_bytes(bytes);
  const int reps = options.quick ? 1 : 3;
  Samples create, first_alloc, resident, falloc_populate, populate, touch, memset;
  uint64_t pool_bytes = 0;
  {
    absl::StatusOr<std::unique_ptr<Client>> c =
        Client::Connect(daemon->target(), "bench-pool-start");
    CheckOk(c, "connect");
    for (int rep = 0; rep < reps; ++rep) {
      const DaemonStart d = CreateThroughDaemon(**c, spec);
      create.Add(d.create);
      first_alloc.Add(d.first_alloc);
      resident.Add(d.resident);
      absl::StatusOr<v1::GetPoolStatsResponse> st = (*c)->GetPoolStats("start");
      CheckOk(st, "pool stats");
      pool_bytes = st->pools(0).capacity_bytes();
      CheckOk((*c)->DeletePool("start"), "delete pool");
      const double falloc_ns = CreateWithPopulate(pool_bytes, threads, true);
      if (falloc_ns >= 0) falloc_populate.Add(falloc_ns);
      const double populate_ns = CreateWithPopulate(pool_bytes, threads, false);
      if (populate_ns >= 0) populate.Add(populate_ns);
      if (rep == 0) {  // slow: once
        touch.Add(CreateWithTouch(pool_bytes, threads));
        memset.Add(MallocMemset(pool_bytes, threads));
      }
    }
  }
  // A restart: the daemon is killed with the pool resident and a page
  // allocated; the next one adopts the pool (nothing to fill). Timed from
  // the new daemon's start to its first allocation served, beside the same
  // daemon's start without state to its first answered call.
  Samples adopted_first, cold_first;
  {
    absl::StatusOr<std::unique_ptr<Client>> c =
        Client::Connect(daemon->target(), "bench-pool-restart");
    CheckOk(c, "connect");
    CheckOk((*c)->CreatePool(spec, false), "create pool");
    WaitResident(**c, "start");
  }
  for (int rep = 0; rep < reps; ++rep) {
    daemon->Stop(SIGKILL);
    const Clock::time_point t0 = Clock::now();
    if (!daemon->Restart()) Die("hostkvd did not restart:\n" + daemon->log());
    absl::StatusOr<std::unique_ptr<Client>> c =
        Client::Connect(daemon->target(), "bench-pool-restart");
    CheckOk(c, "connect after restart");
    absl::StatusOr<std::vector<PageRange>> pages =
        (*c)->Alloc("start", spec.page_size());
    adopted_first.Add(NanosBetween(t0, Clock::now()));
    CheckOk(pages, "alloc after restart");
    CheckOk((*c)->Free("start", *pages), "free");
  }
  {
    absl::StatusOr<std::unique_ptr<Client>> c =
        Client::Connect(daemon->target(), "bench-pool-restart");
    CheckOk(c, "connect");
    CheckOk((*c)->DeletePool("start"), "delete pool");
  }
  for (int rep = 0; rep < reps; ++rep) {
    daemon->Stop(SIGKILL);
    const Clock::time_point t0 = Clock::now();
    if (!daemon->Restart()) Die("hostkvd did not restart:\n" + daemon->log());
    absl::StatusOr<std::unique_ptr<Client>> c =
        Client::Connect(daemon->target(), "bench-pool-restart");
    CheckOk(c, "connect after restart");
    CheckOk((*c)->ListPools(), "list pools");
    cold_first.Add(NanosBetween(t0, Clock::now()));
  }
  const std::string config =
      absl::StrCat(Num(static_cast<double>(pool_bytes) / gib), " GiB");
  const std::string base =
      absl::StrCat("posix_fallocate + MADV_POPULATE_WRITE, ", threads, " threads");
  struct Line {
    std::string name;
    const Samples* value;
    std::string baseline;
    const Samples* baseline_value;
    std::string note;
  };
  const std::vector<Line> lines = {
      {"CreatePool until all resident (fill threads: one per CPU)", &resident,
       base, &falloc_populate, "target <= 1.1x"},
      {"CreatePool until its first Alloc is served", &first_alloc, base,
       &falloc_populate, "target <= 100 ms"},
      {"  CreatePool call itself (returns before the fill)", &create, base,
       &falloc_populate, ""},
      {absl::StrCat("  before: posix_fallocate + user-space touch, ", threads,
                    " threads (in-process, once)"),
       &touch, base, &falloc_populate, "the daemon's old prefault"},
      {absl::StrCat("  alternative: ftruncate + MADV_POPULATE_WRITE, ", threads,
                    " threads"),
       &populate, base, &falloc_populate, ""},
      {absl::StrCat("  alternative: malloc + memset, ", threads, " threads (once)"),
       &memset, base, &falloc_populate, ""},
      {"restarted hostkvd: start until the adopted pool's first Alloc served",
       &adopted_first, "the same daemon's start without state until its first call answered",
       &cold_first, "target <= 200 ms (SIGKILL, then restart)"},
  };
  for (const Line& line : lines) {
    if (line.value->empty() || line.baseline_value->empty()) continue;
    Row row;
    row.section = "pool_start";
    row.name = line.name;
    row.config = config;
    row.metric = "best time";
    row.unit = "ms";
    row.value = line.value->Min() / 1e6;
    row.baseline = line.baseline;
    row.baseline_value = line.baseline_value->Min() / 1e6;
    row.note = absl::StrCat(line.note, line.note.empty() ? "" : "; ", "best of ",
                            line.value->size());
    report.Add(row);
  }
}

}  // namespace hostkv::bench
