// SGLang's flat page format (get_data_page(flat=True) /
// set_from_flat_data_page) and page buffer meta (get_page_buffer_meta), on
// top of layout_offsets.h. Storage tiers read and write pages in this format,
// so pages written by SGLang are readable by hostkv and back.
#ifndef HOSTKV_KERNELS_PAGE_FORMAT_H_
#define HOSTKV_KERNELS_PAGE_FORMAT_H_

#include <cstdint>
#include <vector>

#include "kernels/pool_geometry.h"

namespace hostkv {

// Copies host page `page` of the pool at `pool` into `flat`
// (g.page_bytes() bytes), flattened in the layout's own axis order:
//   layer_first (2, L, ps, H, D)   page_first (2, ps, L, H, D)
//   page_first_direct (2, 1, L, ps, H, D)   page_head (2, 1, H, ps, L, D)
// (MLA: the same without the leading K/V axis.)
// REQUIRES: page < g.num_pages().
void CopyPageToFlat(const PoolGeometry& g, const uint8_t* pool, uint64_t page,
                    uint8_t* flat);

// The inverse of CopyPageToFlat.
void CopyFlatToPage(const PoolGeometry& g, const uint8_t* flat, uint64_t page,
                    uint8_t* pool);

struct BufferPiece {
  uint64_t offset;  // from the start of the pool
  uint64_t size;
};

// Appends the pieces of host page `page`, in get_page_buffer_meta order:
//   MHA layer_first: per layer, K then V, ps * token_stride bytes each;
//   other MHA layouts: K then V, L * ps * token_stride bytes each;
//   MLA layer_first: per layer one piece; other MLA layouts: one piece.
void AppendPageBufferPieces(const PoolGeometry& g, uint64_t page,
                            std::vector<BufferPiece>* pieces);

// Appends the pieces of the pages [first_page, first_page + num_pages): in
// every layout the same piece of the next page follows a page's piece, so a
// run is one piece per piece of its first page, num_pages times as long
// (checked on the run's last page; page by page where it does not hold).
// The pieces cover exactly the bytes of the run's pages, in no set order.
void AppendPageRunPieces(const PoolGeometry& g, uint64_t first_page,
                         uint64_t num_pages, std::vector<BufferPiece>* pieces);

// Appends the contiguous pieces of host page `page` in the layout's flat
// order (CopyPageToFlat's): reading them in order reads the flat page.
void AppendPageFlatPieces(const PoolGeometry& g, uint64_t page,
                          std::vector<BufferPiece>* pieces);

// Copies host page `from` over host page `to` of the same pool (every
// layer, K and V), piece by piece as AppendPageBufferPieces lists them.
// REQUIRES: both < g.num_pages(), from != to.
void CopyPage(const PoolGeometry& g, uint8_t* pool, uint64_t from, uint64_t to);

}  // namespace hostkv

#endif  // HOSTKV_KERNELS_PAGE_FORMAT_H_
