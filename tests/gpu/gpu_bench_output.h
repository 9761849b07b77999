// Where hostkv_gpu_bench's results go, so that a run cut short keeps what it
// measured: the report is written again after every case (atomically: a
// temporary file renamed over the old one), by Fail() before it exits, and
// by a signal thread on SIGTERM or SIGINT (run.sh's timeout), which adds a
// note that the run was interrupted.
#ifndef HOSTKV_TESTS_GPU_GPU_BENCH_OUTPUT_H_
#define HOSTKV_TESTS_GPU_GPU_BENCH_OUTPUT_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tests/gpu/gpu_bench_report.h"

namespace hostkv::gpu_bench {

// Thread-safe.
class ReportOutput {
 public:
  explicit ReportOutput(std::string dir) : dir_(std::move(dir)) {}

  // Writes DIR/gpu_bench.json and DIR/gpu_bench.md for `report` now and
  // keeps their text for Interrupted(). Returns false if a file could not
  // be written.
  bool Write(const Report& report) ABSL_LOCKS_EXCLUDED(mu_);

  // Writes the last report again with `why` added to its notes.
  void Interrupted(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

  // The Markdown last written ("" before the first Write).
  std::string markdown() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks SIGTERM and SIGINT in this thread (call it before any other
  // thread starts, so that all inherit the mask) and starts a thread that
  // waits for them: it calls Interrupted() and ends the process with
  // 128 + the signal.
  void WatchSignals();

 private:
  bool WriteLocked(const std::string& json, const std::string& md)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  mutable absl::Mutex mu_;
  Report last_ ABSL_GUARDED_BY(mu_);
  std::string markdown_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv::gpu_bench

#endif  // HOSTKV_TESTS_GPU_GPU_BENCH_OUTPUT_H_
