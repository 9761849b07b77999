#include "server/pool/pin_plan.h"

#include <numeric>

namespace hostkv {

std::vector<PinChunk> PlanPinChunks(uint64_t bytes, uint64_t align,
                                    uint64_t target) {
  std::vector<PinChunk> chunks;
  if (bytes == 0) return chunks;
  if (align == 0) align = 1;
  const uint64_t g = std::gcd(align, kOsPageBytes);
  // lcm, or "too large" when it would overflow or exceed the whole range.
  const uint64_t factor = kOsPageBytes / g;
  uint64_t unit = align <= bytes / factor ? align * factor : bytes;
  if (unit >= bytes) return {{0, bytes}};
  const uint64_t per_chunk = target / unit > 0 ? target / unit : 1;
  const uint64_t chunk = per_chunk <= bytes / unit ? per_chunk * unit : bytes;
  for (uint64_t offset = 0; offset < bytes; offset += chunk) {
    chunks.push_back({offset, bytes - offset < chunk ? bytes - offset : chunk});
  }
  return chunks;
}

}  // namespace hostkv
