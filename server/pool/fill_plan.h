// How a new pool's memory is made resident: in chunks of whole pool pages,
// each a few OS-page-aligned byte ranges of the segment (a run of pages is
// one range per piece of a page in layer-first layouts).
#ifndef HOSTKV_SERVER_POOL_FILL_PLAN_H_
#define HOSTKV_SERVER_POOL_FILL_PLAN_H_

#include <cstdint>
#include <vector>

#include "kernels/pool_geometry.h"
#include "server/pool/slot_allocator.h"

namespace hostkv {

// Bytes [offset, offset + bytes) of a segment.
struct SegmentRange {
  uint64_t offset;
  uint64_t bytes;
  bool operator==(const SegmentRange& o) const {
    return offset == o.offset && bytes == o.bytes;
  }
};

// Splits pages [0, num_pages) into consecutive runs of
// max(1, target_bytes / page_bytes) pages, the last one shorter. Empty for
// 0 pages; page_bytes 0 means one run.
std::vector<PageRun> PlanFillChunks(uint64_t num_pages, uint64_t page_bytes,
                                    uint64_t target_bytes);

// The bytes of the segment that hold pages `run` of a pool of geometry `g`,
// widened to whole OS pages (kOsPageBytes) and clipped to the segment
// (g.total_bytes()), sorted and merged. Neighbouring runs may share an OS
// page at their boundary.
// REQUIRES: run within [0, g.num_pages()).
std::vector<SegmentRange> FillChunkRanges(const PoolGeometry& g, const PageRun& run);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_FILL_PLAN_H_
