#include "server/tier/tier_value.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "server/tier/crc32c.h"

namespace hostkv {
namespace {

void AppendLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t ReadLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  }
  return v;
}

constexpr uint64_t kFnvPrime = 0x100000001b3ull;

absl::Status Mismatch(absl::string_view what, uint64_t got, uint64_t want) {
  return absl::DataLossError(absl::StrFormat(
      "tier value: %s does not match (value has 0x%x, expected 0x%x)", what,
      got, want));
}

}  // namespace

uint64_t Fnv1a(absl::string_view bytes, uint64_t seed) {
  uint64_t h = seed;
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= kFnvPrime;
  }
  return h;
}

uint64_t GeometryFingerprint(const PoolGeometry& g, uint32_t dtype,
                             uint32_t mla_rope_dim) {
  std::string e = "hostkv-flat-page-v1";  // the encoding's own version
  AppendLe(&e, static_cast<uint8_t>(g.attention), 1);
  AppendLe(&e, static_cast<uint8_t>(g.layout), 1);
  AppendLe(&e, g.num_layers, 4);
  AppendLe(&e, g.num_heads, 4);
  AppendLe(&e, g.head_bytes, 4);
  AppendLe(&e, g.page_size, 4);
  AppendLe(&e, dtype, 4);
  AppendLe(&e, g.attention == Attention::kMla ? mla_rope_dim : 0, 4);
  return Fnv1a(e);
}

std::string FrameValue(uint64_t fingerprint, absl::string_view page,
                       absl::string_view binding) {
  return FrameValueFilled(
      fingerprint, page.size(),
      [&](char* out) { std::memcpy(out, page.data(), page.size()); }, binding);
}

uint32_t ValueKeyCheck(absl::string_view binding, uint32_t crc) {
  std::string le;
  AppendLe(&le, crc, 4);
  return Crc32cExtend(Crc32c(binding.data(), binding.size()), le.data(), le.size());
}

std::string FrameValueFilled(uint64_t fingerprint, uint64_t page_bytes,
                             absl::FunctionRef<void(char* page)> fill,
                             absl::string_view binding) {
  std::string header;
  header.reserve(kTierValueHeaderBytes);
  std::string out(kTierValueHeaderBytes + page_bytes, '\0');
  char* page = out.data() + kTierValueHeaderBytes;
  fill(page);
  header.append(kTierValueMagic, sizeof(kTierValueMagic));
  AppendLe(&header, kTierValueVersion, 4);
  AppendLe(&header, fingerprint, 8);
  AppendLe(&header, page_bytes, 8);
  const uint32_t crc = Crc32c(page, page_bytes);
  AppendLe(&header, crc, 4);
  AppendLe(&header, ValueKeyCheck(binding, crc), 4);
  std::memcpy(out.data(), header.data(), kTierValueHeaderBytes);
  return out;
}

uint32_t FrameChecksum(absl::string_view value) {
  return static_cast<uint32_t>(ReadLe(value.data() + 24, 4));
}

bool IsForeignValue(absl::string_view value, uint64_t expected_fingerprint) {
  if (value.size() < kTierValueHeaderBytes) return false;
  const char* h = value.data();
  return std::memcmp(h, kTierValueMagic, sizeof(kTierValueMagic)) != 0 ||
         (ReadLe(h + 4, 4) != kTierValueVersion &&
          ReadLe(h + 4, 4) != kTierValueVersionUnbound) ||
         ReadLe(h + 8, 8) != expected_fingerprint;
}

absl::StatusOr<absl::string_view> UnframeValue(absl::string_view value,
                                               uint64_t expected_fingerprint,
                                               uint64_t expected_page_bytes,
                                               absl::string_view binding) {
  if (value.size() < kTierValueHeaderBytes) {
    return absl::DataLossError(absl::StrFormat(
        "tier value: truncated header (%d bytes, the header is %d)",
        value.size(), kTierValueHeaderBytes));
  }
  const char* h = value.data();
  if (std::memcmp(h, kTierValueMagic, sizeof(kTierValueMagic)) != 0) {
    return Mismatch("magic", ReadLe(h, 4), ReadLe(kTierValueMagic, 4));
  }
  const uint64_t version = ReadLe(h + 4, 4);
  if (version != kTierValueVersion && version != kTierValueVersionUnbound) {
    return Mismatch("version", version, kTierValueVersion);
  }
  if (uint64_t r = ReadLe(h + 28, 4); version == kTierValueVersionUnbound && r != 0) {
    return Mismatch("reserved", r, 0);
  }
  if (uint64_t f = ReadLe(h + 8, 8); f != expected_fingerprint) {
    return Mismatch("geometry", f, expected_fingerprint);
  }
  if (uint64_t n = ReadLe(h + 16, 8); n != expected_page_bytes) {
    return Mismatch("page bytes", n, expected_page_bytes);
  }
  const uint64_t have = value.size() - kTierValueHeaderBytes;
  if (have != expected_page_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "tier value: size does not match (%d page bytes after the header, "
        "its header says %d)",
        have, expected_page_bytes));
  }
  absl::string_view page = value.substr(kTierValueHeaderBytes);
  const uint32_t crc = Crc32c(page.data(), page.size());
  if (uint64_t c = ReadLe(h + 24, 4); c != crc) {
    return Mismatch("checksum", c, crc);
  }
  if (version == kTierValueVersion) {
    if (uint64_t k = ReadLe(h + 28, 4); k != ValueKeyCheck(binding, crc)) {
      return Mismatch("key", k, ValueKeyCheck(binding, crc));
    }
  }
  return page;
}

}  // namespace hostkv
