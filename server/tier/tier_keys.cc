#include "server/tier/tier_keys.h"

#include <openssl/evp.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/tier/tier_value.h"

namespace hostkv {
namespace {

constexpr size_t kMaxTierNamespaceBytes = 120;
constexpr size_t kFingerprintBytes = 8;
constexpr size_t kRoom = kMaxTierNamespaceBytes - kFingerprintBytes;

// SHA-256 of `text`, 32 raw bytes.
std::string Sha256(absl::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &length, EVP_sha256(),
                 nullptr) != 1 ||
      length != 32) {
    // Only a broken libcrypto gets here; no tier key may alias another.
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(digest), length);
}

}  // namespace

uint64_t PoolFingerprint(const HostPool& pool) {
  return pool.info().layout_fingerprint();  // HostPool::InfoOf's
}

std::string ValueBinding(const TierKey& key) {
  std::string out;
  const uint64_t n = key.name_space.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  out += key.name_space;
  out += key.key;
  return out;
}

TierKey ToTierKey(uint64_t fingerprint, absl::string_view scope,
                  absl::string_view name_space, absl::string_view key) {
  TierKey out;
  out.name_space.resize(kFingerprintBytes);
  for (size_t i = 0; i < kFingerprintBytes; ++i) {
    out.name_space[i] = static_cast<char>(fingerprint >> (8 * i));
  }
  const std::string scoped = absl::StrCat(scope, ":", name_space);
  if (1 + scoped.size() <= kRoom) {
    absl::StrAppend(&out.name_space, "r", scoped);
  } else {
    absl::StrAppend(&out.name_space, "h", Sha256(scoped));
  }
  out.key = std::string(key);
  return out;
}

}  // namespace hostkv
