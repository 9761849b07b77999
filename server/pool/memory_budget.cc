#include "server/pool/memory_budget.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hostkv {

std::string FormatBytes(uint64_t bytes) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  constexpr double kMiB = 1024.0 * 1024;
  if (bytes >= (1ull << 30)) return absl::StrFormat("%.2f GiB", bytes / kGiB);
  if (bytes >= (1ull << 20)) return absl::StrFormat("%.2f MiB", bytes / kMiB);
  return absl::StrCat(bytes, " B");
}

MemoryBudget::MemoryBudget(uint64_t budget_bytes, uint64_t reserve_bytes,
                           AvailableFn available)
    : budget_bytes_(budget_bytes),
      reserve_bytes_(reserve_bytes),
      available_(std::move(available)) {}

absl::Status MemoryBudget::Reserve(const std::string& what, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (budget_bytes_ != 0 && bytes > budget_bytes_ - reserved_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", FormatBytes(bytes), " but only ",
        FormatBytes(budget_bytes_ - reserved_), " of the daemon's ",
        FormatBytes(budget_bytes_),
        " memory budget is left; shrink the pool's capacity or raise "
        "--memory_budget"));
  }
  const uint64_t available = available_();
  const uint64_t usable =
      available > reserve_bytes_ ? available - reserve_bytes_ : 0;
  if (bytes > usable) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", FormatBytes(bytes), " but the host has ",
        FormatBytes(available), " available and ", FormatBytes(reserve_bytes_),
        " is kept in reserve; shrink the pool's capacity (or lower "
        "--memory_reserve)"));
  }
  reserved_ += bytes;
  return absl::OkStatus();
}

void MemoryBudget::Release(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  reserved_ -= bytes;
}

uint64_t MemoryBudget::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

uint64_t MemoryBudget::CgroupHeadroom(const std::string& max_text,
                                      const std::string& current_text) {
  uint64_t max = 0, current = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(max_text), &max) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(current_text), &current)) {
    return UINT64_MAX;  // "max": no limit
  }
  return max > current ? max - current : 0;
}

namespace {

std::string ReadSmallFile(const char* path) {
  std::ifstream file(path);
  std::string text;
  std::getline(file, text);
  return text;
}

}  // namespace

uint64_t MemoryBudget::SystemAvailableBytes() {
  uint64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") available = kib * 1024;
  }
  return std::min(available,
                  CgroupHeadroom(ReadSmallFile("/sys/fs/cgroup/memory.max"),
                                 ReadSmallFile("/sys/fs/cgroup/memory.current")));
}

}  // namespace hostkv
