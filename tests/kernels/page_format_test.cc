// The flat page format (get_data_page(flat=True) / set_from_flat_data_page)
// and the page buffer meta (get_page_buffer_meta), checked against the
// reference model's slices of SGLang's pool tensors.
#include "kernels/page_format.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/pool_geometry.h"
#include "tests/kernels/reference_layout.h"

namespace hostkv {
namespace {

using reference::PatternBuffer;
using reference::PoolSpec;
using reference::ReferencePool;

using PieceList = std::vector<std::pair<uint64_t, uint64_t>>;  // offset, size

constexpr uint64_t kPoolSeed = 1;
constexpr uint64_t kFlatSeed = 2;
constexpr uint8_t kGuard = 0xA5;
constexpr uint64_t kPages = 4;  // pages in each test pool

class PageFormatTest : public ::testing::TestWithParam<PoolSpec> {
 protected:
  PageFormatTest()
      : spec_(GetParam()),
        ref_(spec_),
        g_(reference::ToGeometry(spec_)),
        pool_(PatternBuffer(g_.total_bytes(), kPoolSeed)) {}

  uint64_t FirstToken(uint64_t page) const { return page * spec_.page_size; }

  // CopyPageToFlat into a buffer with guard bytes after the page, checking
  // that the guards survive.
  std::vector<uint8_t> ProductionFlatPage(const std::vector<uint8_t>& pool,
                                          uint64_t page) const {
    std::vector<uint8_t> flat(g_.page_bytes() + 16, kGuard);
    CopyPageToFlat(g_, pool.data(), page, flat.data());
    for (uint64_t i = g_.page_bytes(); i < flat.size(); ++i) {
      EXPECT_EQ(kGuard, flat[i]) << "wrote past the page at " << i;
    }
    flat.resize(g_.page_bytes());
    return flat;
  }

  // The pool after set_from_flat_data_page(page, flat), per the reference.
  std::vector<uint8_t> ReferenceSetPage(
      std::vector<uint8_t> pool, uint64_t page,
      const std::vector<uint8_t>& flat) const {
    const std::vector<uint64_t> offsets =
        ref_.FlatPageByteOffsets(FirstToken(page));
    for (size_t e = 0; e < offsets.size(); ++e) {
      for (uint64_t b = 0; b < spec_.itemsize; ++b) {
        pool[offsets[e] + b] = flat[e * spec_.itemsize + b];
      }
    }
    return pool;
  }

  PieceList ProductionPieces(const std::vector<uint64_t>& pages) const {
    std::vector<BufferPiece> pieces;
    for (uint64_t page : pages) AppendPageBufferPieces(g_, page, &pieces);
    PieceList out;
    for (const BufferPiece& p : pieces) out.emplace_back(p.offset, p.size);
    return out;
  }

  PieceList ReferencePieces(const std::vector<uint64_t>& pages) const {
    std::vector<uint64_t> indices;
    for (uint64_t page : pages) {
      for (uint64_t t = 0; t < spec_.page_size; ++t) {
        indices.push_back(FirstToken(page) + t);
      }
    }
    PieceList out;
    for (const reference::Piece& p : ref_.PageBufferMeta(indices)) {
      out.emplace_back(p.offset, p.size);
    }
    return out;
  }

  const PoolSpec spec_;
  const ReferencePool ref_;
  const PoolGeometry g_;
  std::vector<uint8_t> pool_;
};

TEST_P(PageFormatTest, CopyPageToFlatIsTheReferenceFlatPage) {
  for (uint64_t page : {2u, 0u, 3u, 1u}) {
    SCOPED_TRACE("page " + std::to_string(page));
    const std::vector<uint8_t> expected =
        ref_.FlatPage(pool_.data(), FirstToken(page));
    ASSERT_EQ(g_.page_bytes(), expected.size());
    ASSERT_EQ(expected, ProductionFlatPage(pool_, page));
  }
}

TEST_P(PageFormatTest, CopyPageToFlatLeavesThePoolAlone) {
  const std::vector<uint8_t> before = pool_;
  ProductionFlatPage(pool_, kPages - 1);
  EXPECT_EQ(before, pool_);
}

TEST_P(PageFormatTest, CopyFlatToPageWritesExactlyThatPage) {
  const std::vector<uint8_t> flat = PatternBuffer(g_.page_bytes(), kFlatSeed);
  for (uint64_t page : {1u, 3u, 0u}) {
    SCOPED_TRACE("page " + std::to_string(page));
    std::vector<uint8_t> pool = pool_;
    const std::vector<uint8_t> expected = ReferenceSetPage(pool, page, flat);
    CopyFlatToPage(g_, flat.data(), page, pool.data());
    ASSERT_EQ(expected, pool);
  }
}

TEST_P(PageFormatTest, FlatRoundTripRestoresThePage) {
  const std::vector<uint8_t> flat = PatternBuffer(g_.page_bytes(), kFlatSeed);
  CopyFlatToPage(g_, flat.data(), 2, pool_.data());
  EXPECT_EQ(flat, ProductionFlatPage(pool_, 2));
  EXPECT_EQ(flat, ref_.FlatPage(pool_.data(), FirstToken(2)));
}

TEST_P(PageFormatTest, PageMovesBetweenSlotsThroughTheFlatFormat) {
  // A storage tier saves page 3 and restores it into page 1 of another pool:
  // every element lands on the same (kv, layer, token - 3ps + ps, head, dim).
  std::vector<uint8_t> other = PatternBuffer(g_.total_bytes(), 99);
  const std::vector<uint8_t> flat = ProductionFlatPage(pool_, 3);
  CopyFlatToPage(g_, flat.data(), 1, other.data());
  uint64_t mismatches = 0;
  ref_.ForEachCoord([&](const reference::Coord& c) {
    if (c.token / spec_.page_size != 3) return;
    reference::Coord moved = c;
    moved.token = c.token - 2 * spec_.page_size;
    for (uint64_t b = 0; b < spec_.itemsize; ++b) {
      mismatches +=
          pool_[ref_.ByteOffset(c) + b] != other[ref_.ByteOffset(moved) + b];
    }
  });
  EXPECT_EQ(0u, mismatches);
}

TEST_P(PageFormatTest, WritingEveryPageCoversThePoolOnce) {
  // Pages are disjoint and together are the whole pool.
  std::vector<uint8_t> pool(g_.total_bytes(), 0);
  std::vector<uint8_t> ones(g_.page_bytes(), 1);
  for (uint64_t page = 0; page < kPages; ++page) {
    std::vector<uint8_t> flat = ProductionFlatPage(pool, page);
    ASSERT_EQ(std::vector<uint8_t>(g_.page_bytes(), 0), flat)
        << "page " << page << " overlaps an earlier page";
    CopyFlatToPage(g_, ones.data(), page, pool.data());
  }
  EXPECT_EQ(std::vector<uint8_t>(g_.total_bytes(), 1), pool);
}

TEST_P(PageFormatTest, BufferPiecesAreSglangsPageBufferMeta) {
  for (const std::vector<uint64_t>& pages :
       std::vector<std::vector<uint64_t>>{{0}, {3}, {2, 0, 3}, {1, 2}}) {
    EXPECT_EQ(ReferencePieces(pages), ProductionPieces(pages));
  }
}

TEST_P(PageFormatTest, AppendKeepsEarlierPieces) {
  std::vector<BufferPiece> pieces = {{12345, 6}};
  AppendPageBufferPieces(g_, 1, &pieces);
  ASSERT_EQ(ReferencePieces({1}).size() + 1, pieces.size());
  EXPECT_EQ(12345u, pieces[0].offset);
  EXPECT_EQ(6u, pieces[0].size);
}

TEST_P(PageFormatTest, BufferPiecesHoldTheFlatPageBytes) {
  for (uint64_t page = 0; page < kPages; ++page) {
    SCOPED_TRACE("page " + std::to_string(page));
    const std::vector<uint8_t> flat =
        ref_.FlatPage(pool_.data(), FirstToken(page));
    // Where each pool byte of the page sits in the flat page.
    std::map<uint64_t, uint64_t> flat_position;
    const std::vector<uint64_t> offsets =
        ref_.FlatPageByteOffsets(FirstToken(page));
    for (size_t e = 0; e < offsets.size(); ++e) {
      for (uint64_t b = 0; b < spec_.itemsize; ++b) {
        flat_position[offsets[e] + b] = e * spec_.itemsize + b;
      }
    }
    // Every piece is a run of the flat page, and the pieces cover the page
    // exactly once.
    std::vector<uint8_t> covered(flat.size(), 0);
    std::vector<uint8_t> concatenated;
    for (const auto& [offset, size] : ProductionPieces({page})) {
      ASSERT_TRUE(flat_position.count(offset))
          << "piece at " << offset << " is outside the page";
      const uint64_t start = flat_position[offset];
      ASSERT_LE(start + size, flat.size());
      for (uint64_t i = 0; i < size; ++i) {
        ASSERT_EQ(flat[start + i], pool_[offset + i]);
        ++covered[start + i];
      }
      concatenated.insert(concatenated.end(), pool_.begin() + offset,
                          pool_.begin() + offset + size);
    }
    EXPECT_EQ(std::vector<uint8_t>(flat.size(), 1), covered);
    // Outside MHA layer_first (pieces ordered layer, K/V; the flat page
    // K/V, layer) the pieces in order are the flat page itself.
    if (!(spec_.attention == Attention::kMha &&
          spec_.layout == HostLayout::kLayerFirst)) {
      EXPECT_EQ(flat, concatenated);
    }
  }
}

TEST_P(PageFormatTest, RunPiecesCoverExactlyTheRunsPages) {
  // Every run of the pool: its pieces mark each byte of its pages once and
  // no other byte.
  for (uint64_t first = 0; first < kPages; ++first) {
    for (uint64_t n = 0; first + n <= kPages; ++n) {
      std::vector<uint8_t> want(g_.total_bytes(), 0);
      for (uint64_t page = first; page < first + n; ++page) {
        for (const auto& [offset, size] : ProductionPieces({page})) {
          for (uint64_t i = 0; i < size; ++i) ++want[offset + i];
        }
      }
      std::vector<BufferPiece> run;
      AppendPageRunPieces(g_, first, n, &run);
      std::vector<uint8_t> got(g_.total_bytes(), 0);
      for (const BufferPiece& piece : run) {
        ASSERT_LE(piece.offset + piece.size, got.size());
        for (uint64_t i = 0; i < piece.size; ++i) ++got[piece.offset + i];
      }
      EXPECT_EQ(want, got) << "pages [" << first << ", " << first + n << ")";
      // Outside layer_first a run is one piece per plane.
      if (n > 0 && spec_.layout != HostLayout::kLayerFirst) {
        EXPECT_EQ(g_.kv_planes(), run.size());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, PageFormatTest,
                         ::testing::ValuesIn(reference::AllSmallPools(kPages)),
                         [](const ::testing::TestParamInfo<PoolSpec>& info) {
                           return reference::SpecName(info.param);
                         });

}  // namespace
}  // namespace hostkv
