#include "server/tier/tier_keys.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "server/tier/tier_value.h"

namespace hostkv {
namespace {

constexpr size_t kMaxTierNamespaceBytes = 120;
constexpr size_t kFingerprintBytes = 8;

}  // namespace

uint64_t PoolFingerprint(const HostPool& pool) {
  const v1::Geometry& geometry = pool.info().spec().geometry();
  const uint32_t rope =
      geometry.has_mla() ? geometry.mla().qk_rope_head_dim() : 0;
  return GeometryFingerprint(pool.geometry(),
                             static_cast<uint32_t>(geometry.dtype()), rope);
}

TierKey ToTierKey(uint64_t fingerprint, absl::string_view name_space,
                  absl::string_view key) {
  TierKey out;
  out.name_space.resize(kFingerprintBytes);
  for (size_t i = 0; i < kFingerprintBytes; ++i) {
    out.name_space[i] = static_cast<char>(fingerprint >> (8 * i));
  }
  constexpr size_t kRoom = kMaxTierNamespaceBytes - kFingerprintBytes;
  if (name_space.size() <= kRoom) {
    absl::StrAppend(&out.name_space, name_space);
  } else {
    absl::StrAppend(
        &out.name_space, name_space.substr(0, kRoom - 32),
        absl::Hex(Fnv1a(name_space), absl::kZeroPad16),
        absl::Hex(Fnv1a(name_space, 0x84222325cbf29ce4ull), absl::kZeroPad16));
  }
  out.key = std::string(key);
  return out;
}

}  // namespace hostkv
