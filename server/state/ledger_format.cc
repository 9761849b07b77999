#include "server/state/ledger_format.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hostkv {

uint64_t LedgerMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t LedgerChecksum(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = LedgerMix(seed ^ bytes);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    h = LedgerMix(h ^ word);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, bytes - i);
  h = LedgerMix(h ^ tail ^ (uint64_t{bytes - i} << 56));
  return h == 0 ? 1 : h;  // 0 marks an empty record
}

uint64_t LedgerSalt() {
  uint64_t salt = 0;
  while (getrandom(&salt, sizeof(salt), 0) < 0 && errno == EINTR) {
  }
  return salt;
}

void FillLedgerStart(LedgerHeaderStart& start, const char* magic,
                     uint64_t layout) {
  std::memcpy(start.magic, magic, sizeof(start.magic));
  start.format = kLedgerFormat;
  start.header_bytes = kLedgerHeaderBytes;
  start.layout = layout;
  std::memset(start.writer, 0, sizeof(start.writer));
  std::strncpy(start.writer, HOSTKV_VERSION, sizeof(start.writer) - 1);
}

absl::Status CheckLedgerStart(const LedgerHeaderStart& start, uint64_t size,
                              const char* magic, uint64_t layout,
                              const std::string& what) {
  if (size < kLedgerHeaderBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " is ", size, " bytes, shorter than its header: truncated"));
  }
  if (std::memcmp(start.magic, magic, sizeof(start.magic)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is not a hostkvd ledger (bad magic)"));
  }
  char writer[sizeof(start.writer) + 1] = {};
  std::memcpy(writer, start.writer, sizeof(start.writer));
  if (start.format != kLedgerFormat || start.header_bytes != kLedgerHeaderBytes ||
      start.layout != layout) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " was written by hostkvd ", writer, " in ledger format ",
        start.format, " (layout ", absl::Hex(start.layout), "); this hostkvd ",
        HOSTKV_VERSION, " reads format ", kLedgerFormat, " (layout ",
        absl::Hex(layout), ")"));
  }
  return absl::OkStatus();
}

}  // namespace hostkv
