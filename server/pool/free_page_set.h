// The free pages of a pool as a bitmap with summary levels: what
// SlotAllocator hands out, lowest pages first.
#ifndef HOSTKV_SERVER_POOL_FREE_PAGE_SET_H_
#define HOSTKV_SERVER_POOL_FREE_PAGE_SET_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hostkv {

// One bit per page (set = free), and above it summary levels with one bit
// per word of the level below (set = that word has a free page), up to a
// single word. Insert and Take touch one word per level plus the words of
// the pages they cover: their cost does not grow with the pool (a balanced
// tree of extents costs log(extents) dependent cache misses per insert,
// which at 10^7 pages is most of a free). The bitmap is num_pages / 8 bytes
// (1.25 MB for 10^7 pages), the summaries 1/64 of that.
// Not thread-safe (SlotAllocator holds its lock).
class FreePageSet {
 public:
  explicit FreePageSet(uint64_t num_pages);

  // Marks pages [first, first + count) free.
  // REQUIRES: none of them is free; first + count <= num_pages.
  void Insert(uint64_t first, uint64_t count);

  // Takes the lowest free page and the free pages right after it, at most
  // max_count; returns the first page and sets *count.
  // REQUIRES: free_pages() > 0, max_count > 0.
  uint64_t TakeLowest(uint64_t max_count, uint64_t* count);

  // Marks every page not free.
  void Clear();

  uint64_t free_pages() const { return free_pages_; }
  // Maximal runs of consecutive free pages.
  uint64_t extents() const { return extents_; }

 private:
  bool IsFree(uint64_t page) const {
    return (levels_[0][page >> 6] >> (page & 63)) & 1;
  }
  // Sets bit `index` of level `level` and, if its word was empty, the
  // summary bit above it.
  void MarkNonEmpty(size_t level, uint64_t index);
  // Word `word` of level `level` became empty: clears its summary bit, and
  // upwards while words become empty.
  void MarkEmpty(size_t level, uint64_t word);

  const uint64_t num_pages_;
  // levels_[0]: one bit per page; levels_[k]: one bit per word of level
  // k - 1; the last level is one word.
  std::vector<std::vector<uint64_t>> levels_;
  uint64_t free_pages_ = 0;
  uint64_t extents_ = 0;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_FREE_PAGE_SET_H_
