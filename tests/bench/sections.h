// The benchmark sections of hostkv_bench. Each appends rows to the report.
#ifndef HOSTKV_TESTS_BENCH_SECTIONS_H_
#define HOSTKV_TESTS_BENCH_SECTIONS_H_

#include <memory>
#include <string>
#include <vector>

#include "tests/bench/bench_util.h"
#include "tests/testing/daemon_process.h"

namespace hostkv::bench {

struct Options {
  // Smaller sample counts and sizes (a smoke run of the whole suite).
  bool quick = false;
  // Copy threads for the in-process copy benchmarks (0: one per core, as the
  // daemon defaults to).
  unsigned copy_threads = 0;
  // Pool start size in GiB (scaled down if memory is short).
  double pool_start_gib = 4;
  // Seconds per measured block of the throughput benchmark.
  double throughput_seconds = 0.6;
  // madvise(MADV_HUGEPAGE) the in-process copy buffers (an experiment).
  bool copy_hugepages = false;
};

// Extra flags for every hostkvd the benchmarks start (--daemon_flags).
void SetDaemonFlags(std::vector<std::string> flags);
// Experiment: nice value for the daemon's own (non-gRPC) threads, which
// include the copy threads (--daemon_copy_nice); 0 leaves them alone.
void SetDaemonCopyNice(int nice);

// Stops the daemon with SIGTERM, so that it removes its pool segments
// (DaemonProcess alone SIGKILLs it, which leaves them in /dev/shm).
struct DaemonStopper {
  void operator()(testing::DaemonProcess* daemon) const;
};
using DaemonHandle = std::unique_ptr<testing::DaemonProcess, DaemonStopper>;

// The real hostkvd, as a child process, on a Unix socket or TCP loopback.
// Should the benchmark die, the daemons still running get SIGTERM at exit.
DaemonHandle StartDaemon(bool tcp);

// Section 1: control-path latency (unix and tcp) and throughput.
void RunControl(const Options& options, Report& report);
// Section 1c: in-process cost of encoding and decoding a large Load request.
void RunRequestCost(const Options& options, Report& report);
// Section 2: in-process SlotAllocator; 2b: allocator through the daemon.
void RunAllocator(const Options& options, Report& report);
void RunDaemonAlloc(const Options& options, Report& report);
// Section 2c: Alloc through the daemon when its pages must be zeroed, or
// need not be (a session's own bytes), beside pages that cost nothing.
void RunAllocZeroing(const Options& options, Report& report);
// Section 3: in-process copy engine; 3b: the same through the daemon.
void RunCopy(const Options& options, Report& report);
void RunDaemonCopy(const Options& options, Report& report);
// Section 4: pool creation and pre-faulting.
void RunPoolStart(const Options& options, Report& report);
// Section 5: in-process PageCache (lookup, publish, eviction per page).
void RunCache(const Options& options, Report& report);
// Section 5b: the page cache through the daemon (Lookup, Publish, Release
// beside a bare call; a warm restart's first layer beside the writer's load).
void RunCacheRpc(const Options& options, Report& report);
// Section 6: the storage tiers (server/tier/) in-process: the value frame,
// the Redis tier beside raw hiredis on a redis-server of its own, the file
// tier beside dd and bare system calls. Built only with hiredis
// (HOSTKV_BENCH_TIER).
void RunTier(const Options& options, Report& report);

// Profiling aid: starts a daemon, prints its pid, and runs one control-path
// workload (`what`: health, alloc, free, alloc_free, load1000, register,
// stats) in a loop for `seconds`.
int RunProfileLoop(const std::string& what, bool tcp, double seconds);

}  // namespace hostkv::bench

#endif  // HOSTKV_TESTS_BENCH_SECTIONS_H_
