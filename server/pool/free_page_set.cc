#include "server/pool/free_page_set.h"

#include <algorithm>

namespace hostkv {
namespace {

// Bits [from, to) of a word (0 <= from < to <= 64).
uint64_t Mask(uint64_t from, uint64_t to) {
  const uint64_t high = to == 64 ? ~uint64_t{0} : (uint64_t{1} << to) - 1;
  return high & ~((uint64_t{1} << from) - 1);
}

}  // namespace

FreePageSet::FreePageSet(uint64_t num_pages) : num_pages_(num_pages) {
  uint64_t bits = std::max<uint64_t>(num_pages, 1);
  do {
    const uint64_t words = (bits + 63) / 64;
    levels_.emplace_back(words, 0);
    bits = words;
  } while (bits > 1);
}

void FreePageSet::Clear() {
  for (std::vector<uint64_t>& level : levels_) {
    std::fill(level.begin(), level.end(), 0);
  }
  free_pages_ = 0;
  extents_ = 0;
}

void FreePageSet::MarkNonEmpty(size_t level, uint64_t index) {
  for (; level < levels_.size(); ++level) {
    uint64_t& word = levels_[level][index >> 6];
    const bool was_empty = word == 0;
    word |= uint64_t{1} << (index & 63);
    if (!was_empty) return;
    index >>= 6;
  }
}

void FreePageSet::MarkEmpty(size_t level, uint64_t word) {
  for (++level; level < levels_.size(); ++level) {
    uint64_t& w = levels_[level][word >> 6];
    w &= ~(uint64_t{1} << (word & 63));
    if (w != 0) return;
    word >>= 6;
  }
}

void FreePageSet::Insert(uint64_t first, uint64_t count) {
  if (count == 0) return;
  const uint64_t end = first + count;
  // One extent more, less one for each free neighbour it joins.
  extents_ += 1;
  if (first > 0 && IsFree(first - 1)) --extents_;
  if (end < num_pages_ && IsFree(end)) --extents_;
  std::vector<uint64_t>& bits = levels_[0];
  for (uint64_t p = first; p < end;) {
    const uint64_t w = p >> 6;
    const uint64_t to = std::min<uint64_t>(end - (w << 6), 64);
    const bool was_empty = bits[w] == 0;
    bits[w] |= Mask(p & 63, to);
    if (was_empty) MarkNonEmpty(1, w);
    p = (w << 6) + to;
  }
  free_pages_ += count;
}

uint64_t FreePageSet::TakeLowest(uint64_t max_count, uint64_t* count) {
  // Down the summaries to the lowest free page.
  uint64_t index = 0;
  for (size_t level = levels_.size(); level-- > 0;) {
    index = (index << 6) + __builtin_ctzll(levels_[level][index]);
  }
  const uint64_t first = index;
  // Clear the run of free pages from `first`, word by word.
  std::vector<uint64_t>& bits = levels_[0];
  uint64_t p = first;
  uint64_t left = max_count;
  while (left > 0 && p < num_pages_) {
    const uint64_t w = p >> 6;
    const uint64_t from = p & 63;
    // Free bits from `from` upwards, up to the first page that is not free.
    const uint64_t ones = bits[w] >> from;
    const uint64_t avail =
        ~ones == 0 ? 64 - from
                   : std::min<uint64_t>(__builtin_ctzll(~ones), 64 - from);
    const uint64_t take = std::min(avail, left);
    if (take == 0) break;  // the run ended at the word's first page
    bits[w] &= ~Mask(from, from + take);
    if (bits[w] == 0) MarkEmpty(0, w);
    p += take;
    left -= take;
    if (take < 64 - from) break;  // the run or the request ended in the word
  }
  // The run is gone unless a free page follows what was taken.
  if (p >= num_pages_ || !IsFree(p)) --extents_;
  *count = p - first;
  free_pages_ -= *count;
  return first;
}

}  // namespace hostkv
