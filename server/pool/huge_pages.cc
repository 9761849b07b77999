#include "server/pool/huge_pages.h"

#include <sys/mman.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#ifndef MFD_HUGE_SHIFT
#define MFD_HUGE_SHIFT 26
#endif
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << MFD_HUGE_SHIFT)
#endif
#ifndef MFD_HUGE_1GB
#define MFD_HUGE_1GB (30U << MFD_HUGE_SHIFT)
#endif

namespace hostkv {
namespace {

constexpr uint64_t k2M = 2ull << 20;
constexpr uint64_t k1G = 1ull << 30;

uint64_t ReadNumber(const std::string& path) {
  std::ifstream in(path);
  uint64_t n = 0;
  return (in >> n) ? n : 0;
}

uint64_t PagesFor(uint64_t bytes, uint64_t page) { return (bytes + page - 1) / page; }

absl::Status Short(const char* size, uint64_t need, uint64_t free,
                   const std::string& knob) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the pool needs ", need, " hugetlb pages of ", size, " but ", free,
      " are free: raise ", knob, " by at least ", need - free,
      " (or ask for hugepages 'auto' or 'off')"));
}

}  // namespace

absl::StatusOr<HugePageMode> ParseHugePageMode(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "auto") return HugePageMode::kAuto;
  if (t == "off" || t == "4k") return HugePageMode::kOff;
  if (t == "2m" || t == "2mib") return HugePageMode::k2M;
  if (t == "1g" || t == "1gib") return HugePageMode::k1G;
  return absl::InvalidArgumentError(absl::StrCat(
      "hugepages '", text, "' is not one of auto, off, 2M, 1G"));
}

const char* HugePageModeName(HugePageMode mode) {
  switch (mode) {
    case HugePageMode::kAuto: return "auto";
    case HugePageMode::kOff: return "off";
    case HugePageMode::k2M: return "2M";
    case HugePageMode::k1G: return "1G";
  }
  return "?";
}

HugePageSystem ReadHugePageSystem(const std::string& sysfs_root) {
  HugePageSystem s;
  const std::string pages = sysfs_root + "/kernel/mm/hugepages/";
  s.free_2m = ReadNumber(pages + "hugepages-2048kB/free_hugepages");
  s.free_1g = ReadNumber(pages + "hugepages-1048576kB/free_hugepages");
  std::ifstream in(sysfs_root + "/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  std::getline(in, line);
  const size_t open = line.find('[');
  const size_t close = line.find(']', open);
  if (open != std::string::npos && close != std::string::npos) {
    s.shmem_thp = line.substr(open + 1, close - open - 1);
  }
  return s;
}

absl::StatusOr<HugePagePlan> PlanHugePages(HugePageMode mode, uint64_t bytes,
                                           const HugePageSystem& system) {
  HugePagePlan plan;
  plan.used = "4K";
  const uint64_t need_2m = PagesFor(bytes, k2M);
  const uint64_t need_1g = PagesFor(bytes, k1G);
  switch (mode) {
    case HugePageMode::kOff:
      return plan;
    case HugePageMode::k1G:
      if (system.free_1g < need_1g) {
        return Short("1 GiB", need_1g, system.free_1g,
                     "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages");
      }
      return HugePagePlan{MFD_HUGETLB | MFD_HUGE_1GB, k1G, false, "1G"};
    case HugePageMode::k2M:
      if (system.free_2m < need_2m) {
        return Short("2 MiB", need_2m, system.free_2m, "vm.nr_hugepages");
      }
      return HugePagePlan{MFD_HUGETLB | MFD_HUGE_2MB, k2M, false, "2M"};
    case HugePageMode::kAuto:
      if (system.free_2m > 0 && system.free_2m >= need_2m) {
        return HugePagePlan{MFD_HUGETLB | MFD_HUGE_2MB, k2M, false, "2M"};
      }
      // Shared memory takes THP only where shmem_enabled allows it:
      // "advise" on MADV_HUGEPAGE, "always" / "within_size" / "force" by
      // itself; "never" / "deny" not at all.
      if (system.shmem_thp == "advise") {
        plan.madvise_thp = true;
        plan.used = "thp";
      } else if (system.shmem_thp == "always" || system.shmem_thp == "within_size" ||
                 system.shmem_thp == "force") {
        plan.used = "thp";
      }
      return plan;
  }
  return plan;
}

}  // namespace hostkv
