// PlanPinChunks: how a pool is cut into CUDA registrations. Every chunk
// boundary must be a boundary of both a pool page and an OS page, and the
// chunks must tile the pool exactly.
#include "server/pool/pin_plan.h"

#include <numeric>

#include "gtest/gtest.h"

namespace hostkv {
namespace {

void ExpectTiles(const std::vector<PinChunk>& chunks, uint64_t bytes,
                 uint64_t align) {
  ASSERT_FALSE(chunks.empty());
  uint64_t next = 0;
  const uint64_t unit = std::lcm(align, kOsPageBytes);
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].offset, next) << "chunk " << i;
    EXPECT_GT(chunks[i].bytes, 0u);
    next += chunks[i].bytes;
    if (i + 1 < chunks.size()) {
      EXPECT_EQ(next % unit, 0u) << "boundary after chunk " << i;
    }
  }
  EXPECT_EQ(next, bytes);
}

TEST(PinPlanTest, TilesThePoolOnPageAndOsPageBoundaries) {
  // page_bytes of real pools: MHA 8B-head ps16, MLA 576*2*61 ps1, odd sizes.
  for (uint64_t align : {4096ull, 65536ull, 70272ull, 3ull, 1000000ull}) {
    for (uint64_t pages : {1ull, 2ull, 7ull, 1000ull, 123457ull}) {
      const uint64_t bytes = align * pages;
      for (uint64_t target : {1ull << 20, 1ull << 30, 1ull}) {
        SCOPED_TRACE(testing::Message() << "align " << align << " pages "
                                        << pages << " target " << target);
        ExpectTiles(PlanPinChunks(bytes, align, target), bytes, align);
      }
    }
  }
}

TEST(PinPlanTest, ChunksAreAboutTheTargetSize) {
  const uint64_t align = 65536;  // a multiple of the OS page
  const uint64_t bytes = align * 100000;  // 6.1 GiB
  const std::vector<PinChunk> chunks = PlanPinChunks(bytes, align, 1ull << 30);
  ASSERT_EQ(chunks.size(), 7u);  // 6 full GiB chunks and the rest
  EXPECT_EQ(chunks[0].bytes, 1ull << 30);
  EXPECT_EQ(chunks.back().bytes, bytes - 6 * (1ull << 30));
}

TEST(PinPlanTest, OddPageSizesUseTheirLcmWithTheOsPage) {
  // 70272 = 2^7 * 549: lcm with 4096 is 70272 * 32.
  const uint64_t unit = 70272ull * 32;
  const std::vector<PinChunk> chunks =
      PlanPinChunks(unit * 10 + 70272, 70272, unit * 3 + 5);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].bytes, unit * 3);
  EXPECT_EQ(chunks[3].bytes, unit + 70272);
}

TEST(PinPlanTest, OneChunkWhenTheUnitExceedsThePool) {
  const std::vector<PinChunk> chunks = PlanPinChunks(3 * 1000003, 1000003, 1);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].offset, 0u);
  EXPECT_EQ(chunks[0].bytes, 3 * 1000003u);
}

TEST(PinPlanTest, EmptyPoolHasNoChunks) {
  EXPECT_TRUE(PlanPinChunks(0, 4096, 1 << 20).empty());
  ExpectTiles(PlanPinChunks(8192, 0, 4096), 8192, 1);
}

}  // namespace
}  // namespace hostkv
