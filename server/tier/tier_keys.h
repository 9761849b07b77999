// What a pool's pages are stored under in a storage tier (README, "Storage
// tiers"), for its writer and its reader alike.
#ifndef HOSTKV_SERVER_TIER_TIER_KEYS_H_
#define HOSTKV_SERVER_TIER_TIER_KEYS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "server/pool/host_pool.h"
#include "server/tier/page_tier.h"

namespace hostkv {

// The geometry fingerprint (tier_value.h) of the pool's pages.
uint64_t PoolFingerprint(const HostPool& pool);

// The tier key of a cache key: the namespace is the pool's geometry
// fingerprint (8 bytes, little endian) and the cache namespace, so that
// pools of other geometries never take each other's pages for their own
// and each (geometry, namespace) is one directory of the file tier; the key
// is the cache key. The namespace stays within what every store takes (the
// file tier's names: 120 bytes): a cache namespace over 112 bytes keeps its
// first 80 and gets two FNV-1a hashes of the whole in hex (32 characters).
TierKey ToTierKey(uint64_t fingerprint, absl::string_view name_space,
                  absl::string_view key);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_TIER_KEYS_H_
