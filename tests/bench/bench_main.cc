// hostkv_bench: what the daemon costs over the bare transport and the bare
// copy. Every figure is measured beside a baseline in the same run and
// reported with their ratio, as JSON (bench.json) and Markdown (bench.md).
//
//   hostkv_bench [--out=DIR] [--sections=control,request_cost,allocator,
//                daemon_alloc,copy,daemon_copy,pool_start,cache,cache_rpc,
//                tier]  [--quick]
//   (tier only in a build with hiredis: HOSTKV_BENCH_TIER)
//   hostkv_bench --profile=alloc_free [--profile_tcp] [--profile_seconds=10]
//
// tests/bench/run.sh builds it (Release) and runs it.
#include <sys/utsname.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/bench/sections.h"

ABSL_FLAG(std::string, out, "tests/bench/results",
          "directory for bench.json and bench.md");
#ifdef HOSTKV_BENCH_TIER
#define HOSTKV_BENCH_TIER_SECTION ",tier"
#else
#define HOSTKV_BENCH_TIER_SECTION ""
#endif
ABSL_FLAG(std::string, sections,
          "control,request_cost,allocator,daemon_alloc,alloc_zeroing,copy,"
          "daemon_copy,"
          "pool_start,cache,cache_rpc" HOSTKV_BENCH_TIER_SECTION,
          "comma-separated sections to run");
ABSL_FLAG(bool, quick, false, "fewer samples and smaller sizes (smoke run)");
ABSL_FLAG(int, copy_threads, 0,
          "threads of the in-process copy benchmarks (0 = one per core, as "
          "hostkvd)");
ABSL_FLAG(double, pool_start_gib, 4, "pool size of the pool start benchmark");
ABSL_FLAG(double, throughput_seconds, 0.6,
          "seconds per measured block of the throughput benchmark");
ABSL_FLAG(std::string, daemon_flags, "",
          "comma-separated extra flags for every hostkvd started, e.g. "
          "--copy_threads=1 (an experiment; the default is the daemon's "
          "defaults)");
ABSL_FLAG(int, daemon_copy_nice, 0,
          "experiment: renice the daemon's own threads (copy dispatcher and "
          "workers; not gRPC's) to this nice value after start; 1000 puts "
          "them in SCHED_BATCH, 1001 in SCHED_IDLE instead");
ABSL_FLAG(bool, copy_hugepages, false,
          "madvise(MADV_HUGEPAGE) the in-process copy buffers (an experiment)");
ABSL_FLAG(std::string, git_rev, "", "recorded in the results");
ABSL_FLAG(std::string, profile, "",
          "instead of the benchmarks, loop one workload against a fresh "
          "daemon (health, alloc_free, stats, register, load1000) and print "
          "the daemon's pid, for perf");
ABSL_FLAG(bool, profile_tcp, false, "--profile over TCP loopback");
ABSL_FLAG(double, profile_seconds, 10, "--profile duration");

namespace {

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace hostkv::bench;
  if (!absl::GetFlag(FLAGS_profile).empty()) {
    SetDaemonCopyNice(absl::GetFlag(FLAGS_daemon_copy_nice));
    SetDaemonFlags(absl::StrSplit(absl::GetFlag(FLAGS_daemon_flags), ',',
                                  absl::SkipEmpty()));
    return RunProfileLoop(absl::GetFlag(FLAGS_profile),
                          absl::GetFlag(FLAGS_profile_tcp),
                          absl::GetFlag(FLAGS_profile_seconds));
  }
  Options options;
  options.quick = absl::GetFlag(FLAGS_quick);
  options.copy_threads = static_cast<unsigned>(absl::GetFlag(FLAGS_copy_threads));
  options.pool_start_gib = absl::GetFlag(FLAGS_pool_start_gib);
  options.throughput_seconds = absl::GetFlag(FLAGS_throughput_seconds);
  options.copy_hugepages = absl::GetFlag(FLAGS_copy_hugepages);
  SetDaemonCopyNice(absl::GetFlag(FLAGS_daemon_copy_nice));
  SetDaemonFlags(absl::StrSplit(absl::GetFlag(FLAGS_daemon_flags), ',',
                                absl::SkipEmpty()));
  const std::vector<std::string> list =
      absl::StrSplit(absl::GetFlag(FLAGS_sections), ',', absl::SkipEmpty());
  const std::set<std::string> sections(list.begin(), list.end());
  static const std::set<std::string> known = {
      "control",     "request_cost", "allocator", "daemon_alloc", "alloc_zeroing",
      "copy",        "daemon_copy",  "pool_start", "cache",
      "cache_rpc",   "tier"};
  for (const std::string& s : sections) {
#ifndef HOSTKV_BENCH_TIER
    if (s == "tier") Die("section tier needs hiredis (libhiredis-dev) at configure time");
#endif
    if (!known.contains(s)) Die("unknown section " + s);
  }

  Report report;
  utsname u{};
  uname(&u);
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  report.SetMeta("date", date);
  report.SetMeta("host", absl::StrCat(u.nodename, " (", u.sysname, " ", u.release, ")"));
  report.SetMeta("cpu", absl::StrCat(CpuModel(), ", ",
                                     std::thread::hardware_concurrency(),
                                     " hardware threads"));
  report.SetMeta("build", absl::StrCat(HOSTKV_BENCH_BUILD_TYPE, ", ",
                                       HOSTKV_BENCH_COMPILER));
  if (!absl::GetFlag(FLAGS_git_rev).empty()) {
    report.SetMeta("git", absl::GetFlag(FLAGS_git_rev));
  }
  report.SetMeta("mode", options.quick ? "quick" : "full");
  report.SetMeta("sections", absl::GetFlag(FLAGS_sections));
  if (!absl::GetFlag(FLAGS_daemon_flags).empty()) {
    report.SetMeta("daemon flags", absl::GetFlag(FLAGS_daemon_flags));
  }
  if (options.copy_hugepages) report.SetMeta("copy buffers", "MADV_HUGEPAGE");
  if (absl::GetFlag(FLAGS_daemon_copy_nice) != 0) {
    report.SetMeta("daemon's own threads reniced to",
                   std::to_string(absl::GetFlag(FLAGS_daemon_copy_nice)));
  }

  const Clock::time_point start = Clock::now();
  if (sections.contains("control")) RunControl(options, report);
  if (sections.contains("request_cost")) RunRequestCost(options, report);
  if (sections.contains("allocator")) RunAllocator(options, report);
  if (sections.contains("daemon_alloc")) RunDaemonAlloc(options, report);
  if (sections.contains("alloc_zeroing")) RunAllocZeroing(options, report);
  if (sections.contains("copy")) RunCopy(options, report);
  if (sections.contains("daemon_copy")) RunDaemonCopy(options, report);
  if (sections.contains("pool_start")) RunPoolStart(options, report);
  if (sections.contains("cache")) RunCache(options, report);
  if (sections.contains("cache_rpc")) RunCacheRpc(options, report);
#ifdef HOSTKV_BENCH_TIER
  if (sections.contains("tier")) RunTier(options, report);
#endif
  report.SetMeta("duration", absl::StrCat(Num(SecondsSince(start)), " s"));

  const std::string out = absl::GetFlag(FLAGS_out);
  std::string md = report.Markdown();
  for (const auto& [file, text] :
       {std::pair<std::string, std::string>{"bench.json", report.Json()},
        {"bench.md", md}}) {
    std::ofstream f(out + "/" + file);
    f << text;
    if (!f) Die("cannot write " + out + "/" + file);
  }
  std::fwrite(md.data(), 1, md.size(), stdout);
  std::fprintf(stderr, "\nwrote %s/bench.json and %s/bench.md\n", out.c_str(),
               out.c_str());
  return 0;
}
