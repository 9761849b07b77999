#include "server/pool/free_page_set.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace hostkv {
namespace {

// The extents of a model vector<bool>.
uint64_t Extents(const std::vector<bool>& free) {
  uint64_t n = 0;
  for (size_t p = 0; p < free.size(); ++p) {
    if (free[p] && (p == 0 || !free[p - 1])) ++n;
  }
  return n;
}

TEST(FreePageSetTest, TakesLowestRunsFirst) {
  FreePageSet set(200);
  set.Insert(0, 200);
  EXPECT_EQ(1u, set.extents());
  uint64_t count = 0;
  EXPECT_EQ(0u, set.TakeLowest(70, &count));
  EXPECT_EQ(70u, count);
  EXPECT_EQ(70u, set.TakeLowest(200, &count));
  EXPECT_EQ(130u, count);
  EXPECT_EQ(0u, set.free_pages());
  EXPECT_EQ(0u, set.extents());
  set.Insert(150, 10);
  set.Insert(10, 5);
  EXPECT_EQ(2u, set.extents());
  EXPECT_EQ(10u, set.TakeLowest(100, &count));
  EXPECT_EQ(5u, count);  // the run ends at page 15
  set.Insert(160, 40);   // joins [150, 160)
  EXPECT_EQ(1u, set.extents());
  EXPECT_EQ(150u, set.TakeLowest(100, &count));
  EXPECT_EQ(50u, count);
}

TEST(FreePageSetTest, MatchesAModel) {
  for (uint64_t pages : {1u, 63u, 64u, 65u, 4095u, 4096u, 4097u, 300000u}) {
    std::mt19937_64 rng(pages);
    FreePageSet set(pages);
    std::vector<bool> model(pages, false);
    uint64_t free_pages = 0;
    for (int step = 0; step < 3000; ++step) {
      if (rng() % 2 == 0 && free_pages > 0) {
        const uint64_t want = 1 + rng() % 200;
        uint64_t count = 0;
        const uint64_t first = set.TakeLowest(want, &count);
        uint64_t expect_first = 0;
        while (!model[expect_first]) ++expect_first;
        uint64_t expect_count = 0;
        while (expect_first + expect_count < pages && expect_count < want &&
               model[expect_first + expect_count]) {
          model[expect_first + expect_count] = false;
          ++expect_count;
        }
        ASSERT_EQ(expect_first, first) << pages;
        ASSERT_EQ(expect_count, count) << pages;
        free_pages -= count;
      } else {
        // A random run of pages that are not free.
        const uint64_t at = rng() % pages;
        if (model[at]) continue;
        uint64_t end = at;
        const uint64_t len = 1 + rng() % 300;
        while (end < pages && end - at < len && !model[end])
          model[end++] = true;
        set.Insert(at, end - at);
        free_pages += end - at;
      }
      ASSERT_EQ(free_pages, set.free_pages());
      if (pages < 10000 || step % 200 == 0) {
        ASSERT_EQ(Extents(model), set.extents()) << pages << " step " << step;
      }
    }
    set.Clear();
    EXPECT_EQ(0u, set.free_pages());
    EXPECT_EQ(0u, set.extents());
  }
}

}  // namespace
}  // namespace hostkv
