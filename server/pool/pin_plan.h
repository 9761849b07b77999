// How a pool's memory is cut into chunks for registration with CUDA
// (cudaHostRegister): large single registrations fail intermittently, and a
// pool page must never straddle two registrations.
#ifndef HOSTKV_SERVER_POOL_PIN_PLAN_H_
#define HOSTKV_SERVER_POOL_PIN_PLAN_H_

#include <cstdint>
#include <vector>

namespace hostkv {

inline constexpr uint64_t kOsPageBytes = 4096;

struct PinChunk {
  uint64_t offset;
  uint64_t bytes;
};

// Splits [0, bytes) into consecutive chunks of about `target` bytes, each a
// multiple of lcm(align, kOsPageBytes) except the last (so every chunk
// boundary is both a page boundary of the pool and of the OS). When that
// unit exceeds `bytes`, one chunk covers everything. align 0 means 1.
std::vector<PinChunk> PlanPinChunks(uint64_t bytes, uint64_t align,
                                    uint64_t target);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_POOL_PIN_PLAN_H_
