// What a pool's pages are stored under in a storage tier (server/README.md, "Storage
// tiers"), for its writer and its reader alike.
#ifndef HOSTKV_SERVER_TIER_TIER_KEYS_H_
#define HOSTKV_SERVER_TIER_TIER_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "server/pool/host_pool.h"
#include "server/tier/page_tier.h"

namespace hostkv {

// The geometry fingerprint (tier_value.h) of the pool's pages.
uint64_t PoolFingerprint(const HostPool& pool);

// The tier key of a cache key: the tier namespace is the pool's geometry
// fingerprint (8 bytes, little endian) and then the namespace's owner scope
// (NamespaceOwners::TierScope: "u1000", "unverified", "any"; never a ':')
// with the cache namespace, so that pools of other geometries never take
// each other's pages for their own, no user reads or writes another's
// values (on this node or any other sharing the store), and each (geometry,
// owner, namespace) is one directory of the file tier. The key is the cache
// key. Encoded so that no two (scope, namespace) pairs share a tier
// namespace and it stays within what every store takes (the file tier's
// names: 120 bytes): 'r', scope, ':', namespace while that fits in 112
// bytes, else 'h' and the SHA-256 of scope, ':', namespace (32 bytes).
// What a value stored under `key` is bound to (tier_value.h's key check):
// its namespace and key, length-prefixed.
std::string ValueBinding(const TierKey& key);

TierKey ToTierKey(uint64_t fingerprint, absl::string_view scope,
                  absl::string_view name_space, absl::string_view key);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_TIER_KEYS_H_
