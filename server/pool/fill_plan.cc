#include "server/pool/fill_plan.h"

#include <algorithm>

#include "kernels/page_format.h"
#include "server/pool/pin_plan.h"

namespace hostkv {

std::vector<PageRun> PlanFillChunks(uint64_t num_pages, uint64_t page_bytes,
                                    uint64_t target_bytes) {
  std::vector<PageRun> chunks;
  if (num_pages == 0) return chunks;
  const uint64_t per_chunk =
      page_bytes == 0 ? num_pages : std::max<uint64_t>(1, target_bytes / page_bytes);
  for (uint64_t first = 0; first < num_pages; first += per_chunk) {
    chunks.push_back({first, std::min(per_chunk, num_pages - first)});
  }
  return chunks;
}

std::vector<SegmentRange> FillChunkRanges(const PoolGeometry& g, const PageRun& run) {
  std::vector<SegmentRange> ranges;
  if (run.num_pages == 0) return ranges;
  const uint64_t total = g.total_bytes();
  // The run's pieces (one per piece of its first page in every layout
  // today), widened to whole OS pages.
  std::vector<BufferPiece> pieces;
  AppendPageRunPieces(g, run.first_page, run.num_pages, &pieces);
  for (const BufferPiece& piece : pieces) {
    if (piece.size == 0) continue;
    const uint64_t begin = piece.offset / kOsPageBytes * kOsPageBytes;
    const uint64_t end = std::min(
        total, (piece.offset + piece.size + kOsPageBytes - 1) / kOsPageBytes *
                   kOsPageBytes);
    ranges.push_back({begin, end - begin});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const SegmentRange& a, const SegmentRange& b) { return a.offset < b.offset; });
  std::vector<SegmentRange> merged;
  for (const SegmentRange& r : ranges) {
    if (!merged.empty() && r.offset <= merged.back().offset + merged.back().bytes) {
      SegmentRange& back = merged.back();
      back.bytes = std::max(back.offset + back.bytes, r.offset + r.bytes) - back.offset;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

}  // namespace hostkv
