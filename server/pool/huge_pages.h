// Hugepages for pool segments: which kind a pool gets (transparent huge
// pages on its memfd mapping, or a hugetlbfs memfd of 2 MiB or 1 GiB
// pages), from what it asks and what the kernel offers.
#ifndef HOSTKV_SERVER_POOL_HUGE_PAGES_H_
#define HOSTKV_SERVER_POOL_HUGE_PAGES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hostkv {

// What a pool asks for (PoolSpec.hugepages, --pool_hugepages).
enum class HugePageMode : uint8_t {
  kAuto,  // 2 MiB hugetlb pages if enough are free, else THP where the
          // kernel allows it on shared memory, else 4 KiB pages
  kOff,   // 4 KiB pages
  k2M,    // hugetlb 2 MiB pages, or an error naming the sysctl
  k1G,    // hugetlb 1 GiB pages, or an error naming the sysfs knob
};

// "auto", "off", "2M", "1G" (case-insensitive; "2MiB", "1GiB" too).
// InvalidArgument otherwise.
absl::StatusOr<HugePageMode> ParseHugePageMode(absl::string_view text);
const char* HugePageModeName(HugePageMode mode);

// What the kernel offers, read from sysfs (a root other than "/sys" in
// tests): free hugetlb pages of each size, and the shmem THP setting
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled, the bracketed word;
// empty if unknown).
struct HugePageSystem {
  uint64_t free_2m = 0;
  uint64_t free_1g = 0;
  std::string shmem_thp;
};
HugePageSystem ReadHugePageSystem(const std::string& sysfs_root = "/sys");

// How a segment is made.
struct HugePagePlan {
  unsigned memfd_flags = 0;   // MFD_HUGETLB | MFD_HUGE_2MB/1GB, or 0
  uint64_t page_bytes = 4096;  // the segment's size is a multiple of it
  bool madvise_thp = false;    // MADV_HUGEPAGE on the mapping
  std::string used;            // "4K", "thp", "2M", "1G"
};

// The plan for a segment of `bytes` asked with `mode`. ResourceExhausted
// for 2M / 1G when too few hugetlb pages are free, naming the sysctl
// (vm.nr_hugepages) or sysfs file to raise and by how much.
absl::StatusOr<HugePagePlan> PlanHugePages(HugePageMode mode, uint64_t bytes,
                                           const HugePageSystem& system);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_HUGE_PAGES_H_
