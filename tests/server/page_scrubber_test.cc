#include "server/pool/page_scrubber.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/page_format.h"
#include "server/pool/slot_allocator.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr OwnerTag kAlice = 1;
constexpr OwnerTag kBob = 2;
constexpr OwnerTag kCarol = 3;

struct Case {
  Attention attention;
  HostLayout layout;
  uint32_t page_size;
};

std::string Name(const Case& c) {
  return absl::StrCat(c.attention == Attention::kMha ? "mha_" : "mla_",
                      HostLayoutName(c.layout), "_ps", c.page_size);
}

PoolGeometry Geometry(const Case& c, uint64_t pages) {
  PoolGeometry g;
  g.attention = c.attention;
  g.layout = c.layout;
  g.num_layers = 3;
  g.num_heads = c.attention == Attention::kMha ? 2 : 1;
  g.head_bytes = c.attention == Attention::kMha ? 8 : 12;
  g.page_size = c.page_size;
  g.token_slots = pages * c.page_size;
  return g;
}

// A pool buffer with its allocator and scrubber, as HostPool wires them.
class ScrubbedPool {
 public:
  explicit ScrubbedPool(const PoolGeometry& g)
      : g_(g),
        bytes_(g.total_bytes(), 0),
        alloc_(
            g.num_pages(),
            [this](const PageRun& run) { ZeroPages(g_, bytes_.data(), run); }),
        scrubber_(&alloc_, /*batch_pages=*/2) {}

  // Every byte of the pages of `runs` = `value` (through the flat format,
  // which covers the whole page).
  void Fill(const std::vector<PageRun>& runs, uint8_t value) {
    const std::vector<uint8_t> flat(g_.page_bytes(), value);
    for (const PageRun& run : runs) {
      for (uint64_t p = run.first_page; p < run.first_page + run.num_pages;
           ++p) {
        CopyFlatToPage(g_, flat.data(), p, bytes_.data());
      }
    }
  }
  // How many bytes of the page are not `value`.
  uint64_t BytesNot(uint64_t page, uint8_t value) const {
    std::vector<uint8_t> flat(g_.page_bytes(), static_cast<uint8_t>(~value));
    CopyPageToFlat(g_, bytes_.data(), page, flat.data());
    return std::count_if(flat.begin(), flat.end(),
                         [value](uint8_t b) { return b != value; });
  }
  uint64_t NonZeroBytes() const {
    return std::count_if(bytes_.begin(), bytes_.end(),
                         [](uint8_t b) { return b != 0; });
  }
  SlotAllocator& alloc() { return alloc_; }

 private:
  const PoolGeometry g_;
  std::vector<uint8_t> bytes_;
  SlotAllocator alloc_;
  PageScrubber scrubber_;  // last: stops before the bytes go
};

class PageScrubberTest : public ::testing::TestWithParam<Case> {};

TEST_P(PageScrubberTest, FreedPagesComeBackZeroedAndOthersAreUntouched) {
  const PoolGeometry g = Geometry(GetParam(), 5);
  ScrubbedPool pool(g);
  auto alice = pool.alloc().Allocate(4, kAlice);
  auto carol = pool.alloc().Allocate(1, kCarol);
  ASSERT_OK(alice);
  ASSERT_OK(carol);
  pool.Fill(*alice, 0xA5);
  pool.Fill(*carol, 0x3C);
  ASSERT_EQ(5 * g.page_bytes(), pool.NonZeroBytes());  // the fill covers it all
  for (uint64_t p = 0; p < 4; ++p) ASSERT_EQ(0u, pool.BytesNot(p, 0xA5)) << p;

  ASSERT_OK(pool.alloc().Free({{0, 1}, {2, 2}}, kAlice));
  EXPECT_EQ(1u, pool.alloc().FreeAllOwnedBy(kAlice));  // page 1
  EXPECT_EQ(4u, pool.alloc().free_pages());   // scrubbing pages count as free
  auto bob = pool.alloc().Allocate(4, kBob);  // the whole rest: Alice's pages
  ASSERT_OK(bob);
  uint64_t got = 0;
  for (const PageRun& run : *bob) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      EXPECT_NE(carol->front().first_page, p);
      EXPECT_EQ(g.page_bytes(), pool.BytesNot(p, 0xA5)) << "page " << p;
      EXPECT_EQ(0u, pool.BytesNot(p, 0x00)) << "page " << p;
      ++got;
    }
  }
  EXPECT_EQ(4u, got);
  // Only Carol's page holds data: nothing outside the freed pages was zeroed
  // and nothing of them was missed.
  EXPECT_EQ(g.page_bytes(), pool.NonZeroBytes());
  EXPECT_EQ(0u, pool.BytesNot(carol->front().first_page, 0x3C));
}

TEST_P(PageScrubberTest, BackgroundThreadZeroesWithoutAnAllocate) {
  const PoolGeometry g = Geometry(GetParam(), 8);
  ScrubbedPool pool(g);
  auto runs = pool.alloc().Allocate(8, kAlice);
  ASSERT_OK(runs);
  pool.Fill(*runs, 0xFF);
  EXPECT_EQ(8u, pool.alloc().FreeAllOwnedBy(kAlice));
  for (int i = 0; i < 2000 && pool.alloc().scrubbing_pages() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(0u, pool.alloc().scrubbing_pages());
  EXPECT_EQ(0u, pool.NonZeroBytes());
  EXPECT_EQ(8u, pool.alloc().free_pages());
  EXPECT_EQ(1u, pool.alloc().free_extents());
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const uint32_t ps : {1u, 16u}) {
    for (const HostLayout layout :
         {HostLayout::kLayerFirst, HostLayout::kPageFirst,
          HostLayout::kPageFirstDirect, HostLayout::kPageHead}) {
      cases.push_back({Attention::kMha, layout, ps});
      if (layout != HostLayout::kPageHead) {
        cases.push_back({Attention::kMla, layout, ps});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PageScrubberTest,
                         ::testing::ValuesIn(AllCases()),
                         [](const auto& info) { return Name(info.param); });

TEST(PageScrubberStopTest, DestructorStopsTheThreadAndLeavesPagesScrubbing) {
  std::vector<PageRun> zeroed;
  absl::Mutex mu;
  SlotAllocator alloc(10, [&](const PageRun& run) {
    absl::MutexLock lock(&mu);
    zeroed.push_back(run);
  });
  { PageScrubber scrubber(&alloc, 4); }  // joins
  EXPECT_FALSE(alloc.ScrubPending(4));   // stopped for good
  ASSERT_OK(alloc.Allocate(10, kAlice));
  EXPECT_EQ(10u, alloc.FreeAllOwnedBy(kAlice));
  EXPECT_EQ(10u, alloc.scrubbing_pages());  // nobody zeroes them in background
  ASSERT_OK(alloc.Allocate(3, kBob));       // ... but Allocate does, inline
  absl::MutexLock lock(&mu);
  EXPECT_EQ((std::vector<PageRun>{{0, 3}}), zeroed);
}

}  // namespace
}  // namespace hostkv
