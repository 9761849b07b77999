#include "tests/gpu/gpu_bench_output.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace hostkv::gpu_bench {
namespace {

bool WriteFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    if (!f.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

bool ReportOutput::Write(const Report& report) {
  const std::string json = Json(report);
  const std::string md = Markdown(report);
  absl::MutexLock lock(&mu_);
  last_ = report;
  return WriteLocked(json, md);
}

void ReportOutput::Interrupted(const std::string& why) {
  absl::MutexLock lock(&mu_);
  last_.notes.push_back(why);
  WriteLocked(Json(last_), Markdown(last_));
}

std::string ReportOutput::markdown() const {
  absl::MutexLock lock(&mu_);
  return markdown_;
}

bool ReportOutput::WriteLocked(const std::string& json, const std::string& md) {
  markdown_ = md;
  const bool json_ok = WriteFile(dir_ + "/gpu_bench.json", json);
  const bool md_ok = WriteFile(dir_ + "/gpu_bench.md", md);
  return json_ok && md_ok;
}

void ReportOutput::WatchSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([this, set] {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) return;
    Interrupted(sig == SIGTERM
                    ? "interrupted by SIGTERM (run.sh's time limit?): only the "
                      "cases above were measured"
                    : "interrupted by SIGINT: only the cases above were measured");
    std::fprintf(stderr, "hostkv_gpu_bench: signal %d: wrote what was measured "
                         "to %s\n", sig, dir_.c_str());
    std::fflush(stderr);
    std::_Exit(128 + sig);
  }).detach();
}

}  // namespace hostkv::gpu_bench
