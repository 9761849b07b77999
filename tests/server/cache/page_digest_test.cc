// Page digests (server/cache/page_digest.h): the CRC32C of the page in its
// layout's flat order, for every layout and both attentions, equal to the
// checksum of the page's tier value; one changed byte anywhere in the page
// changes it, bytes of other pages do not; FirstMismatch; CRC32C taken in
// pieces.
#include "server/cache/page_digest.h"

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/page_format.h"
#include "server/tier/crc32c.h"
#include "server/tier/tier_value.h"

namespace hostkv {
namespace {

PoolGeometry Geometry(Attention attention, HostLayout layout) {
  PoolGeometry g;
  g.attention = attention;
  g.layout = layout;
  g.num_layers = 3;
  g.num_heads = attention == Attention::kMla ? 1 : 2;
  g.head_bytes = 16;
  g.page_size = 4;
  g.token_slots = 32;
  return g;
}

std::vector<uint8_t> RandomPool(const PoolGeometry& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> pool(g.total_bytes());
  for (uint8_t& b : pool) b = static_cast<uint8_t>(rng());
  return pool;
}

class PageDigestTest
    : public ::testing::TestWithParam<std::tuple<Attention, HostLayout>> {};

TEST_P(PageDigestTest, IsTheCrc32cOfTheFlatPageAndOfItsTierValue) {
  const PoolGeometry g = Geometry(std::get<0>(GetParam()), std::get<1>(GetParam()));
  std::vector<uint8_t> pool = RandomPool(g, 7);
  PageDigester digester(g, pool.data());
  std::string flat(g.page_bytes(), '\0');
  for (uint64_t page = 0; page < g.num_pages(); ++page) {
    CopyPageToFlat(g, pool.data(), page, reinterpret_cast<uint8_t*>(flat.data()));
    const uint32_t digest = digester.Digest(page);
    EXPECT_EQ(Crc32c(flat.data(), flat.size()), digest) << page;
    EXPECT_EQ(digest, FrameChecksum(FrameValue(1, flat)));
  }
}

TEST_P(PageDigestTest, EveryByteOfThePageAndNoOtherChangesIt) {
  const PoolGeometry g = Geometry(std::get<0>(GetParam()), std::get<1>(GetParam()));
  std::vector<uint8_t> pool = RandomPool(g, 9);
  PageDigester digester(g, pool.data());
  const uint64_t page = 3;
  const uint32_t before = digester.Digest(page);
  std::vector<BufferPiece> pieces;
  AppendPageBufferPieces(g, page, &pieces);
  std::vector<bool> in_page(pool.size(), false);
  for (const BufferPiece& p : pieces) {
    for (uint64_t i = p.offset; i < p.offset + p.size; ++i) in_page[i] = true;
  }
  for (size_t i = 0; i < pool.size(); ++i) {
    pool[i] ^= 0x01;
    EXPECT_EQ(in_page[i], digester.Digest(page) != before) << "byte " << i;
    pool[i] ^= 0x01;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PageDigestTest,
    ::testing::Combine(::testing::Values(Attention::kMha, Attention::kMla),
                       ::testing::Values(HostLayout::kLayerFirst, HostLayout::kPageFirst,
                                         HostLayout::kPageFirstDirect,
                                         HostLayout::kPageHead)));

TEST(FirstMismatchTest, StopsAtTheFirstChangedPageAndSkipsPendingDigests) {
  const PoolGeometry g = Geometry(Attention::kMha, HostLayout::kPageFirst);
  std::vector<uint8_t> pool = RandomPool(g, 11);
  PageDigester digester(g, pool.data());
  const std::vector<uint64_t> pages = {5, 1, 6, 2};
  std::vector<std::optional<uint32_t>> digests;
  for (uint64_t p : pages) digests.push_back(digester.Digest(p));
  digests[1] = std::nullopt;  // pending
  uint64_t matched = 0, unknown = 0;
  EXPECT_EQ(4u, FirstMismatch(digester, pages, digests, &matched, &unknown));
  EXPECT_EQ(3u, matched);
  EXPECT_EQ(1u, unknown);
  std::vector<BufferPiece> pieces;
  AppendPageBufferPieces(g, 6, &pieces);
  pool[pieces.back().offset + pieces.back().size - 1] ^= 0x80;  // page 6's last byte
  matched = unknown = 0;
  EXPECT_EQ(2u, FirstMismatch(digester, pages, digests, &matched, &unknown));
  EXPECT_EQ(1u, matched);
  EXPECT_EQ(1u, unknown);
}

TEST(Crc32cExtendTest, PiecesGiveTheWholesChecksum) {
  const std::string data = "123456789 and some more bytes, unaligned";
  for (size_t cut = 0; cut <= data.size(); ++cut) {
    const uint32_t first = Crc32c(data.data(), cut);
    EXPECT_EQ(Crc32c(data.data(), data.size()),
              Crc32cExtend(first, data.data() + cut, data.size() - cut));
    EXPECT_EQ(Crc32cSoftware(data.data(), data.size()),
              Crc32cSoftwareExtend(Crc32cSoftware(data.data(), cut), data.data() + cut,
                                   data.size() - cut));
  }
  EXPECT_EQ(0xE3069283u, Crc32cExtend(Crc32c("1234", 4), "56789", 5));
}

// The layout fingerprint a pool reports (Pool.layout_fingerprint) tells
// apart what changes a page's bytes or their meaning, not the pool's size.
TEST(LayoutFingerprintTest, CoversLayoutDtypeAndPageSizeNotCapacity) {
  const PoolGeometry g = Geometry(Attention::kMha, HostLayout::kPageFirst);
  const uint64_t base = GeometryFingerprint(g, 2);
  PoolGeometry other = g;
  other.layout = HostLayout::kLayerFirst;
  EXPECT_NE(base, GeometryFingerprint(other, 2));
  other = g;
  other.page_size = 8;
  EXPECT_NE(base, GeometryFingerprint(other, 2));
  EXPECT_NE(base, GeometryFingerprint(g, 1)) << "another dtype";
  other = g;
  other.token_slots = 4096;
  EXPECT_EQ(base, GeometryFingerprint(other, 2));
}

}  // namespace
}  // namespace hostkv
