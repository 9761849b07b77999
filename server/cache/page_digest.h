// The digest of a cached page (server/README.md "Page digests"): CRC32C of
// the page's bytes read in its layout's flat order (kernels/page_format.h),
// so that a page's digest in the pool and the checksum of its storage-tier
// value (tier_value.h, a flat page) are one number. The pool's layout
// fingerprint (GeometryFingerprint: attention, layout, layers, heads, head
// bytes, page size, dtype) says which bytes a digest may be compared with:
// pages of one fingerprint only.
#ifndef HOSTKV_SERVER_CACHE_PAGE_DIGEST_H_
#define HOSTKV_SERVER_CACHE_PAGE_DIGEST_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/page_format.h"
#include "kernels/pool_geometry.h"

namespace hostkv {

// Reads one pool's pages and takes their digests; keeps the pieces of the
// last page it read (not thread-safe: one per thread).
class PageDigester {
 public:
  PageDigester(const PoolGeometry& geometry, const uint8_t* pool)
      : geometry_(geometry), pool_(pool) {}

  // The digest of `page` (REQUIRES: page < num_pages) as its bytes are now.
  uint32_t Digest(uint64_t page);

 private:
  const PoolGeometry geometry_;
  const uint8_t* const pool_;
  std::vector<BufferPiece> pieces_;
};

// The first of `pages` whose bytes do not match `digests` (a page whose
// digest is nullopt is not checked: counted in *unknown), or pages.size()
// when all match; *matched counts those checked and matching before it.
size_t FirstMismatch(PageDigester& digester, const std::vector<uint64_t>& pages,
                     const std::vector<std::optional<uint32_t>>& digests,
                     uint64_t* matched, uint64_t* unknown);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CACHE_PAGE_DIGEST_H_
