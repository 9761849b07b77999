#include "server/tier/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace hostkv {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli

// tables[k][b]: the CRC of byte b followed by k zero bytes.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int i = 0; i < 8; ++i)
      crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
    t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) {
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
  }
  return t;
}

constexpr Tables kTables = MakeTables();

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t HardwareCrc(uint32_t before, const uint8_t* p,
                                                       size_t n) {
  uint64_t crc = before ^ 0xFFFFFFFFu;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = _mm_crc32_u8(static_cast<uint32_t>(crc), *p++);
    --n;
  }
  for (; n >= 8; n -= 8, p += 8) crc = _mm_crc32_u64(crc, LoadLe64(p));
  for (; n > 0; --n) crc = _mm_crc32_u8(static_cast<uint32_t>(crc), *p++);
  return static_cast<uint32_t>(crc) ^ 0xFFFFFFFFu;
}
#endif

bool DetectHardware() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

}  // namespace

uint32_t Crc32cSoftware(const void* data, size_t size) {
  return Crc32cSoftwareExtend(0, data, size);
}

uint32_t Crc32cSoftwareExtend(uint32_t before, const void* data, size_t size) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t crc = before ^ 0xFFFFFFFFu;
  for (; size >= 8; size -= 8, p += 8) {
    const uint64_t v = LoadLe64(p) ^ crc;
    crc = kTables[7][v & 0xFF] ^ kTables[6][(v >> 8) & 0xFF] ^
          kTables[5][(v >> 16) & 0xFF] ^ kTables[4][(v >> 24) & 0xFF] ^
          kTables[3][(v >> 32) & 0xFF] ^ kTables[2][(v >> 40) & 0xFF] ^
          kTables[1][(v >> 48) & 0xFF] ^ kTables[0][v >> 56];
  }
  for (; size > 0; --size) crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xFF];
  return crc ^ 0xFFFFFFFFu;
}

bool Crc32cHardwareAvailable() {
  static const bool available = DetectHardware();
  return available;
}

uint32_t Crc32cHardware(const void* data, size_t size) {
#if defined(__x86_64__)
  return HardwareCrc(0, static_cast<const uint8_t*>(data), size);
#else
  return Crc32cSoftware(data, size);
#endif
}

uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

uint32_t Crc32cExtend(uint32_t before, const void* data, size_t size) {
#if defined(__x86_64__)
  if (Crc32cHardwareAvailable()) {
    return HardwareCrc(before, static_cast<const uint8_t*>(data), size);
  }
#endif
  return Crc32cSoftwareExtend(before, data, size);
}

}  // namespace hostkv
