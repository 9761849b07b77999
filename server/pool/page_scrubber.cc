#include "server/pool/page_scrubber.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/page_format.h"

namespace hostkv {

void ZeroPages(const PoolGeometry& g, uint8_t* base, const PageRun& run) {
  std::vector<BufferPiece> pieces;
  AppendPageRunPieces(g, run.first_page, run.num_pages, &pieces);
  for (const BufferPiece& piece : pieces) {
    std::memset(base + piece.offset, 0, piece.size);
  }
}

PageScrubber::PageScrubber(SlotAllocator* allocator, uint64_t batch_pages)
    : allocator_(allocator), thread_([allocator, batch_pages] {
        while (allocator->ScrubPending(batch_pages)) {
        }
      }) {}

PageScrubber::~PageScrubber() {
  allocator_->StopScrubbing();
  thread_.join();
}

uint64_t PageScrubber::BatchPages(const PoolGeometry& g, uint64_t batch_bytes) {
  return std::max<uint64_t>(
      1, batch_bytes / std::max<uint64_t>(1, g.page_bytes()));
}

}  // namespace hostkv
