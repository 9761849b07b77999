#include "server/pool/page_scrubber.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/page_format.h"

namespace hostkv {

void ZeroPages(const PoolGeometry& g, uint8_t* base, const PageRun& run) {
  if (run.num_pages == 0) return;
  // A page's pieces (page_format.h): the same piece of the next page follows
  // it in every layout, so a run is one memset per piece of its first page.
  // Checked on the last page; per page otherwise.
  std::vector<BufferPiece> first;
  std::vector<BufferPiece> last;
  AppendPageBufferPieces(g, run.first_page, &first);
  AppendPageBufferPieces(g, run.first_page + run.num_pages - 1, &last);
  bool contiguous = first.size() == last.size();
  for (size_t i = 0; contiguous && i < first.size(); ++i) {
    contiguous = last[i].offset ==
                     first[i].offset + (run.num_pages - 1) * first[i].size &&
                 last[i].size == first[i].size;
  }
  if (contiguous) {
    for (const BufferPiece& piece : first) {
      std::memset(base + piece.offset, 0, piece.size * run.num_pages);
    }
    return;
  }
  std::vector<BufferPiece> pieces;
  for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
    pieces.clear();
    AppendPageBufferPieces(g, p, &pieces);
    for (const BufferPiece& piece : pieces) {
      std::memset(base + piece.offset, 0, piece.size);
    }
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
