// PlanFillChunks and FillChunkRanges: how a new pool is made resident in
// chunks of whole pages. The chunks tile the pages, and the byte ranges of
// a chunk hold every byte of its pages (in every layout) and, together,
// the whole segment.
#include "server/pool/fill_plan.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/page_format.h"
#include "server/pool/pin_plan.h"

namespace hostkv {
namespace {

TEST(PlanFillChunksTest, TilesThePagesInChunksOfTheTargetBytes) {
  // 10 pages of 3 MiB, 8 MiB chunks: 2 pages each, the last one alone.
  const std::vector<PageRun> chunks = PlanFillChunks(9, 3 << 20, 8 << 20);
  ASSERT_EQ(chunks.size(), 5u);
  EXPECT_EQ(chunks[0], (PageRun{0, 2}));
  EXPECT_EQ(chunks[3], (PageRun{6, 2}));
  EXPECT_EQ(chunks[4], (PageRun{8, 1}));
  // A page larger than the target: one page per chunk.
  EXPECT_EQ(PlanFillChunks(3, 100 << 20, 64 << 20).size(), 3u);
  EXPECT_TRUE(PlanFillChunks(0, 4096, 1 << 20).empty());
  ASSERT_EQ(PlanFillChunks(5, 0, 1 << 20).size(), 1u);
  EXPECT_EQ(PlanFillChunks(5, 0, 1 << 20)[0], (PageRun{0, 5}));
}

struct Case {
  Attention attention;
  HostLayout layout;
  uint32_t page_size;
  uint32_t head_bytes;
};

PoolGeometry Geometry(const Case& c, uint64_t pages) {
  PoolGeometry g;
  g.attention = c.attention;
  g.layout = c.layout;
  g.num_layers = 3;
  g.num_heads = c.attention == Attention::kMha ? 2 : 1;
  g.head_bytes = c.head_bytes;
  g.page_size = c.page_size;
  g.token_slots = pages * c.page_size;
  return g;
}

class FillChunkRangesTest : public ::testing::TestWithParam<Case> {};

TEST_P(FillChunkRangesTest, ChunksCoverTheirPagesAndTogetherTheSegment) {
  const PoolGeometry g = Geometry(GetParam(), 37);
  const uint64_t total = g.total_bytes();
  for (uint64_t target : std::vector<uint64_t>{1, g.page_bytes() * 4, g.page_bytes() * 10, total}) {
    SCOPED_TRACE(absl::StrCat("target ", target));
    std::vector<bool> covered(total, false);
    for (const PageRun& chunk : PlanFillChunks(g.num_pages(), g.page_bytes(), target)) {
      const std::vector<SegmentRange> ranges = FillChunkRanges(g, chunk);
      ASSERT_FALSE(ranges.empty());
      for (size_t i = 0; i < ranges.size(); ++i) {
        EXPECT_EQ(ranges[i].offset % kOsPageBytes, 0u);
        EXPECT_TRUE(ranges[i].offset + ranges[i].bytes == total ||
                    ranges[i].bytes % kOsPageBytes == 0);
        EXPECT_LE(ranges[i].offset + ranges[i].bytes, total);
        // Sorted, merged: a gap between neighbours.
        if (i > 0) {
          EXPECT_GT(ranges[i].offset, ranges[i - 1].offset + ranges[i - 1].bytes);
        }
        for (uint64_t b = ranges[i].offset; b < ranges[i].offset + ranges[i].bytes; ++b) {
          covered[b] = true;
        }
      }
      // Every byte of every page of the chunk is in one of its ranges.
      std::vector<BufferPiece> pieces;
      for (uint64_t p = chunk.first_page; p < chunk.first_page + chunk.num_pages; ++p) {
        pieces.clear();
        AppendPageBufferPieces(g, p, &pieces);
        for (const BufferPiece& piece : pieces) {
          bool inside = false;
          for (const SegmentRange& r : ranges) {
            inside = inside || (piece.offset >= r.offset &&
                                piece.offset + piece.size <= r.offset + r.bytes);
          }
          EXPECT_TRUE(inside) << "page " << p << " piece at " << piece.offset;
        }
      }
    }
    uint64_t missing = 0;
    for (bool c : covered) missing += c ? 0 : 1;
    EXPECT_EQ(missing, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, FillChunkRangesTest,
    ::testing::Values(Case{Attention::kMha, HostLayout::kLayerFirst, 16, 256},
                      Case{Attention::kMha, HostLayout::kPageFirst, 16, 256},
                      Case{Attention::kMha, HostLayout::kPageFirstDirect, 4, 1000},
                      Case{Attention::kMha, HostLayout::kPageHead, 16, 256},
                      Case{Attention::kMla, HostLayout::kLayerFirst, 1, 1152},
                      Case{Attention::kMla, HostLayout::kPageFirst, 3, 700}));

}  // namespace
}  // namespace hostkv
