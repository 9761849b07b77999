// Shared pieces of the hostkv benchmark driver: sample statistics, the
// result rows (each figure beside a baseline measured in the same run, and
// their ratio), and the JSON / Markdown writers.
#ifndef HOSTKV_TESTS_BENCH_BENCH_UTIL_H_
#define HOSTKV_TESTS_BENCH_BENCH_UTIL_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hostkv::bench {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline double NanosBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::nano>(b - a).count();
}

// Dies with a message: benchmarks have no use for half a result.
[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "hostkv_bench: %s\n", what.c_str());
  std::exit(1);
}

inline void CheckOk(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Die(what + ": " + status.ToString());
}
template <typename T>
void CheckOk(const absl::StatusOr<T>& result, const std::string& what) {
  CheckOk(result.status(), what);
}

// A set of samples (any unit).
class Samples {
 public:
  void Add(double v) { v_.push_back(v); }
  void Reserve(size_t n) { v_.reserve(n); }
  size_t size() const { return v_.size(); }
  bool empty() const { return v_.empty(); }
  // Nearest-rank percentile, p in [0, 100].
  double Percentile(double p) const;
  double Median() const { return Percentile(50); }
  double Mean() const;
  double Min() const;
  double Max() const;

 private:
  std::vector<double> v_;
};

// Which way a ratio must go to meet its target.
struct Target {
  enum Kind { kNone, kAtMost, kAtLeast } kind = kNone;
  double bound = 0;
  std::string text;  // what the issue says, shown beside the ratio

  static Target None() { return {}; }
  static Target AtMost(double bound, std::string text) {
    return {kAtMost, bound, std::move(text)};
  }
  static Target AtLeast(double bound, std::string text) {
    return {kAtLeast, bound, std::move(text)};
  }
};

// One figure beside its baseline. ratio = value / baseline_value.
struct Row {
  std::string section;   // control, throughput, allocator, copy, daemon_copy, pool_start
  std::string name;      // what was measured
  std::string config;    // transport / geometry / size
  std::string metric;    // p50, p99, throughput, ...
  std::string unit;
  double value = 0;
  std::string baseline;  // what the baseline is
  double baseline_value = 0;
  double ratio = 0;
  Target target;
  std::string verdict;   // "met", "MISSED" or "" (no target)
  std::string note;
};

class Report {
 public:
  // Adds a row, computing the ratio and the verdict; echoes it to stderr.
  Row& Add(Row row);
  const std::vector<Row>& rows() const { return rows_; }

  void SetMeta(const std::string& key, const std::string& value) {
    meta_.push_back({key, value});
  }
  std::string Json() const;
  std::string Markdown() const;

 private:
  std::vector<Row> rows_;
  std::vector<std::pair<std::string, std::string>> meta_;
};

// A short human form of a number ("12.3", "0.456", "1.23e+06").
std::string Num(double v);

// Touches every byte of [p, p + n) so that the pages are faulted in.
void Touch(void* p, size_t n, unsigned char value);

}  // namespace hostkv::bench

#endif  // HOSTKV_TESTS_BENCH_BENCH_UTIL_H_
