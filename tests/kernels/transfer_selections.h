// Which host and device token slots the copy tests move: scattered whole
// pages, and device runs that are not page aligned.
#ifndef HOSTKV_TESTS_KERNELS_TRANSFER_SELECTIONS_H_
#define HOSTKV_TESTS_KERNELS_TRANSFER_SELECTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/copy_plan.h"

namespace hostkv {

struct Selection {
  std::string name;
  std::vector<SlotSpan> host;
  std::vector<SlotSpan> device;
};

// For a 5-page host pool and 8 pages + 4 device slots of page size `ps`.
inline std::vector<Selection> Selections(uint64_t ps) {
  return {
      // Whole pages, scattered and out of order; host pages 0 and 1 go to
      // device pages 2 and 3, which is one run contiguous on both sides.
      {"pages",
       {{3 * ps, ps}, {0, ps}, {ps, ps}, {4 * ps, ps}},
       {{5 * ps, ps}, {2 * ps, 2 * ps}, {0, ps}}},
      // Device runs not page aligned, cutting across host pages.
      {"unaligned_device",
       {{4 * ps, ps}, {ps, 2 * ps}, {0, ps}},
       {{4 * ps + 3, 2 * ps}, {1, 2 * ps}}},
  };
}

}  // namespace hostkv

#endif  // HOSTKV_TESTS_KERNELS_TRANSFER_SELECTIONS_H_
