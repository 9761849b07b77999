// Section 4: creating and pre-faulting a pool of several GiB through the
// daemon (CreatePool: posix_fallocate in /dev/shm, mmap, parallel prefault),
// beside malloc + memset of the same bytes (fresh pages), single-threaded
// and with the daemon's thread count.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/contract/shm_segment.h"
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

uint64_t ShmFreeBytes() {
  struct statvfs st;
  if (statvfs("/dev/shm", &st) != 0) return 0;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
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

// What CreatePool does, in-process and step by step: ShmSegment::Create
// (shm_open + posix_fallocate + mmap), then Prefault. Nanoseconds.
void CreateLikeDaemon(uint64_t bytes, unsigned threads, double* create_ns,
                      double* prefault_ns) {
  const std::string name = absl::StrCat("/hostkv-bench.", getpid(), ".start");
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<ShmSegment> segment = ShmSegment::Create(name, bytes, 0600);
  CheckOk(segment, "ShmSegment::Create");
  const Clock::time_point t1 = Clock::now();
  segment->Prefault(threads);
  *create_ns = NanosBetween(t0, t1);
  *prefault_ns = NanosBetween(t1, Clock::now());
}

// Alternatives: the threads populate their slices with MADV_POPULATE_WRITE
// (one call per slice instead of a fault per page), after posix_fallocate,
// or without it (the pages are allocated by the populate, which reports
// ENOMEM / EFAULT instead of a later SIGBUS). Nanoseconds, or -1 if the
// kernel lacks MADV_POPULATE_WRITE.
double CreateWithPopulate(uint64_t bytes, unsigned threads, bool fallocate_first) {
  const std::string name = absl::StrCat("/hostkv-bench.", getpid(), ".populate");
  const Clock::time_point t0 = Clock::now();
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) Die("shm_open " + name);
  if (fallocate_first) {
    if (posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) Die("posix_fallocate");
  } else if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    Die("ftruncate");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) Die("mmap");
  bool ok = true;
  std::vector<std::thread> workers;
  std::vector<int> errors(threads, 0);
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const uint64_t begin = bytes * t / threads / 4096 * 4096;
      const uint64_t end =
          t + 1 == threads ? bytes : bytes * (t + 1) / threads / 4096 * 4096;
      if (madvise(static_cast<uint8_t*>(p) + begin, end - begin,
                  MADV_POPULATE_WRITE) != 0) {
        errors[t] = errno;
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (int e : errors) ok = ok && e == 0;
  const double ns = NanosBetween(t0, Clock::now());
  munmap(p, bytes);
  shm_unlink(name.c_str());
  return ok ? ns : -1;
}

}  // namespace

void RunPoolStart(const Options& options, Report& report) {
  const uint64_t gib = 1ull << 30;
  uint64_t want = static_cast<uint64_t>(
      (options.quick ? std::min(options.pool_start_gib, 1.0) : options.pool_start_gib) *
      gib);
  // The pool and the baseline buffer never exist together; keep a third of
  // the available memory and half of /dev/shm free.
  const uint64_t limit = std::min(MemAvailableBytes() / 3 * 2, ShmFreeBytes() / 2);
  uint64_t bytes = std::min(want, limit) / (256ull << 20) * (256ull << 20);
  if (bytes == 0) Die("not enough free memory for the pool start benchmark");
  std::fprintf(stderr, "pool start: %.2f GiB (asked %.2f)\n",
               static_cast<double>(bytes) / gib, static_cast<double>(want) / gib);
  DaemonHandle daemon = StartDaemon(false);
  absl::StatusOr<std::unique_ptr<Client>> c =
      Client::Connect(daemon->target(), "bench-pool-start");
  CheckOk(c, "connect");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  v1::PoolSpec spec = MhaSpec("start", 32, 8, 128, v1::DTYPE_BF16, 64,
                              v1::LAYOUT_LAYER_FIRST, 1);
  spec.set_capacity_bytes(bytes);
  const int reps = options.quick ? 1 : 2;
  Samples create, one, many, seg_create, seg_prefault, populate, falloc_populate;
  uint64_t pool_bytes = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<v1::Pool> pool = (*c)->CreatePool(spec, false);
    create.Add(NanosBetween(t0, Clock::now()));
    CheckOk(pool, "create pool");
    pool_bytes = pool->total_bytes();
    CheckOk((*c)->DeletePool("start"), "delete pool");
    one.Add(MallocMemset(pool_bytes, 1));
    many.Add(MallocMemset(pool_bytes, cores));
    double create_ns = 0, prefault_ns = 0;
    CreateLikeDaemon(pool_bytes, cores, &create_ns, &prefault_ns);
    seg_create.Add(create_ns);
    seg_prefault.Add(prefault_ns);
    const double populate_ns = CreateWithPopulate(pool_bytes, cores, false);
    if (populate_ns >= 0) populate.Add(populate_ns);
    const double falloc_ns = CreateWithPopulate(pool_bytes, cores, true);
    if (falloc_ns >= 0) falloc_populate.Add(falloc_ns);
  }
  const std::string config =
      absl::StrCat(Num(static_cast<double>(pool_bytes) / gib), " GiB");
  for (bool single : {true, false}) {
    Row row;
    row.section = "pool_start";
    row.name = "CreatePool (fallocate /dev/shm + mmap + prefault)";
    row.config = config;
    row.metric = "best time";
    row.unit = "ms";
    row.value = create.Min() / 1e6;
    row.baseline = single ? "malloc + memset, 1 thread"
                          : absl::StrCat("malloc + memset, ", cores, " threads");
    row.baseline_value = (single ? one : many).Min() / 1e6;
    row.note = absl::StrCat("daemon prefaults with ", cores, " threads; best of ",
                            reps);
    report.Add(row);
  }
  struct Step {
    std::string name;
    const Samples* value;
    bool single;
  };
  const std::vector<Step> steps = {
      {"  where it goes: shm_open + posix_fallocate + mmap (in-process)",
       &seg_create, true},
      {absl::StrCat("  where it goes: Prefault, ", cores, " threads (in-process)"),
       &seg_prefault, true},
      {absl::StrCat("  alternative: posix_fallocate + MADV_POPULATE_WRITE, ",
                    cores, " threads"),
       &falloc_populate, false},
      {absl::StrCat("  alternative: ftruncate + MADV_POPULATE_WRITE, ", cores,
                    " threads"),
       &populate, false},
  };
  for (const Step& step : steps) {
    if (step.value->empty()) continue;
    Row row;
    row.section = "pool_start";
    row.name = step.name;
    row.config = config;
    row.metric = "best time";
    row.unit = "ms";
    row.value = step.value->Min() / 1e6;
    row.baseline = step.single ? "malloc + memset, 1 thread"
                               : absl::StrCat("malloc + memset, ", cores, " threads");
    row.baseline_value = (step.single ? one : many).Min() / 1e6;
    row.note = absl::StrCat("best of ", reps);
    report.Add(row);
  }
}

}  // namespace hostkv::bench
