#include "server/cache/eviction_log.h"

#include <algorithm>
#include <cstring>

namespace hostkv {

void EvictionLog::Record(uint16_t ns, absl::string_view key) {
  if (capacity_ == 0) return;
  if (entries_ == nullptr) entries_ = std::make_unique<Entry[]>(capacity_);
  ++last_;
  Entry& e = entries_[(last_ - 1) % capacity_];
  e.ns = ns;
  e.key_size = static_cast<uint8_t>(std::min<size_t>(key.size(), sizeof e.key));
  std::memcpy(e.key, key.data(), e.key_size);
}

EvictionList EvictionLog::Read(uint16_t ns, uint64_t after,
                               uint32_t max_keys) const {
  EvictionList out;
  // A number past the end comes from before a daemon restart: all of this
  // log is news to that reader.
  if (after > last_) after = 0;
  if (max_keys == 0 || after == last_) {
    out.next = last_;
    return out;
  }
  // The oldest number still held.
  const uint64_t oldest = last_ > capacity_ ? last_ - capacity_ + 1 : 1;
  uint64_t n = after + 1;
  if (n < oldest) {
    out.missed = oldest - n;
    n = oldest;
  }
  for (; n <= last_ && out.keys.size() < max_keys; ++n) {
    const Entry& e = At(n);
    if (e.ns == ns) out.keys.emplace_back(e.key, e.key_size);
  }
  out.next = n - 1;
  return out;
}

}  // namespace hostkv
