// CRC32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor
// 0xFFFFFFFF: the iSCSI / ext4 / RocksDB checksum), for the frames of tier
// values (tier_value.h) and the digests of cached pages
// (server/cache/page_digest.h). Crc32c("123456789") == 0xE3069283.
#ifndef HOSTKV_SERVER_TIER_CRC32C_H_
#define HOSTKV_SERVER_TIER_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace hostkv {

// The CRC32C of data[0, size): the SSE4.2 instruction when this CPU has it
// (checked once, at run time), else the software tables.
uint32_t Crc32c(const void* data, size_t size);
// The CRC32C of A + data[0, size), given before == Crc32c(A): a checksum
// taken piece by piece. Crc32cExtend(0, d, n) == Crc32c(d, n).
uint32_t Crc32cExtend(uint32_t before, const void* data, size_t size);

// Both paths, for the tests: the software one (slicing-by-8 tables) always
// works; the hardware one REQUIRES Crc32cHardwareAvailable().
uint32_t Crc32cSoftware(const void* data, size_t size);
uint32_t Crc32cSoftwareExtend(uint32_t before, const void* data, size_t size);
uint32_t Crc32cHardware(const void* data, size_t size);
bool Crc32cHardwareAvailable();

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_CRC32C_H_
