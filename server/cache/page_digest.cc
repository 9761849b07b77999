#include "server/cache/page_digest.h"

#include "server/tier/crc32c.h"

namespace hostkv {

uint32_t PageDigester::Digest(uint64_t page) {
  pieces_.clear();
  AppendPageFlatPieces(geometry_, page, &pieces_);
  uint32_t crc = 0;
  for (const BufferPiece& piece : pieces_) {
    crc = Crc32cExtend(crc, pool_ + piece.offset, piece.size);
  }
  return crc;
}

size_t FirstMismatch(PageDigester& digester, const std::vector<uint64_t>& pages,
                     const std::vector<std::optional<uint32_t>>& digests,
                     uint64_t* matched, uint64_t* unknown) {
  for (size_t i = 0; i < pages.size(); ++i) {
    if (!digests[i].has_value()) {
      ++*unknown;
      continue;
    }
    if (digester.Digest(pages[i]) != *digests[i]) return i;
    ++*matched;
  }
  return pages.size();
}

}  // namespace hostkv
