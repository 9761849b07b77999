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
// The raw register over n bytes (no inversions): one instruction chain.
__attribute__((target("sse4.2"))) uint64_t HardwareRun(uint64_t crc, const uint8_t* p,
                                                       size_t n) {
  for (; n >= 8; n -= 8, p += 8) crc = _mm_crc32_u64(crc, LoadLe64(p));
  for (; n > 0; --n) crc = _mm_crc32_u8(static_cast<uint32_t>(crc), *p++);
  return crc;
}

// Long inputs run as three interleaved chains over consecutive stripes of
// kStripe bytes (the instruction's latency is three times its issue rate),
// joined with the linearity of the raw register: crc(s, A B) =
// shift(crc(s, A)) ^ crc(0, B), where shift multiplies by x^(8 kStripe)
// mod P: four table lookups (tables made once, from the instruction).
constexpr size_t kStripe = 4096;

struct StripeShift {
  std::array<std::array<uint32_t, 256>, 4> t;
  uint32_t operator()(uint64_t crc) const {
    const auto c = static_cast<uint32_t>(crc);
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

const StripeShift& Shift() {
  static const StripeShift* shift = [] {
    auto* s = new StripeShift;
    static const uint8_t zeros[kStripe] = {};
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        s->t[k][b] = static_cast<uint32_t>(HardwareRun(uint64_t{b} << (8 * k), zeros, kStripe));
      }
    }
    return s;
  }();
  return *shift;
}

__attribute__((target("sse4.2"))) uint32_t HardwareCrc(uint32_t before, const uint8_t* p,
                                                       size_t n) {
  uint64_t crc = before ^ 0xFFFFFFFFu;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = _mm_crc32_u8(static_cast<uint32_t>(crc), *p++);
    --n;
  }
  if (n >= 3 * kStripe) {
    const StripeShift& shift = Shift();
    for (; n >= 3 * kStripe; n -= 3 * kStripe, p += 3 * kStripe) {
      uint64_t a = crc, b = 0, c = 0;
      for (size_t i = 0; i < kStripe; i += 8) {
        a = _mm_crc32_u64(a, LoadLe64(p + i));
        b = _mm_crc32_u64(b, LoadLe64(p + kStripe + i));
        c = _mm_crc32_u64(c, LoadLe64(p + 2 * kStripe + i));
      }
      crc = shift(shift(a) ^ b) ^ c;
    }
  }
  crc = HardwareRun(crc, p, n);
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
